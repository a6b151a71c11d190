"""Compacting finished flows: what a flow keeps for its retention, in as little memory as it can.

A flow in flight is a Redis hash of small and large fields (its input, every step's answer, its outcome)
and a list (its log). Redis keeps a hash with any value longer than 64 bytes in its general encoding, at
some 50 bytes of bookkeeping per field, and a finished flow is kept for weeks
(``DURAPAY_ENGINE__RETENTION_DAYS``) but read rarely. So once it has finished, the dispatcher packs it:
the cold fields and the log become one zlib-compressed JSON value ``z``, and only what the Lua scripts
read of a finished flow stays a plain field (``PLAIN``: its state and version, kind, step, order id,
input hash for start keys, and ``ops``, the operation ids its outcome names, for the money rule).

Reading is unchanged for everyone: ``FlowRecord.parse`` unpacks ``z``, ``FlowStore.history`` reads the
packed log. A packed flow that changes again (a late payment moves it to ``needs_attention`` in
``signal.lua``, which only adds fields; an operator's retry) is unpacked first by ``FlowStore`` before
any compare-and-set that could delete a field.

Transitions that finish a flow list it in the partition's ``finished`` set (``transition.lua``); a
pass takes those finished at least ``delay`` seconds ago, in batches, one round trip per step of the
pass, and off every worker's path.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from importlib import resources
from typing import Any

from workflows.keys import Keys

#: Fields a packed record keeps plain: what the scripts read of a finished flow.
PLAIN = ("state", "version", "kind", "step", "order_id", "input_hash", "ops")


def _script(name: str) -> str:
    return resources.files("workflows").joinpath("lua", name).read_text()


def pack(fields: Mapping[str, str], log: list[str]) -> tuple[dict[str, str], bytes]:
    """(the plain fields, the packed value) of a finished flow's fields and log entries."""
    plain = {name: fields[name] for name in PLAIN if name in fields}
    outcome = json.loads(fields.get("outcome") or "{}")
    plain["ops"] = json.dumps(outcome.get("operationIds") or [], separators=(",", ":"))
    cold = {name: value for name, value in fields.items() if name not in plain}
    blob = json.dumps({"fields": cold, "log": log}, separators=(",", ":"))
    return plain, zlib.compress(blob.encode(), 6)


def unpack(blob: bytes) -> tuple[dict[str, str], list[str]]:
    """(the cold fields, the log entries) of a packed value."""
    data = json.loads(zlib.decompress(blob))
    return dict(data.get("fields") or {}), list(data.get("log") or [])


class Compactor:
    """One per dispatcher: packs finished flows in batches."""

    def __init__(self, client: Any, keys: Keys, *, batch: int = 500, delay: float = 1.0) -> None:
        self.redis = client
        self.keys = keys
        self.batch = batch
        self.delay = delay
        self.backlog = False
        self._compact = client.register_script(_script("compact.lua"))

    def run(self, *, now: float) -> int:
        """One pass over every partition; returns how many flows were packed. Sets ``backlog`` when a
        partition had a full batch waiting (run again soon)."""
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(self.keys.partitions):
            pipe.zrangebyscore(self.keys.finished(partition), "-inf", now - self.delay, start=0, num=self.batch)
        taken = [(partition, [m.decode() for m in members]) for partition, members in enumerate(pipe.execute())]
        self.backlog = any(len(members) >= self.batch for _, members in taken)
        flows = [(partition, flow_id) for partition, members in taken for flow_id in members]
        if not flows:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for _, flow_id in flows:
            pipe.hgetall(self.keys.flow(flow_id))
            pipe.lrange(self.keys.log(flow_id), 0, -1)
        read = pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        packed = []
        for index, (partition, flow_id) in enumerate(flows):
            raw, log = read[2 * index], read[2 * index + 1]
            keys = [self.keys.flow(flow_id), self.keys.log(flow_id), self.keys.finished(partition)]
            packed.append(bool(raw) and b"z" not in raw)
            if not packed[-1]:  # expired meanwhile, or already packed
                pipe.zrem(keys[2], flow_id)
                continue
            fields = {name.decode(): value.decode() for name, value in raw.items()}
            plain, blob = pack(fields, [entry.decode() for entry in log])
            self._compact(keys=keys, args=[flow_id, fields.get("version", ""), json.dumps(plain), blob], client=pipe)
        results = pipe.execute()
        return sum(1 for was_packed, result in zip(packed, results, strict=True) if was_packed and result == 1)
