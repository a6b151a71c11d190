"""Pages of flows that cost the same with a million flows as with a thousand, and finding one flow.

One listing for every surface: ``Engine.list`` (so ``GET /flows``, the CLI and the client), and the
console's flow list. A page reads, per index, only the newest entries below a cursor
(``ZREVRANGEBYSCORE ... LIMIT``: O(log N + n)), a share of the page at first and more only from the
indexes whose rows could still be on the page (a k-way merge), then reads those records: the cost
depends on the page size and the number of indexes (partitions x kinds, or x states), never on N.

Which indexes: a state filter reads the states' indexes (ordered by each flow's last change); anything
else reads the kind indexes (ordered by creation), every kind's when no kind is asked. So the list of
all flows is ordered by creation: a flow that moves on between two pages keeps its place. A list of one
state is ordered by last change: a flow that changes between two pages (enters the state, or moves on
within it: waiting at one step, then at the next) moves to the top, above the first page, and a reader
paging down does not meet it again; a listing from the top finds it, first. Every flow that kept its
place (no change since the first page) is shown exactly once.

``since`` and ``until`` bound the creation, with or without a state: on a kind index they bound the
score; on a state index ``since`` bounds the score too (a flow changed last before ``since`` was
created before it) and the records are checked; ``until`` cannot bound a state index (a flow created
before ``until`` may have changed since), its records are checked, and flows changed after are stepped
over within the read budget.

What one request reads is bounded: at most :data:`READ_BUDGET` index entries over every index and
round. A filter that steps over many flows (a kind among the states' indexes, a time range on a state)
answers a short page, even an empty one, with the ``next`` where its reading stopped: the following
page goes on from there.

The cursor is the last row shown, ``<score>:<flow id>`` (score: the time the index orders by, the last
change for a state index, the creation for a kind index); the next page is what sorts strictly after
it (score descending, then id descending). A position, not a count: flows started after a page was
read sort before its cursor and never shift or repeat the next page, and flows with the same time
that straddle two pages are neither skipped nor repeated.

Search (:meth:`FlowListing.find`) answers a flow id, a gateway order id (``workflows.engine.orders``' lookup),
a start key (the flow id is derived from it, per kind) or a gateway operation id (the lookup
``transition.lua`` writes with each step's output, ``Keys.operation``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from durapay.workflows.engine import FlowRecord, FlowState, FlowStore, Keys, derived_id

#: How many index entries (rows of ``ZREVRANGEBYSCORE``, every index and round) one request may read
#: before it answers what it found and the cursor where it stopped: a kind filter on the states'
#: indexes may have to step over many flows of other kinds. An unfiltered page of 500 over 16
#: partitions and 12 kinds reads about 1,300.
READ_BUDGET = 5000
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


class _Reads:
    """What is left of a request's budget of index entries read. Its first round of reads is made in
    full whatever the budget (a share of the page from every index: the least that shows anything), so
    that a page always gets past its cursor."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.started = False


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
        terminal: str | None = None,
    ) -> FlowPage:
        """Up to ``limit`` flows after the cursor ``after`` (its text; None: from the newest), and the
        cursor of the next page: :meth:`page` with the cursors as text."""
        cursor = None if after is None else Cursor.parse(after)
        page = self.page(states=states, kind=kind, since=since, limit=limit, after=cursor, terminal=terminal)
        return FlowPage(page.records, page.next.text() if page.next is not None else None)

    def page(
        self,
        *,
        states: Sequence[FlowState] = (),
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
        after: Cursor | None = None,
        budget: int = READ_BUDGET,
        terminal: str | None = None,
    ) -> Page:
        """The ``limit`` newest flows after ``after`` (None: from the newest) created within
        ``since``..``until``, and the cursor of the next page (None: the end).

        Filled: rounds of reads go on until ``limit`` flows match or the indexes end, unless ``budget``
        index entries were read first; then the page is short (even empty) and its cursor is where the
        reading stopped. ``terminal``: only flows of that gateway terminal (read from the records, as a kind
        on the states' indexes is: no index of its own, so a rare terminal among many flows gives short pages)."""
        indexes = self.indexes(states, kind)
        wanted = {state.value for state in states}
        # A kind index is ordered by creation: the time range bounds what is read. A state index is
        # ordered by last change, which is never before the creation: `since` bounds it, `until` cannot.
        low, high = since, (None if states else until)
        reads = _Reads(budget)
        found: list[tuple[float, FlowRecord]] = []
        cursor = after
        fetch = limit + 1
        while True:
            entries, stopped = self._newest(indexes, cursor, low, high, fetch, reads)
            records = {record.id: record for record in self.store.many(flow_id for _, flow_id in entries)}
            for score, flow_id in entries:
                record = records.get(flow_id)
                if record is None or (kind is not None and record.kind != kind):
                    continue
                if wanted and record.state.value not in wanted:
                    continue
                if terminal is not None and record.terminal != terminal:
                    continue
                if (since is not None and record.created < since) or (until is not None and record.created > until):
                    continue
                found.append((score, record))
            if len(found) > limit:
                score, record = found[limit - 1]
                return Page([record for _, record in found[:limit]], Cursor(score, record.id))
            if stopped is not None:  # the budget is spent: what was found, and where reading stopped
                return Page([record for _, record in found], Cursor(*stopped))
            if len(entries) < fetch:
                return Page([record for _, record in found], None)
            cursor = Cursor(*entries[-1])
            if reads.left <= 0:
                return Page([record for _, record in found], cursor)
            fetch = min(fetch * 2, 1000)

    def _newest(
        self,
        indexes: Sequence[str],
        after: Cursor | None,
        since: float | None,
        until: float | None,
        count: int,
        reads: _Reads,
    ) -> tuple[list[tuple[float, str]], tuple[float, str] | None]:
        """The ``count`` newest (score, id) after ``after`` over all ``indexes``, merged, and None; or,
        when ``reads`` ran out first, the rows known to be the newest and the position down to which
        every index was read (the cursor to go on from).

        A k-way merge that reads little: each index is first asked for a share of ``count`` (twice its
        even share); an index is read further only while its last row read could still be among the
        ``count`` newest (it sorts before the current cut) or the rows read so far are too few. Each
        read of an index goes on from the last (score, id) it gave, a position as the page cursor is,
        never from a count: a flow added to an index between two reads (a start, a change of state)
        shifts every offset below it, and an offset would read a row twice or skip one. Rows tied with
        that position are read again and stepped over, as rows tied with the cursor are."""
        top: float | str = "+inf" if until is None else until
        low: float | str = "-inf" if since is None else since
        start: tuple[float, str] | None = (after.score, after.flow_id) if after is not None else None
        share = max(8, -(-2 * count // max(1, len(indexes))))
        asked = [share] * len(indexes)
        last = [start] * len(indexes)
        done = [False] * len(indexes)
        rows: list[tuple[float, str]] = []
        pending = list(range(len(indexes)))
        first, reads.started = not reads.started, True
        while pending:
            if reads.left <= 0:
                # Read down to its position, each index still pending; what sorts at or above the
                # highest of those positions is known to be the newest (an index not read at all is at
                # the cursor; a request's first round reads every index).
                frontier = max(position for i in pending if (position := last[i]) is not None)
                return [row for row in rows[:count] if row >= frontier], frontier
            asks: list[tuple[int, int]] = []
            left = reads.left
            for i in pending:
                if left <= 0 and not first:
                    break
                asks.append((i, asked[i] if first else min(asked[i], left)))
                left -= asks[-1][1]
            first = False
            pipe = self.redis.pipeline(transaction=False)
            for i, ask in asks:
                position = last[i]
                high = top if position is None else (position[0] if until is None else min(position[0], until))
                pipe.zrevrangebyscore(indexes[i], high, low, start=0, num=ask, withscores=True)
            for (i, ask), answer in zip(asks, pipe.execute(), strict=True):
                got = [(float(score), member.decode()) for member, score in answer]
                reads.left -= len(got)
                done[i] = len(got) < ask
                position = last[i]
                fresh = [row for row in got if position is None or row < position]
                if fresh:
                    last[i] = fresh[-1]
                rows += fresh
            rows.sort(reverse=True)
            cut = rows[count - 1] if len(rows) >= count else None
            asked_now = {i for i, _ in asks}
            pending = []
            for i in range(len(indexes)):
                seen = last[i]
                if not done[i] and (cut is None or seen is None or seen > cut):
                    pending.append(i)
                    if i in asked_now:
                        asked[i] *= 4
        return rows[:count], None

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
