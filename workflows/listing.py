"""Pages of flows that cost the same with a million flows as with a thousand, and finding one flow.

One listing for every surface: ``Engine.list`` (so ``GET /flows``, the CLI and the client), and the
console's flow list. A page reads, per index, only the newest entries below a cursor
(``ZREVRANGEBYSCORE ... LIMIT``: O(log N + n)), a share of the page at first and more only from the
indexes whose rows could still be on the page (a k-way merge), then reads those records: the cost
depends on the page size and the number of indexes (partitions x kinds, or x states), never on N.

Which indexes: a state filter reads the states' indexes (ordered by each flow's last change); anything
else reads the kind indexes (ordered by creation), every kind's when no kind is asked. So the list of
all flows is ordered by creation: a flow that moves on between two pages keeps its place, where in a
list by last change it would jump to the top and be skipped by a reader paging down.

The cursor is the last row shown, ``<score>:<flow id>`` (score: the time the index orders by, the last
change for a state index, the creation for a kind index); the next page is what sorts strictly after
it (score descending, then id descending). A position, not a count: flows started after a page was
read sort before its cursor and never shift or repeat the next page, and flows with the same time
that straddle two pages are neither skipped nor repeated.

Search (:meth:`FlowListing.find`) answers a flow id, a gateway order id (``workflows.orders``' lookup),
a start key (the flow id is derived from it, per kind) or a gateway operation id (the lookup
``transition.lua`` writes with each step's output, ``Keys.operation``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from durapay.workflows.keys import Keys, derived_id
from durapay.workflows.states import FlowState
from durapay.workflows.store import FlowRecord, FlowStore

#: How many rounds a filtered page reads before it answers with what it found and a cursor (a kind
#: filter on state indexes may have to step over many flows of other kinds).
MAX_ROUNDS = 8
#: A cursor's time: ``repr`` of a float of POSIX seconds (an exponent only for odd test clocks).
SCORE = r"[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,2})?"
#: A flow id as the API's paths take it (``service.api_flows.FlowId``).
FLOW_ID = r"[A-Za-z0-9._:-]{1,100}"
#: What :meth:`Cursor.parse` accepts, for the OpenAPI document (the route says why a cursor is refused).
CURSOR_PATTERN = f"^{SCORE}:{FLOW_ID}$"


class BadCursor(ValueError):
    """A cursor that is not one a page gave: the reason says what is wrong with it."""


@dataclass(frozen=True)
class Cursor:
    score: float
    flow_id: str

    def text(self) -> str:
        return f"{self.score!r}:{self.flow_id}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """``<score>:<flow id>``; :class:`BadCursor` saying what is wrong when malformed (it is merchant
        input: ``GET /flows?after=`` answers the reason)."""
        score, sep, flow_id = text.partition(":")
        if not sep or not flow_id:
            raise BadCursor("a cursor is <time>:<flow id>: pass the `next` of the previous page as it is")
        if not re.fullmatch(SCORE, score):
            raise BadCursor(f"the cursor's time {score[:40]!r} is not a time: pass the `next` of the previous page as it is")
        if not re.fullmatch(FLOW_ID, flow_id):
            raise BadCursor("the cursor's flow id is not one (letters, digits and ._:- only, at most 100 characters)")
        return cls(float(score), flow_id)

    def before(self, score: float, flow_id: str) -> bool:
        """Whether ``(score, flow_id)`` sorts after this cursor (newest first, then id descending)."""
        return (score, flow_id) < (self.score, self.flow_id)


@dataclass
class Page:
    records: list[FlowRecord]
    next: Cursor | None


class FlowPage(list[FlowRecord]):
    """What ``Engine.list`` answers: the page's flows (a list, compared as one), and ``next``: the cursor
    of the following page (pass it as ``after=``), None at the end."""

    def __init__(self, records: Iterable[FlowRecord] = (), next: str | None = None) -> None:
        super().__init__(records)
        self.next = next


class FlowListing:
    """Cursor pages over the state and kind indexes, and search. Give it the engine's store."""

    def __init__(self, store: FlowStore, kinds: Iterable[str]) -> None:
        self.store = store
        self.redis: Any = store.redis
        self.keys: Keys = store.keys
        self.kinds = sorted(kinds)

    def indexes(self, states: Sequence[FlowState], kind: str | None) -> list[str]:
        """The indexes a page merges: the states' when states are asked, else the kind's (every kind's
        when none is asked: the list of all flows is by creation)."""
        partitions = range(self.keys.partitions)
        if states:
            return [self.keys.by_state(partition, state.value) for partition in partitions for state in states]
        kinds = [kind] if kind is not None else self.kinds
        return [self.keys.by_kind(partition, name) for partition in partitions for name in kinds]

    def flows(
        self,
        *,
        states: Sequence[FlowState] = (),
        kind: str | None = None,
        since: float | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> FlowPage:
        """Up to ``limit`` flows after the cursor ``after`` (its text; None: from the newest),
        and the cursor of the next page. Unlike :meth:`page`, a page is filled: where a filter steps over
        many flows of other kinds, pages are read on until ``limit`` flows or the end (what a caller
        asking for ``limit`` flows expects; the cost grows with what the filter steps over)."""
        cursor = Cursor.parse(after) if after is not None else None
        found = FlowPage()
        while True:
            page = self.page(states=states, kind=kind, since=since, limit=limit - len(found), after=cursor)
            found += page.records
            cursor = page.next
            if cursor is None or len(found) >= limit:
                found.next = cursor.text() if cursor is not None else None
                return found

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
