"""A change one flow made at the gateway to an order another flow holds, owed to that flow until told.

A renewal or modification of a pay-by-link (``FlowDefinition.tells_holder``) changes a link whose order
another flow holds: a flow going must read it again, a flow ended must be kept while the link can be paid
(``Engine.tell_holder``), or a payment on it shows in no flow (money invariants 1, 2). Telling it is an
act of its own, after the change's completion, and may be lost between the two (a worker lost, a tell the
store refused). So the completion that ends the changing flow ``succeeded`` also writes what it owes,
:data:`FIELD` (the signal and the step whose output says the change), in the same compare-and-set; the
worker tells at once and drops it, and the packing pass (``workflows.engine.compact``), which reads every
finished flow about a second after it finished, tells whatever is still owed before it packs the flow.
The change itself is never sent again for its tell: a modification resent would undo a later one, a
renewal resent after the customer paid on it is refused. Telling twice is harmless (a second signal is
one more read; a keep is never shortened).

Bounded: a pass tells at most ``compact.TELLS_PER_PASS`` flows (a tell may wait for durability inside the
dispatcher's tick); a tell the store refused is tried again ``compact.TELL_RETRY_SECONDS`` later, the flow
listed and unpacked meanwhile and moved behind its partition's other finished flows (so a partition full
of them still packs the rest); any other failure (a holder refusing the signal) would fail at every pass,
so it is logged and dropped, for the holder's own deadline read and the reconciliation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from durapay.workflows.engine.durability import NotDurable

log = logging.getLogger("durapay.holders")

#: The record's field of a tell owed: ``{"signal": ..., "step": ...}``.
FIELD = "tell"

Tell = Callable[[str, Mapping[str, Any]], None]


def owed(signal: str, step: str) -> str:
    """The value of :data:`FIELD` for a tell of ``signal`` with ``step``'s output."""
    return json.dumps({"signal": signal, "step": step}, separators=(",", ":"))


def tell_owed(tell: Tell, flow_id: str, fields: Mapping[str, str]) -> bool:
    """Tell what the record ``fields`` owe, if anything. False when the store refused it (to be told
    again); True when told, owed nothing, or dropped as a failure no retry mends."""
    raw = fields.get(FIELD)
    if not raw:
        return True
    output: dict[str, Any] = {}
    try:
        spec = json.loads(raw)
        output = json.loads(fields.get(f"out:{spec['step']}") or "{}")
        tell(str(spec["signal"]), output)
    except (redis.RedisError, RedisClusterException, NotDurable) as exc:
        log.warning("flow %s: telling the flow holding order %s failed (%s); told again", flow_id, output.get("orderId"), exc)
        return False
    except Exception:
        log.exception("flow %s: telling the flow holding order %s failed; not told again", flow_id, output.get("orderId"))
    return True
