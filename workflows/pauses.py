"""Pause and resume a flow kind: a maintenance window in which none of its flows runs a step.

While a kind is paused its flows wait where they are: nothing ends, no state changes, money in flight
stays recorded (``workflows.engine.inflight``), signals are still recorded (``signal.lua``) and read after the
resume. New flows of the kind are created and wait too. Schedules whose flows are of a paused kind fire
nothing (``Schedules.tick``): their occurrences then follow the ``missed`` policy, as after a scheduler
that was down for the pause.

Where the rule lives: ``engine/lua/pause.lua``, prepended to ``claim.lua`` (a worker's claim of a paused kind's
step is refused in the claim's own round trip), ``hold.lua`` (the dispatcher's, for a due flow of a
paused kind, so that it sends no message per held flow) and ``release.lua`` (a resume). A hold moves the
flow's due entry to the re-check (``DURAPAY_PAUSE__RECHECK_SECONDS``) and, the first time under a pause,
logs it in the flow's history and lists the flow in its partition's held set; a resume walks the held
sets (bounded batches), makes each flow due at once and logs the resume once. A flow a resume did not
reach (more than its budget) is released when it comes due (at most one re-check later) or by the
dispatcher's next sweeps (:meth:`Pauses.sweep`).

The pauses in force are one hash (kind -> who, when, why): the truth, which this module answers
(:meth:`Pauses.paused`). A script can only read keys of its own partition, so every partition holds a
copy (``Keys.paused``), written at each pause and resume (rare: the truth first, then the copies) and
brought back to the truth by the dispatcher (:meth:`Pauses.sweep`) should a pause or resume have stopped
half way. (A sweep that read the truth just before a resume may write the copy back once; the next
sweep, 5 s later, removes it, and a flow held meanwhile is released then.) Every pause and resume
is also added to an audit list (newest first, :data:`LOG_KEPT` entries).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from durapay.gateway._strict import did_you_mean
from durapay.workflows.engine import FlowRecord, FlowStore, Keys, ScriptPipeline, compact_json, mask_text, moment_id

#: Pause and resume entries kept in the audit list (the newest).
LOG_KEPT = 1000
#: Held flows a resume releases itself (per call, over all partitions); the dispatcher's sweeps and the
#: re-check release the rest.
RESUME_BUDGET = 20_000
#: Held flows one sweep of the dispatcher releases (per tick), and members read per batch.
SWEEP_BUDGET = 2_000
BATCH = 500
#: How long the dispatcher trusts its copy of the pauses in force before reading them again (seconds):
#: ``claim.lua`` decides in any case; the copy only spares the dispatcher sending held flows.
CACHE_SECONDS = 1.0
REASON_MAX = 500
WHO_MAX = 100
SEP = "\x1f"


class UnknownKind(ValueError):
    """A pause or resume of a flow kind the engine does not know: the reason names the closest."""

    def __init__(self, kind: str, known: Iterable[str]) -> None:
        names = sorted(known)
        super().__init__(f"no flow kind {kind!r}{did_you_mean(kind, names)} (known kinds: {', '.join(names)})")
        self.kind = kind


class NotPaused(ValueError):
    """A resume of a kind that is not paused."""


@dataclass(frozen=True)
class Pause:
    """A pause in force: the kind, its id (when it began: ``clock.moment_id``), who, when (POSIX seconds), why."""

    kind: str
    id: str
    by: str
    at: float
    reason: str

    def text(self) -> str:
        return compact_json({"kind": self.kind, "id": self.id, "by": self.by, "at": self.at, "reason": self.reason})

    @classmethod
    def parse(cls, raw: bytes | str) -> Pause:
        data = json.loads(raw)
        return cls(str(data["kind"]), str(data["id"]), str(data["by"]), float(data["at"]), str(data["reason"]))

    def view(self) -> dict[str, Any]:
        return {"kind": self.kind, "by": self.by, "at": self.at, "reason": self.reason}


class Pauses:
    """Pause, resume, and read the pauses in force and their audit list. One per engine."""

    def __init__(self, store: FlowStore, registry: Mapping[str, Any], now: Callable[[], float]) -> None:
        self.store = store
        self.redis: Any = store.redis
        self.keys: Keys = store.keys
        self._registry = registry  # the engine's, read at each use (kinds may be registered later)
        self._now = now
        self._cached: tuple[float, dict[str, Pause]] = (float("-inf"), {})

    # -- reading -------------------------------------------------------------------------------

    def paused(self) -> dict[str, Pause]:
        """The pauses in force, by kind (the one answer to "is this kind paused" outside the scripts)."""
        return {raw_kind.decode(): Pause.parse(raw) for raw_kind, raw in self.redis.hgetall(self.keys.pauses()).items()}

    def paused_recently(self) -> dict[str, Pause]:
        """:meth:`paused`, read at most once per :data:`CACHE_SECONDS` (the dispatcher's every tick)."""
        read_at, found = self._cached
        if time.monotonic() - read_at > CACHE_SECONDS:
            found = self.paused()
            self._cached = (time.monotonic(), found)
        return found

    def log(self, limit: int = 100) -> list[dict[str, Any]]:
        """Pauses and resumes, newest first: action, kind, by, at, reason (and flows released)."""
        return [json.loads(raw) for raw in self.redis.lrange(self.keys.pause_log(), 0, max(0, min(limit, LOG_KEPT) - 1))]

    def held_counts(self, kinds: Iterable[str]) -> dict[str, int]:
        """Flows of each kind listed as held by a pause (a ZLEXCOUNT per partition and kind, one round trip)."""
        chosen = sorted(kinds)
        pipe = self.redis.pipeline(transaction=False)
        for kind in chosen:
            for partition in range(self.keys.partitions):
                pipe.zlexcount(self.keys.held(partition), f"[{kind}{SEP}", f"({kind} ")
        answers = iter(pipe.execute())
        return {kind: sum(int(next(answers)) for _ in range(self.keys.partitions)) for kind in chosen}

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self._registry)

    def check(self, kind: str) -> None:
        if kind not in self.kinds:
            raise UnknownKind(kind, self.kinds)

    # -- acting --------------------------------------------------------------------------------

    def pause(self, kind: str, reason: str, *, by: str) -> Pause:
        """Pause ``kind`` (a pause in force is kept as it is: asking again changes nothing). The truth
        first, then every partition's copy: a pause stopped half way is completed by the next sweep."""
        self.check(kind)
        for _ in range(3):
            found = self.paused().get(kind)
            if found is not None:
                self._copy(found)
                return found
            now = self._now()
            # A person's words, masked where they are written (workflows.engine.sensitive), then bounded.
            pause = Pause(kind, moment_id(now), mask_text(by)[:WHO_MAX], now, mask_text(reason)[:REASON_MAX])
            if self.redis.hsetnx(self.keys.pauses(), kind, pause.text()):
                self._copy(pause)
                self._audit({"action": "pause", **pause.view()})
                self._cached = (float("-inf"), {})
                return pause
            # another pause won meanwhile: that one stands (read it again)
        raise RuntimeError(f"flow kind {kind!r}: its pause kept changing")

    def resume(self, kind: str, *, by: str) -> int:
        """Resume ``kind``: the truth first, then every partition's copy (a resume stopped between them is
        completed by the next sweep, which makes the copies follow the truth), then release the flows the
        pause held (up to :data:`RESUME_BUDGET`; the sweeps and the re-check release any beyond). Returns
        how many were released. :class:`NotPaused` when it is not paused (or another resume won)."""
        self.check(kind)
        found = self.paused().get(kind)
        if found is None or not self.redis.hdel(self.keys.pauses(), kind):
            raise NotPaused(f"flow kind {kind!r} is not paused")
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(self.keys.partitions):
            pipe.hdel(self.keys.paused(partition), kind)
        pipe.execute()
        self._cached = (float("-inf"), {})
        who = mask_text(by)[:WHO_MAX]
        released = self.release(kind, budget=RESUME_BUDGET, by=who)
        self._audit(
            {"action": "resume", "kind": kind, "by": who, "at": self._now(), "reason": found.reason, "released": released}
        )
        return released

    def release(self, kind: str, *, budget: int, by: str = "resume") -> int:
        """Release up to ``budget`` flows of ``kind`` that a pause held (``release.lua`` each: a kind paused
        again keeps them held). Returns how many were released."""
        released = 0
        left = budget
        for partition in range(self.keys.partitions):
            held = self.keys.held(partition)
            skipped = 0
            while left > 0:
                members = self.redis.zrangebylex(held, f"[{kind}{SEP}", f"({kind} ", start=skipped, num=min(BATCH, left))
                if not members:
                    break
                pipe = ScriptPipeline(self.redis)
                for member in members:
                    flow_id = member.decode().split(SEP, 1)[1]
                    keys = [self.keys.flow(flow_id), self.keys.log(flow_id), self.keys.due(partition)]
                    keys += [self.keys.paused(partition), held]
                    pipe.call(self.store.release_script, keys, [flow_id, kind, repr(self._now()), by])
                answers = [answer.decode() for answer in pipe.execute()]
                released += answers.count("released")
                skipped += answers.count("paused")  # paused again: stays listed, step over it
                left -= len(members)
                if len(members) < BATCH:
                    break
        return released

    def hold(self, records: Iterable[FlowRecord]) -> set[str]:
        """The dispatcher's hold of due flows whose kind is paused (``hold.lua`` decides each, the copy
        :meth:`paused_recently` only chooses whom to ask): the ids held, not to be sent."""
        paused = self.paused_recently()
        asked = [record for record in records if record.kind in paused]
        if not asked:
            return set()
        pipe = ScriptPipeline(self.redis)
        now = repr(self._now())
        recheck = repr(self.store.pause_recheck)
        for record in asked:
            partition = self.keys.partition(record.id)
            keys = [self.keys.flow(record.id), self.keys.log(record.id), self.keys.due(partition)]
            keys += [self.keys.paused(partition), self.keys.held(partition)]
            pipe.call(self.store.hold_script, keys, [record.id, now, recheck])
        return {record.id for record, answer in zip(asked, pipe.execute(), strict=True) if answer in (b"held", b"gone")}

    def sweep(self) -> int:
        """The dispatcher's repair, bounded: every partition's copy made equal to the pauses in force, and
        up to :data:`SWEEP_BUDGET` held flows of kinds no longer paused released. Returns how many."""
        truth = {raw_kind: raw for raw_kind, raw in self.redis.hgetall(self.keys.pauses()).items()}
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(self.keys.partitions):
            pipe.hgetall(self.keys.paused(partition))
        copies = pipe.execute()
        fix = self.redis.pipeline(transaction=False)
        stale = False
        for partition, copy in enumerate(copies):
            if copy != truth:
                stale = True
                gone = [kind for kind in copy if kind not in truth]
                if gone:
                    fix.hdel(self.keys.paused(partition), *gone)
                if truth:
                    fix.hset(self.keys.paused(partition), mapping=truth)
        if stale:
            fix.execute()
        released = 0
        counts = self.held_counts(self.kinds - {raw.decode() for raw in truth})
        for kind in [kind for kind, count in counts.items() if count]:
            if released >= SWEEP_BUDGET:
                break
            released += self.release(kind, budget=SWEEP_BUDGET - released, by="scheduler")
        return released

    def _copy(self, pause: Pause) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(self.keys.partitions):
            pipe.hset(self.keys.paused(partition), pause.kind, pause.text())
        pipe.execute()

    def _audit(self, entry: Mapping[str, Any]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.lpush(self.keys.pause_log(), compact_json(dict(entry)))
        pipe.ltrim(self.keys.pause_log(), 0, LOG_KEPT - 1)
        pipe.execute()
