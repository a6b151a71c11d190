"""Schedules in Redis: one hash and one history list per schedule, a due set and indexes per partition.

The layout follows the flows' (``workflows/engine/keys.py``): every key carries its partition's hash tag, so a
script touches one Redis Cluster slot, and the scheduler visits every partition::

    durapay:{s2}:schedule:<id>        hash: id state version created updated spec next_at seq open
                                      counts last reason start_key input_hash
    durapay:{s2}:schedule_log:<id>    list of JSON events (the schedule's history), append only
    durapay:{s2}:schedule_due         sorted set: id -> when the scheduler must look at it next
    durapay:{s2}:schedule_state:<s>   sorted set: id -> created, per state (listing)
    durapay:{s2}:schedules            sorted set: id -> created (listing)
    durapay:{s2}:schedule_ended       sorted set: id -> when it ended (final, nothing in flight)
    durapay:{s2}:schedule_key:<id>    string: when a schedule created with a key ended (its tombstone)

Every change is one Lua script: ``create.lua`` (create unless the id exists: a create key reused with
another input is refused), ``update.lua`` (compare-and-set on ``version``: the fields that changed, due
score, state index and history in one step), ``mark.lua`` (compare-and-set of the open attempts alone:
the flows just started are marked created); ``update.lua`` and ``mark.lua`` run the functions of ``change.lua``.
On a single server the scheduler's fire is one script per schedule, ``fire.lua``: the change, its flows'
creates (``engine/lua/create_flow.lua``, the create's one home) and the mark, every schedule of a batch in one
round trip (:meth:`ScheduleStore.fire_many`); on a cluster the flows' keys sit in other slots, and the three
are sent apart, in that order. Taking due schedules reuses the engine's ``take_due.lua``: each taken
entry is pushed back by a grace period, so no other scheduler takes it meanwhile, and if this one dies
before writing, the schedule simply comes due again.

What a schedule keeps is bounded (docs/operations.md, "What durapay keeps"). Its history is capped at
``DURAPAY_SCHEDULES__HISTORY_ENTRIES``: ``update.lua`` sums the oldest entries up in one (counts per event).
A schedule that has ended (completed or cancelled, nothing in flight) is kept for
``DURAPAY_SCHEDULES__RETENTION``: ``update.lua`` gives its record and history that expiry and lists it
in ``schedule_ended``, and the scheduler's :meth:`ScheduleStore.trim_ended` then drops the index entries
of those whose record is gone (only the gone: a moved clock never hides one that still exists). Its
merchant events go with their stream's retention, like every event.

A create key names one schedule: its id is derived from the key, and its occurrences' flow ids and
gateway order ids from its id. So a schedule created with a key leaves, when it ends, a tombstone of
the key (``schedule_key:<id>``) that outlives its record by the flows' retention (``key_kept``): while
it lives a create with the key is refused (``create.lua``), since a schedule with the same id would
count its occurrences from 0 again, on the removed one's flow and order ids. Once it is gone, every
flow the old schedule started is gone too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from durapay.config.connect import is_cluster
from durapay.workflows.engine import (
    CreateCall,
    Keys,
    ScriptPipeline,
    assemble,
    compact_sorted,
    register,
    schedule_events_key,
    source,
)
from durapay.workflows.schedules.model import FINAL, RECORD_FIELDS, ScheduleRecord, ScheduleState, open_json

#: JSON of hashes, history entries, merchant events and script arguments: compact, keys sorted.
_json = compact_sorted


def input_hash(data: Any) -> str:
    return hashlib.sha256(_json(data).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ScheduleKeys:
    keys: Keys

    def partition(self, schedule_id: str) -> int:
        return self.keys.partition(schedule_id)

    def tag(self, partition: int) -> str:
        return f"{self.keys.prefix}:{{s{partition}}}"

    def record(self, schedule_id: str, partition: int | None = None) -> str:
        """The schedule's hash (``partition``: its partition, when the caller has it already)."""
        return f"{self.tag(self.partition(schedule_id) if partition is None else partition)}:schedule:{schedule_id}"

    def log(self, schedule_id: str, partition: int | None = None) -> str:
        return f"{self.tag(self.partition(schedule_id) if partition is None else partition)}:schedule_log:{schedule_id}"

    def due(self, partition: int) -> str:
        return f"{self.tag(partition)}:schedule_due"

    def by_state(self, partition: int, state: str) -> str:
        return f"{self.tag(partition)}:schedule_state:{state}"

    def all(self, partition: int) -> str:
        return f"{self.tag(partition)}:schedules"

    def events(self, partition: int) -> str:
        return schedule_events_key(self.keys, partition)

    def ended(self, partition: int) -> str:
        return f"{self.tag(partition)}:schedule_ended"

    def tombstone(self, schedule_id: str, partition: int | None = None) -> str:
        """When the schedule a create key named ended: that key is refused while this lives."""
        return f"{self.tag(self.partition(schedule_id) if partition is None else partition)}:schedule_key:{schedule_id}"


#: History events of a schedule that are also merchant events (``workflows.engine.events``), and their type.
MERCHANT_EVENTS = {
    "charged": "schedule.charged",
    "declined": "schedule.declined",
    "retry scheduled": "schedule.dunning",
    "needs attention": "schedule.needs_attention",
    "completed": "schedule.completed",
}


def merchant_events(schedule_id: str, events: Sequence[dict[str, Any]]) -> list[str]:
    """The merchant events (JSON) of a change whose history events are ``events``."""
    found = []
    for event in events:
        kind = MERCHANT_EVENTS.get(str(event.get("event")))
        if kind is None:
            continue
        data = {key: value for key, value in event.items() if key not in {"t", "event", "orderId", "operationId"}}
        ids = {"orderId": event.get("orderId"), "operationId": event.get("operationId")}
        found.append(_json({"type": kind, "time": event.get("t"), "schedule": schedule_id, **ids, "data": data}))
    return found


#: The states of a live schedule (all but the final): one whose terminal may not be removed.
LIVE = tuple(state for state in ScheduleState if state not in FINAL)


def live_schedules(client: Any, keys: Keys, *, page: int = 1000) -> Iterator[ScheduleRecord]:
    """Every live schedule (all but the final states), each once, read from the one index of every
    schedule per partition with ``ZSCAN``: a schedule that changes state during the read (paused,
    resumed) is seen all the same, which reading the state indexes one after another did not. The one
    home of "every live schedule" (``durapay deploy check``, the start-up check of a removed terminal).
    Bounded: each partition's index is read to its end once, in pages of ``page``."""
    layout = ScheduleKeys(keys)
    for partition in range(keys.partitions):
        seen: set[str] = set()  # ZSCAN may return a member twice
        cursor = None
        while cursor != 0:
            cursor, members = client.zscan(layout.all(partition), cursor or 0, count=page)
            ids = [schedule_id for member, _score in members if (schedule_id := _text(member)) not in seen]
            seen.update(ids)
            if not ids:
                continue
            pipe = client.pipeline(transaction=False)
            for schedule_id in ids:
                pipe.hmget(layout.record(schedule_id, partition), RECORD_FIELDS)
            for values in pipe.execute():
                record = ScheduleRecord.read(values)
                if record is not None and record.state in LIVE:
                    yield record


def live_on(client: Any, keys: Keys, names: Iterable[str], *, page: int = 1000) -> dict[str, list[str]]:
    """Per terminal of ``names``, the ids of the live schedules whose charges run on it (none: not in the
    answer): what the start-up check of a removed terminal pays, only while a terminal once used is not
    declared (``workflows.engine.terminals``)."""
    found: dict[str, list[str]] = {name: [] for name in names}
    if not found:
        return {}
    for record in live_schedules(client, keys, page=page):
        terminal = record.spec.terminal
        if terminal in found:
            found[terminal].append(record.id)
    return {name: sorted(ids) for name, ids in found.items() if ids}


def _text(item: Any) -> str:
    return item.decode() if isinstance(item, bytes) else str(item)


class ScheduleStore:
    """``retention``: seconds an ended schedule is kept; ``history_entries``: most history entries kept;
    ``flows_retention``: seconds a finished flow is kept (a create key stays refused that much longer
    than its schedule's record)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        events: bool = True,
        retention: float = 90 * 86400,
        history_entries: int = 1000,
        flows_retention: float = 30 * 86400,
    ) -> None:
        self.redis: Any = client
        self.events = events
        self.retention = retention
        #: Seconds the tombstone of an ended schedule's create key lives.
        self.key_kept = retention + flows_retention
        self.history_entries = history_entries
        self.keys = ScheduleKeys(keys)
        self.partitions = keys.partitions
        # Each registered as workflows/engine/scripts.py classifies it (none is resent after a lost answer).
        self._create = register(client, "schedules/lua/create.lua", source("schedules/lua/create.lua"))
        self._update = register(client, "schedules/lua/update.lua", assemble("schedules/lua/update.lua"))
        self._mark = register(client, "schedules/lua/mark.lua", assemble("schedules/lua/mark.lua"))
        self._fire = register(client, "schedules/lua/fire.lua", assemble("schedules/lua/fire.lua"))
        self._take_due = client.register_script(source("engine/lua/take_due.lua"))
        #: Whether a schedule's change, its flows' creates and its mark are one script (:meth:`fire_many`):
        #: on a single server; on a cluster the flows' keys sit in other slots than the schedule's.
        self.fires_in_one = not is_cluster(client)

    # -- reading ----------------------------------------------------------------------------------

    def get(self, schedule_id: str) -> ScheduleRecord | None:
        return ScheduleRecord.read(self.redis.hmget(self.keys.record(schedule_id), RECORD_FIELDS))

    def many(self, ids: Iterable[str]) -> list[ScheduleRecord]:
        """The records of ``ids`` that exist, in one round trip (``HMGET`` of the fields a record reads: a
        list, which costs the client less to read than ``HGETALL``'s map of every field)."""
        pipe = self.redis.pipeline(transaction=False)
        for schedule_id in ids:
            pipe.hmget(self.keys.record(schedule_id), RECORD_FIELDS)
        return [record for values in pipe.execute() if (record := ScheduleRecord.read(values)) is not None]

    def history(self, schedule_id: str) -> list[dict[str, Any]]:
        return [json.loads(item) for item in self.redis.lrange(self.keys.log(schedule_id), 0, -1)]

    def ids(self, *, state: ScheduleState | None, limit: int, offset: int) -> list[str]:
        """Schedule ids newest first (by creation), optionally in one state."""
        wanted = offset + limit
        found: list[tuple[float, str]] = []
        for partition in range(self.partitions):
            index = self.keys.by_state(partition, state.value) if state else self.keys.all(partition)
            for member, score in self.redis.zrevrange(index, 0, wanted - 1, withscores=True):
                found.append((float(score), member.decode()))
        found.sort(reverse=True)
        return [schedule_id for _, schedule_id in found[offset:wanted]]

    def next_due(self) -> float | None:
        earliest: float | None = None
        for partition in range(self.partitions):
            first = self.redis.zrange(self.keys.due(partition), 0, 0, withscores=True)
            if first:
                earliest = float(first[0][1]) if earliest is None else min(earliest, float(first[0][1]))
        return earliest

    # -- writing ----------------------------------------------------------------------------------

    def create(self, record: ScheduleRecord, entry: dict[str, Any], digest: str) -> bool:
        """Write ``record`` unless its id exists; False when it existed with the same input hash.

        Raises ValueError when the id exists with a different input (a create key reused).
        """
        created, stored = self._create(**self._create_args(record, entry, digest))
        return self._created(record, digest, created, stored)

    def create_many(self, items: Sequence[tuple[ScheduleRecord, dict[str, Any], str]]) -> list[bool | ValueError]:
        """:meth:`create` for many schedules in one round trip (bulk loads, the benchmark's million):
        per schedule, whether it was created, or the ValueError :meth:`create` would have raised."""
        pipe = ScriptPipeline(self.redis)
        for record, entry, digest in items:
            pipe.call(self._create, **self._create_args(record, entry, digest))
        results: list[bool | ValueError] = []
        for (record, _, digest), (created, stored) in zip(items, pipe.execute(), strict=True):
            try:
                results.append(self._created(record, digest, created, stored))
            except ValueError as exc:
                results.append(exc)
        return results

    @staticmethod
    def _created(record: ScheduleRecord, digest: str, created: int, stored: bytes) -> bool:
        if created == 2:
            raise ValueError(
                f"key {record.start_key!r} named schedule {record.id}, which ended and was removed; its charges' "
                "order ids are still known, so the key cannot name a new schedule for now: create it with another key"
            )
        if not created and stored.decode() != digest:
            raise ValueError(f"key {record.start_key!r} was used to create a different schedule")
        return bool(created)

    def _create_args(self, record: ScheduleRecord, entry: dict[str, Any], digest: str) -> dict[str, Any]:
        fields = {"id": record.id, "state": record.state.value, "version": "1", "created": repr(record.created)}
        fields |= {"updated": repr(record.created), "start_key": record.start_key, **record.fields()}
        due = record.due()
        partition = self.keys.partition(record.id)
        return {
            "keys": [
                self.keys.record(record.id),
                self.keys.log(record.id),
                self.keys.due(partition),
                self.keys.by_state(partition, record.state.value),
                self.keys.all(partition),
                self.keys.tombstone(record.id, partition),
            ],
            "args": [record.id, _json(fields), digest, "" if due is None else repr(due), _json(entry), repr(record.created)],
        }

    def update(self, old: ScheduleRecord, new: ScheduleRecord, events: Sequence[dict[str, Any]], now: float) -> bool:
        """Write ``new`` if ``old`` is still current (one compare-and-set); False when another writer won."""
        return bool(self._update(**self._update_args(old, new, events, now)))

    def update_many(
        self, changes: Sequence[tuple[ScheduleRecord, ScheduleRecord, Sequence[dict[str, Any]]]], now: float
    ) -> list[bool]:
        """:meth:`update` for many schedules in one round trip (the scheduler's batches)."""
        pipe = ScriptPipeline(self.redis)
        for old, new, events in changes:
            pipe.call(self._update, **self._update_args(old, new, events, now))
        return [bool(result) for result in pipe.execute()]

    def mark_many(self, marks: Sequence[tuple[ScheduleRecord, frozenset[str]]], now: float) -> list[bool]:
        """Mark the attempts ``keys`` of each (record as last written, keys) created, in one round trip:
        a compare-and-set of the ``open`` field alone against the version that write made."""
        pipe = ScriptPipeline(self.redis)
        for written, keys in marks:
            args = [str(written.version + 1), open_json(written.open, keys), repr(now)]
            pipe.call(self._mark, keys=[self.keys.record(written.id)], args=args)
        return [bool(result) for result in pipe.execute()]

    def fire_many(
        self,
        fires: Sequence[tuple[ScheduleRecord, ScheduleRecord, Sequence[dict[str, Any]], Sequence[tuple[str, CreateCall]]]],
        now: float,
    ) -> list[tuple[bool, list[Any]] | None]:
        """On a single server (:attr:`fires_in_one`), per (record as read, as changed, its history events,
        its starts as (attempt key, the flow's create call)): the change, the creates and the mark of the
        attempts in one script (``fire.lua``), every schedule's in one round trip. Per schedule: whether its
        attempts were marked created (every create's flow there; when one was refused the caller marks the
        others, :meth:`mark_many`), and each create's ``create.lua`` answer; or None when the change was
        refused (another writer got there first: nothing of it was written, no flow created)."""
        pipe = ScriptPipeline(self.redis)
        for old, new, events, creates in fires:
            call = self._update_args(old, new, events, now)
            keys, args = call["keys"], call["args"]
            args += [len(creates), open_json(new.open, frozenset(key for key, _ in creates)) if creates else ""]
            for _, (create_keys, create_args, digest) in creates:
                keys += create_keys
                args += [len(create_keys), len(create_args), digest, *create_args]
            pipe.call(self._fire, keys, args)
        return [(bool(reply[1]), list(reply[2:])) if reply[0] else None for reply in pipe.execute()]

    def _update_args(
        self, old: ScheduleRecord, new: ScheduleRecord, events: Sequence[dict[str, Any]], now: float
    ) -> dict[str, Any]:
        partition = self.keys.partition(old.id)
        due = new.due()
        return {
            "keys": [
                self.keys.record(old.id, partition),
                self.keys.log(old.id, partition),
                self.keys.due(partition),
                self.keys.by_state(partition, old.state.value),
                self.keys.by_state(partition, new.state.value),
                self.keys.events(partition),
                self.keys.ended(partition),
                self.keys.tombstone(old.id, partition),
            ],
            "args": [
                old.id,
                str(old.version),
                new.state.value,
                _json(new.fields(since=old)),
                "" if due is None else repr(due),
                _json([_json(event) for event in events]),
                repr(now),
                repr(old.created),
                _json(told) if self.events and (told := merchant_events(old.id, events)) else "[]",
                str(max(1, int(self.retention))) if new.ended() else "",
                str(self.history_entries),
                str(max(1, int(self.key_kept))) if new.ended() and new.start_key else "",
            ],
        }

    def trim_ended(self, *, now: float, batch: int = 1000) -> tuple[int, bool]:
        """Drop the index entries of the schedules that ended more than the retention ago and whose record
        has expired. Returns how many were dropped, and whether some partition had a full batch (pass
        again soon). Three round trips, ``batch`` entries per partition at most."""
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(self.partitions):
            pipe.zrangebyscore(self.keys.ended(partition), "-inf", now - self.retention, start=0, num=batch)
        taken = [(partition, [member.decode() for member in members]) for partition, members in enumerate(pipe.execute())]
        candidates = [(partition, schedule_id) for partition, members in taken for schedule_id in members]
        if not candidates:
            return 0, False
        pipe = self.redis.pipeline(transaction=False)
        for partition, schedule_id in candidates:
            pipe.exists(self.keys.record(schedule_id, partition))
        gone = [pair for pair, exists in zip(candidates, pipe.execute(), strict=True) if not exists]
        pipe = self.redis.pipeline(transaction=False)
        for partition, schedule_id in gone:
            for index in (self.keys.ended(partition), self.keys.all(partition), *self._final_indexes(partition)):
                pipe.zrem(index, schedule_id)
        if gone:
            pipe.execute()
        return len(gone), any(len(members) >= batch for _, members in taken)

    def _final_indexes(self, partition: int) -> list[str]:
        return [self.keys.by_state(partition, state.value) for state in sorted(FINAL)]

    def take_due(self, partition: int, *, now: float, batch: int, grace: float) -> list[str]:
        ids = self._take_due(keys=[self.keys.due(partition)], args=[repr(now), batch, repr(grace)])
        return [schedule_id.decode() for schedule_id in ids]
