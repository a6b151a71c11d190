"""Merchant events for notifications of orders durapay no longer knows (``notification.unknown_order``).

A notification whose order id no flow holds (its record and order lookups expired, or it was never
durapay's) cannot be checked: no token is kept for it. The receiver refuses it like a bad token, but
the money it may announce must still be found, so the merchant is told: one event with the order id and
what the body *claims* (operation id, result, amount, currency), marked unverified, on the merchant
event streams (``workflows.engine.events``), read by the pull feed and fanned out to webhooks like any other.

Such an event has no flow, so no flow script writes it; :meth:`UnknownOrders.announce` adds it to the
stream of the order id's partition (``Keys.partition(order_id)``, the slot of the order's own lookups),
in one small script with its once-per-hour mark. Anyone can post a notification, so it is bounded:

* once per order id per ``ONCE_SECONDS`` (``SET NX EX`` of a mark in the same slot as the stream,
  written with the event in one script: never an event without its mark, nor a mark without its event);
* at most ``per_minute`` events a minute over every order (``DURAPAY_RECEIVER__UNKNOWN_ORDER_EVENTS_PER_MINUTE``),
  counted on one key per minute; an event over the cap is not written (and its order gets no mark, so
  the gateway's retry of the notification may write it in a later minute).

Every claimed text is cut to ``CLAIM_CHARS`` characters; no card field of the body is read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from durapay.workflows.engine import Keys

TYPE = "notification.unknown_order"

#: One event per order id per this many seconds.
ONCE_SECONDS = 3600

#: Longest text of a claim kept in an event or a log line (a real order id has 27 characters at most).
CLAIM_CHARS = 64

#: The fields of the notified operation an event repeats (as claimed; never a card field).
CLAIMED = (
    ("operationId", "operationId"),
    ("operationResult", "operationResult"),
    ("amount", "operationAmount"),
    ("currency", "operationCurrency"),
)

Announced = Literal["written", "repeat", "capped"]

# KEYS: 1 the order's once-per-hour mark, 2 the partition's event stream (same slot).
# ARGV: 1 seconds the mark holds, 2 the event's JSON.
_ANNOUNCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
  return 1
end
return 0
"""


def bounded(value: Any, limit: int = CLAIM_CHARS) -> str | None:
    """``value`` as text of at most ``limit`` characters (an enum as its value), or None."""
    if value is None:
        return None
    text = str(getattr(value, "value", value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def claims(operation: Any) -> dict[str, str | None]:
    """What a notified operation (``gateway.Operation``, or None) claims, bounded: operationId,
    operationResult, amount (minor units, as text), currency."""
    return {name: bounded(getattr(operation, field, None)) for name, field in CLAIMED}


def mark_key(keys: Keys, order_id: str) -> str:
    """The order's once-per-hour mark, in the order id's partition (the slot of its stream)."""
    name = order_id if len(order_id) <= CLAIM_CHARS else "sha256:" + hashlib.sha256(order_id.encode()).hexdigest()
    return f"{keys.tag(keys.partition(order_id))}:unknown_order:{name}"


class UnknownOrders:
    """Writes ``notification.unknown_order`` events, bounded. One per process; thread safe."""

    def __init__(self, client: Any, keys: Keys, now: Callable[[], float], *, per_minute: int) -> None:
        self.redis = client
        self.keys = keys
        self.now = now
        self.per_minute = per_minute
        self._announce = client.register_script(_ANNOUNCE)

    def minute(self, now: float) -> str:
        """The key counting this minute's events (every order's)."""
        return self.keys.counter(f"unknown_order_events:{int(now // 60)}")

    def announce(self, order_id: str, claimed: Mapping[str, str | None], *, verified: bool = False) -> Announced:
        """Write the event of a notification for ``order_id``, unless one was written for it within the
        hour (``repeat``) or the minute's cap is reached (``capped``). ``verified``: its token matched and
        the gateway has the operation (an order lookup that outlived its flow): the operation id is then
        the gateway's. Raises RedisError."""
        mark = mark_key(self.keys, order_id)
        if self.redis.exists(mark):
            return "repeat"  # before the cap: a repeat takes no share of it
        now = self.now()
        bucket = self.minute(now)
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(bucket)
        pipe.expire(bucket, 120)
        taken, _ = pipe.execute()
        if int(taken) > self.per_minute:
            return "capped"
        event = {
            "type": TYPE,
            "time": now,
            "orderId": bounded(order_id),
            # Unverified, nothing vouches for the claimed id: it is only in data.claimed.
            "operationId": claimed.get("operationId") if verified else None,
            "data": {"verified": verified, "claimed": dict(claimed)},
        }
        stream = self.keys.events(self.keys.partition(order_id))
        written = self._announce(keys=[mark, stream], args=[ONCE_SECONDS, json.dumps(event, separators=(",", ":"))])
        return "written" if written else "repeat"
