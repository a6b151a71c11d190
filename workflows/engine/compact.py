"""Compacting finished flows: what a flow keeps for its retention, in as little memory as it can.

A flow in flight is a Redis hash of small and large fields (its input, every step's answer, its outcome)
and a list (its log). Redis keeps a hash with any value longer than 64 bytes in its general encoding, at
some 50 bytes of bookkeeping per field, and a finished flow is kept for weeks
(``DURAPAY_ENGINE__RETENTION_DAYS``) but read rarely. So once it has finished, the dispatcher packs it:
the cold fields and the log become one zlib-compressed JSON value ``z``, and only what a script reads of
a finished flow *without changing it* stays a plain field (``PLAIN``: its state and version, its kind,
and the input hash of a flow started with a key, which ``create.lua`` compares).

Reading is unchanged for everyone: ``FlowRecord.parse`` unpacks ``z``, ``FlowStore.history`` reads the
packed log. A script that would *change* a packed record never works on its plain part: ``signal.lua``
answers ``packed`` and ``FlowStore.signal`` expands the record (``expand.lua``) and asks again;
``FlowStore.transition`` expands before its compare-and-set. So a late payment on a packed flow is
judged, numbered and announced from the record as written (its signals, its order id, its step), and
the plain fields need not follow what the scripts read (``tests/workflows/engine/test_compact.py`` runs every
script on a packed record).

A finished flow's end (when Redis drops its record, its log and every lookup that names it from outside:
each order the flow made, ``<orderId>``, ``<orderId>-2``..., their tokens, and the operations it recorded)
is given by the packing pass, one rule for all of them: the retention from the pass (about a second after
the flow finished), or longer while its customer could still pay (``keep_until``: a link's end, written by
``workflows.engine.inflight`` and ``Engine.tell_holder``). Transitions never give a record an end
(``transition.lua``); they list a flow that finishes in its partition's ``finished`` set, which the pass
reads, in batches, one round trip per step of the pass, off every worker's path. The pass packs a flow,
then gives its lookups their end, then unlists it (``unlist.lua``), so that a pass cut in between (a
dispatcher killed) leaves the flow listed and the next pass, reading it packed, gives its lookups their end.
So a record is never gone before its lookups have an end, and no lookup is left without one: a pass
that comes late (no scheduler for a while) gives record and
lookups the retention from then. The retention is counted by Redis's clock from the pass, never by a
process's (the demo moves its clock months ahead: a flow it finished must not vanish at the next pass).
An end is never shortened (``OrderIndex.expire``).

A flow that leaves a packed end (a late payment, an operator's retry) is unpacked first, which lists it
again (``expand.lua``): its mover keeps its lookups again (``OrderIndex.keep``) after its change, and
whether or not it lived to, the pass keeps the lookups of every listed flow it finds going. That is the
one home of "a live flow's lookups never expire": the lookups are in other slots than the record (on a
cluster no script writes both), so the rule is made true by whoever comes next rather than atomically.

Packing moves the version, as every change does: a change read before (an operator's retry) is refused
as stale and read again, never written beside the packed value.
"""

from __future__ import annotations

import functools
import json
import logging
import zlib
from collections.abc import Mapping
from typing import Any

from durapay.workflows.engine import holders
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.orders import Lookups, OrderIndex
from durapay.workflows.engine.scripts import ScriptPipeline, package_file, register, source
from durapay.workflows.engine.states import TERMINAL, lua_prelude

logger = logging.getLogger("durapay.compact")

FINISHED = frozenset(state.value for state in TERMINAL)
#: The most tells owed to holders one pass makes (each may wait for durability, ``FlowStore.sync``, in the
#: dispatcher's tick); the rest wait for the passes after (``workflows.engine.holders``).
TELLS_PER_PASS = 4
#: How long a flow whose tell the store refused waits to be told again, behind its partition's other flows.
TELL_RETRY_SECONDS = 30.0

#: Fields a packed record keeps plain: what the scripts read of a finished flow without changing it
#: (``claim.lua``, ``renew.lua``, ``compact.lua``, ``expand.lua``: its state and version; ``create.lua``:
#: ``input_hash``, only when a start key can name the flow again), its kind for the indexes, and its
#: gateway terminal, which the receiver (a late notification's read-back) and a reconciliation read of a
#: finished flow alone (``workflows.engine.terminals``; only a flow off ``default`` has the field).
PLAIN = ("state", "version", "kind", "terminal")


def _script(name: str) -> str:
    return source(f"engine/lua/{name}")


#: Redis keeps a hash compactly (a listpack, a few bytes per field) only while every value is at most 64
#: bytes long (``hash-max-listpack-value``): the packed value is stored in chunks of that size.
CHUNK = 64


#: The preset dictionary packed values are compressed with (``compact_v<n>.zdict``, made by
#: ``bench/compact_dictionary.py``): common keys and structures of flows, so that a small record
#: compresses to about half what zlib alone makes of it. The first byte of a packed value names the
#: version it was made with (0: none); a released version's file never changes.
DICTIONARY_VERSION = 1


@functools.cache
def dictionary(version: int) -> bytes:
    if version == 0:
        return b""
    return package_file(f"engine/compact_v{version}.zdict").read_bytes()


def pack_json(fields: Mapping[str, str], log: list[str]) -> bytes:
    """The JSON that a finished flow's cold fields and log are packed as (before compression)."""
    plain = plain_fields(fields)
    cold = {name: value for name, value in fields.items() if name not in plain}
    return json.dumps({"fields": cold, "log": log}, separators=(",", ":")).encode()


def plain_fields(fields: Mapping[str, str]) -> dict[str, str]:
    plain = {name: fields[name] for name in PLAIN if name in fields}
    if fields.get("start_key") and "input_hash" in fields:
        plain["input_hash"] = fields["input_hash"]
    return plain


def pack(fields: Mapping[str, str], log: list[str], *, version: int = DICTIONARY_VERSION) -> tuple[dict[str, str], bytes]:
    """(the plain fields, the packed value) of a finished flow's fields and log entries."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, dictionary(version))
    packed = compressor.compress(pack_json(fields, log)) + compressor.flush()
    return plain_fields(fields), bytes([version]) + packed


def unpack(blob: bytes) -> tuple[dict[str, str], list[str]]:
    """(the cold fields, the log entries) of a packed value."""
    decompressor = zlib.decompressobj(15, dictionary(blob[0]))
    data = json.loads(decompressor.decompress(blob[1:]) + decompressor.flush())
    return dict(data.get("fields") or {}), list(data.get("log") or [])


def chunks(blob: bytes) -> dict[str, bytes]:
    """The packed value as hash fields ``z``, ``z1``, ``z2``... of at most CHUNK bytes."""
    parts = [blob[start : start + CHUNK] for start in range(0, len(blob), CHUNK)] or [b""]
    return {("z" if index == 0 else f"z{index}"): part for index, part in enumerate(parts)}


def joined(raw: Mapping[bytes, bytes]) -> bytes | None:
    """The packed value of a record read as raw hash fields (None: not packed)."""
    if b"z" not in raw:
        return None
    parts = [raw[b"z"]]
    index = 1
    while (part := raw.get(f"z{index}".encode())) is not None:
        parts.append(part)
        index += 1
    return b"".join(parts)


def is_chunk(name: str) -> bool:
    return name == "z" or (name[:1] == "z" and name[1:].isdigit())


def kept_seconds(fields: Mapping[str, str], retention: float, now: float) -> float:
    """How long a finished flow (its record's ``fields``) is kept from ``now`` (the pass): the retention,
    or until ``keep_until`` when that is later; at least a second."""
    return max(1.0, retention, float(fields.get("keep_until") or 0.0) - now)


class Compactor:
    """One per dispatcher: packs finished flows in batches, and gives them and their lookups their end."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        orders: OrderIndex,
        *,
        tell: holders.Tell,
        batch: int = 500,
        delay: float = 1.0,
    ) -> None:
        self.redis = client
        #: Tells a flow's holder what it still owes it (``workflows.engine.holders``) before it is packed.
        self.tell = tell
        self.keys = keys
        self.orders = orders
        self.retention = orders.retention_seconds
        self.batch = batch
        self.delay = delay
        self.backlog = False
        self._compact = client.register_script(lua_prelude() + _script("compact.lua"))
        self._unlist = register(client, "engine/lua/unlist.lua", _script("unlist.lua"))

    def run(self, *, now: float) -> int:
        """One pass over every partition; returns how many flows were packed. Sets ``backlog`` when a
        partition had a full batch waiting (run again soon).

        A flow is packed (``compact.lua``), then its lookups get their end, then it is unlisted
        (``unlist.lua``): a pass cut anywhere leaves it listed, and the next one, reading it packed, gives
        its lookups the record's end and unlists it. So no lookup is left without an end."""
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
            pipe.pttl(self.keys.flow(flow_id))
        read = pipe.execute()
        pipe = ScriptPipeline(self.redis)
        packing: list[tuple[int, Lookups | None, int]] = []  # per script call: (flow, lookups if it packs, version then)
        ended: list[tuple[int, Lookups, int, int]] = []  # (flow, lookups, version, ms to live) of flows with their end
        going: list[Lookups] = []  # listed flows going again: their lookups are kept before they are unlisted
        tells, refused_tells = 0, []  # tells owed to holders made in this pass; the flows whose tell was refused
        for index, (partition, flow_id) in enumerate(flows):
            raw, log, pttl = read[3 * index], read[3 * index + 1], read[3 * index + 2]
            keys = [self.keys.flow(flow_id), self.keys.log(flow_id), self.keys.finished(partition), self.keys.packing(flow_id)]
            blob = joined(raw) if raw else None
            if blob is not None:
                # Packed by a pass cut before it unlisted the flow (or by another pass since): its lookups
                # get the record's end now, then it is unlisted.
                plain = {name.decode(): value.decode() for name, value in raw.items() if not is_chunk(name.decode())}
                ttl = pttl if pttl > 0 else int(self.retention * 1000)
                ended.append((index, Lookups.of({**unpack(blob)[0], **plain}), int(plain.get("version") or 0), ttl))
                continue
            fields = {name.decode(): value.decode() for name, value in raw.items()} if raw else {}
            if fields.get("state") not in FINISHED:  # gone or going: the script unlists it (as read) and packs nothing
                if fields:
                    going.append(Lookups.of(fields))
                packing.append((index, None, 0))
                pipe.call(self._compact, keys, [flow_id, fields.get("version", ""), "{}", "0"])
                continue
            if holders.FIELD in fields:
                if tells >= TELLS_PER_PASS:
                    continue  # listed and unpacked: told at a pass after this one
                tells += 1
                if not holders.tell_owed(self.tell, flow_id, fields):
                    refused_tells.append((partition, flow_id))
                    continue
                fields = {name: value for name, value in fields.items() if name != holders.FIELD}
            plain, packed_blob = pack(fields, [entry.decode() for entry in log])
            ttl = int(kept_seconds(fields, self.retention, now) * 1000)
            args = [flow_id, fields.get("version", ""), json.dumps(plain), str(ttl), *chunks(packed_blob).values()]
            packing.append((index, Lookups.of(fields), int(fields.get("version") or 0) + 1))
            pipe.call(self._compact, keys, args)
        if going:
            self.orders.keep(going)
        if refused_tells:  # behind the partition's other finished flows, until they are told again
            later = self.redis.pipeline(transaction=False)
            for partition, flow_id in refused_tells:
                later.zadd(self.keys.finished(partition), {flow_id: now + TELL_RETRY_SECONDS}, xx=True)
            later.execute(raise_on_error=False)
        # One flow's refusal (TRYAGAIN while its slot moves) leaves it in the finished set for the next
        # pass; it does not stop the others.
        results = pipe.execute(raise_on_error=False)
        if refused := [result for result in results if isinstance(result, Exception)]:
            logger.info("compaction: %d flows not packed this pass (%s)", len(refused), refused[0])
        # Only the flows packed now (still finished at the version read) get an end, as long as the record.
        packed = 0
        for (index, found, version), result in zip(packing, results, strict=True):
            if found is not None and isinstance(result, int) and result > 0:
                ended.append((index, found, version, result))
                packed += 1
        for _, found, _, ttl in ended:
            self.orders.expire(found, -(-ttl // 1000))
        if ended:
            unlisting = ScriptPipeline(self.redis)
            for index, _, version, _ in ended:
                partition, flow_id = flows[index]
                unlisting.call(self._unlist, [self.keys.flow(flow_id), self.keys.finished(partition)], [flow_id, str(version)])
            # One refused stays listed: the next pass ends its lookups again.
            answers = unlisting.execute(raise_on_error=False)
            self._keep_returned([found for _, found, _, _ in ended], answers)
        return packed

    def _keep_returned(self, expired: list[Lookups], answers: list[Any]) -> None:
        """A flow a late payment brought back between its packing and the end given to its lookups keeps
        them: read after, any flow no longer finished has its lookups kept again at once (the pass after
        would too: it was listed again when it was unpacked). The state is unlist.lua's answer, read after
        the lookups' end; a flow whose unlisting was refused (its slot moving) is read here instead."""
        states: list[Any] = [None if isinstance(answer, Exception) else answer[1] for answer in answers]
        unread = [at for at, answer in enumerate(answers) if isinstance(answer, Exception)]
        if unread:
            pipe = self.redis.pipeline(transaction=False)
            for at in unread:
                pipe.hget(self.keys.flow(expired[at].flow_id), "state")
            for at, state in zip(unread, pipe.execute(raise_on_error=False), strict=True):
                states[at] = None if isinstance(state, Exception) else state
        back = [found for found, state in zip(expired, states, strict=True) if state and state.decode() not in FINISHED]
        if back:
            self.orders.keep(back)
