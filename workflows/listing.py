"""Pages of flows that cost the same with a million flows as with a thousand, and finding one flow.

Why not ``Engine.list``: it reads every id of the indexes it lists (a ``ZRANGEBYSCORE`` of the whole
range, sorted in Python) before it reads the page; fine for a CLI on a small store, not for a console
in front of a million flows. Here a page reads, per index, only the newest entries below a cursor
(``ZREVRANGEBYSCORE ... LIMIT``: O(log N + n)), a share of the page at first and more only from the
indexes whose rows could still be on the page (a k-way merge), then reads those records: the cost
depends on the page size and the number of indexes (partitions x states), never on N.

The cursor is the last row shown, ``<score>:<flow id>`` (score: the time the index orders by, the last
change for a state index, the creation for a kind index); the next page is what sorts strictly after
it (score descending, then id descending), so rows are never skipped or repeated when flows with
the same time straddle two pages.

Search (:meth:`FlowListing.find`) answers a flow id, a gateway order id (``workflows.orders``' lookup),
a start key (the flow id is derived from it, per kind) or a gateway operation id (the lookup
``transition.lua`` writes with each step's output, ``Keys.operation``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from durapay.workflows.keys import Keys, derived_id
from durapay.workflows.states import FlowState
from durapay.workflows.store import FlowRecord, FlowStore

#: How many rounds a filtered page reads before it answers with what it found and a cursor (a kind
#: filter on state indexes may have to step over many flows of other kinds).
MAX_ROUNDS = 8


@dataclass(frozen=True)
class Cursor:
    score: float
    flow_id: str

    def text(self) -> str:
        return f"{self.score!r}:{self.flow_id}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """``<score>:<flow id>``; ValueError when malformed."""
        score, sep, flow_id = text.partition(":")
        if not sep or not flow_id:
            raise ValueError("a cursor is <time>:<flow id>, as the previous page gave it")
        return cls(float(score), flow_id)

    def before(self, score: float, flow_id: str) -> bool:
        """Whether ``(score, flow_id)`` sorts after this cursor (newest first, then id descending)."""
        return (score, flow_id) < (self.score, self.flow_id)


@dataclass
class Page:
    records: list[FlowRecord]
    next: Cursor | None


class FlowListing:
    """Cursor pages over the state and kind indexes, and search. Give it the engine's store."""

    def __init__(self, store: FlowStore, kinds: Iterable[str]) -> None:
        self.store = store
        self.redis: Any = store.redis
        self.keys: Keys = store.keys
        self.kinds = sorted(kinds)

    def indexes(self, states: Sequence[FlowState], kind: str | None) -> list[str]:
        """The indexes a page merges: the states' (all states when none is asked and no kind), else the kind's."""
        partitions = range(self.keys.partitions)
        if not states and kind is not None:
            return [self.keys.by_kind(partition, kind) for partition in partitions]
        chosen = states or list(FlowState)
        return [self.keys.by_state(partition, state.value) for partition in partitions for state in chosen]

    def page(
        self,
        *,
        states: Sequence[FlowState] = (),
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
        after: Cursor | None = None,
    ) -> Page:
        """The ``limit`` newest flows after ``after`` (None: from the newest), and the cursor of the next page."""
        indexes = self.indexes(states, kind)
        wanted = {state.value for state in states}
        found: list[tuple[float, FlowRecord]] = []
        cursor = after
        fetch = limit + 1
        for _ in range(MAX_ROUNDS):
            entries = self._newest(indexes, cursor, since, until, fetch)
            taken = entries
            if not taken:
                return Page([record for _, record in found], None)
            records = {record.id: record for record in self.store.many(flow_id for _, flow_id in taken)}
            for score, flow_id in taken:
                record = records.get(flow_id)
                if record is None or (kind is not None and record.kind != kind):
                    continue
                if wanted and record.state.value not in wanted:
                    continue
                found.append((score, record))
            cursor = Cursor(*taken[-1])
            if len(found) > limit:
                score, record = found[limit - 1]
                return Page([record for _, record in found[:limit]], Cursor(score, record.id))
            if len(entries) < fetch:
                return Page([record for _, record in found], None)
            fetch = min(fetch * 2, 1000)
        # Stepped over many rows that did not match: answer what was found and where to go on.
        return Page([record for _, record in found], cursor)

    def _newest(
        self, indexes: Sequence[str], after: Cursor | None, since: float | None, until: float | None, count: int
    ) -> list[tuple[float, str]]:
        """The ``count`` newest (score, id) after ``after`` over all ``indexes``, merged.

        A k-way merge that reads little: each index is first asked for a share of ``count`` (twice its
        even share); an index is read further only while its last row read could still be among the
        ``count`` newest (it sorts before the current cut) or the rows read so far are too few. Rows
        tied with the cursor are stepped over the same way."""
        high: float | str = "+inf" if until is None else until
        if after is not None:
            high = after.score if until is None else min(after.score, until)
        low: float | str = "-inf" if since is None else since
        share = max(8, -(-2 * count // max(1, len(indexes))))
        asked = [share] * len(indexes)
        read = [0] * len(indexes)
        last: list[tuple[float, str] | None] = [None] * len(indexes)
        done = [False] * len(indexes)
        rows: list[tuple[float, str]] = []
        pending = list(range(len(indexes)))
        while pending:
            pipe = self.redis.pipeline(transaction=False)
            for i in pending:
                pipe.zrevrangebyscore(indexes[i], high, low, start=read[i], num=asked[i], withscores=True)
            for i, answer in zip(pending, pipe.execute(), strict=True):
                got = [(float(score), member.decode()) for member, score in answer]
                read[i] += len(got)
                done[i] = len(got) < asked[i]
                if got:
                    last[i] = got[-1]
                rows += [row for row in got if after is None or after.before(*row)]
            rows.sort(reverse=True)
            cut = rows[count - 1] if len(rows) >= count else None
            pending = []
            for i in range(len(indexes)):
                seen = last[i]
                if not done[i] and (cut is None or seen is None or seen > cut):
                    pending.append(i)
                    asked[i] *= 4
        return rows[:count]

    def count(self, states: Iterable[FlowState] = tuple(FlowState)) -> dict[str, int]:
        """Flows per state (a ZCARD per index: cheap at any size)."""
        chosen = list(states)
        pipe = self.redis.pipeline(transaction=False)
        for state in chosen:
            for partition in range(self.keys.partitions):
                pipe.zcard(self.keys.by_state(partition, state.value))
        answers = iter(pipe.execute())
        return {state.value: sum(int(next(answers)) for _ in range(self.keys.partitions)) for state in chosen}

    def find(self, text: str) -> list[FlowRecord]:
        """Flows ``text`` names: a flow id, a gateway order id, a start key or a gateway operation id."""
        text = text.strip()
        if not text or len(text) > 200:
            return []
        candidates = [text]
        candidates += [derived_id("f", kind, text) for kind in self.kinds]
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.order(text), "flow")
        for partition in range(self.keys.partitions):
            pipe.get(self.keys.operation(partition, text))
        for value in pipe.execute():
            if value:
                candidates.append(value.decode())
        seen: dict[str, FlowRecord] = {}
        for record in self.store.many(dict.fromkeys(candidates)):
            seen.setdefault(record.id, record)
        return list(seen.values())
