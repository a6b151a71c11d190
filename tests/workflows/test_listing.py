"""Cursor pages and search (``workflows.listing``) on a real Valkey: every flow exactly once, newest
first, ties included, flows started while a page is read included; filters (``since``/``until`` bound
the creation with a state too); a request's reads bounded by its budget; search by flow id, start key
and operation id; the operation lookup and the gateway call kept in the log by the transition that
records the step's output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durapay.tasks.outcomes import Advance
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.keys import derived_id
from durapay.workflows.engine.states import FlowState
from durapay.workflows.listing import READ_BUDGET, Cursor, FlowListing
from tests.workflows.engine_support import ScriptedStep, flow

PAID = {"operation": {"operationId": "op-777", "operationResult": "EXECUTED", "operationAmount": "15"}}


def every_page(listing: FlowListing, limit: int, **filters: Any) -> list[str]:
    seen: list[str] = []
    after: Cursor | None = None
    for _ in range(100):
        page = listing.page(limit=limit, after=after, **filters)
        assert len(page.records) <= limit
        seen += [record.id for record in page.records]
        if page.next is None:
            return seen
        after = Cursor.parse(page.next.text())
    raise AssertionError("pages never ended")


def test_pages_give_every_flow_once_newest_first_even_with_ties(make_engine: Callable[..., Any], clock: ManualClock) -> None:
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    tied = [engine.start("demo", {"amount": n}).id for n in range(1, 26)]  # one instant: 25 ties
    later = []
    for n in range(10):
        clock.advance(1)
        later.append(engine.start("demo", {"amount": 100 + n}).id)
    listing = FlowListing(engine.store, engine.registry)
    expected = list(reversed(later)) + sorted(tied, reverse=True)
    for limit in (1, 7, 50):
        assert every_page(listing, limit) == expected
        assert every_page(listing, limit, kind="demo") == expected
        assert every_page(listing, limit, states=[FlowState.READY]) == expected
    assert every_page(listing, 4, states=[FlowState.FAILED]) == []
    assert every_page(listing, 4, since=clock.now() - 3.5) == list(reversed(later))[:4]
    assert every_page(listing, 4, until=clock.now() - 9.5) == sorted(tied, reverse=True)
    assert listing.count()["ready"] == 35


def test_search_by_flow_id_start_key_and_operation_id(make_engine: Callable[..., Any]) -> None:
    engine: Engine
    engine, _ = make_engine(flow(ScriptedStep("pay", [Advance(PAID)])))
    record = engine.start("demo", {"amount": 15}, "merchant-key-1")
    other = engine.start("demo", {"amount": 16})
    assert engine.run_step(record.id, "pay") == FlowState.SUCCEEDED.value
    listing = FlowListing(engine.store, engine.registry)
    assert [found.id for found in listing.find(record.id)] == [record.id]
    assert [found.id for found in listing.find("merchant-key-1")] == [record.id]
    assert [found.id for found in listing.find("op-777")] == [record.id]
    assert engine.store.flow_for_operation("op-777") == record.id
    assert listing.find("op-000") == [] and [found.id for found in listing.find(other.id)] == [other.id]
    call = [entry["call"] for entry in engine.history(record.id) if entry.get("call")]
    assert call == [{"op": "create_moto_order", "status": "EXECUTED", "ms": call[0]["ms"]}]


def test_a_malformed_cursor_is_refused() -> None:
    for text in ("", "abc", "12.5:", "x:f1"):
        try:
            Cursor.parse(text)
        except ValueError:
            continue
        raise AssertionError(f"{text!r} was accepted")


class Watched:
    """The engine's Redis, its pipelines watched: ``between`` runs once after the first pipeline of a
    listing (another client writing while a page is read), ``entries`` counts the index entries read."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.between: Callable[[], None] | None = None
        self.entries = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.redis, name)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        watched = self

        class Pipe:
            def __init__(self, pipe: Any) -> None:
                self.pipe = pipe
                self.ranges: list[bool] = []

            def __getattr__(self, name: str) -> Any:
                command = getattr(self.pipe, name)

                def queue(*args: Any, **kwargs: Any) -> Any:
                    self.ranges.append(name == "zrevrangebyscore")
                    command(*args, **kwargs)
                    return self

                return queue if callable(command) and name != "execute" else command

            def execute(self) -> Any:
                answers = self.pipe.execute()
                watched.entries += sum(len(answer) for answer, rank in zip(answers, self.ranges, strict=True) if rank)
                between, watched.between = watched.between, None
                if between is not None:
                    between()
                return answers

        return Pipe(self.redis.pipeline(*args, **kwargs))


def keys_in_partition(engine: Engine, partition: int, count: int, tag: str) -> list[str]:
    """``count`` start keys whose flows fall in ``partition`` (the flow id derives from the key)."""
    found = [f"{tag}-{n}" for n in range(count * engine.keys.partitions * 8)]
    return [key for key in found if engine.keys.partition(derived_id("f", "demo", key)) == partition][:count]


def test_a_flow_started_while_a_page_is_read_neither_repeats_nor_hides_a_row(
    make_engine: Callable[..., Any], clock: ManualClock
) -> None:
    """A page needing two reads of one index (40 flows in one partition, 34 asked at first): three flows
    start between the two reads. Read on from an offset, the second read began three rows too high and
    the page showed three flows twice; read on from the last (score, id), each flow once."""
    engine: Engine
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    keys = keys_in_partition(engine, 0, 43, "paged")
    older = []
    for key in keys[:40]:
        clock.advance(1)
        older.append(engine.start("demo", {"amount": 1}, key).id)
    watched = Watched(engine.store.redis)

    def starts() -> None:
        clock.advance(1)
        for key in keys[40:]:
            engine.start("demo", {"amount": 2}, key)

    watched.between = starts
    engine.store.redis = watched
    try:
        page = engine.list(limit=50)
    finally:
        engine.store.redis = watched.redis
    assert watched.between is None, "the starts did not run between the page's reads"
    assert [record.id for record in page] == list(reversed(older)) and page.next is None


def test_one_request_reads_at_most_its_budget_and_answers_where_it_stopped(
    make_engine: Callable[..., Any], clock: ManualClock
) -> None:
    """`state=ready&kind=demo` where the ready indexes hold 60,000 entries of flows already gone (the
    trimmer has not reached them) above the one demo flow: each request reads about READ_BUDGET
    entries (rows of the first round over) and answers a short page with its ``next``; following the
    cursors finds the flow, once."""
    engine: Engine
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    wanted = engine.start("demo", {"amount": 1}).id
    clock.advance(30_000)
    redis = engine.store.redis
    for partition in range(engine.keys.partitions):
        index = engine.keys.by_state(partition, FlowState.READY.value)
        redis.zadd(index, {f"fgone{partition}x{n}": clock.now() - n for n in range(20_000)})
    first_round = engine.keys.partitions * 8
    watched = Watched(redis)
    engine.store.redis = watched
    seen: list[str] = []
    after = None
    requests = 0
    try:
        for requests in range(1, 40):
            watched.entries = 0
            page = engine.list(state=FlowState.READY, kind="demo", limit=1, after=after)
            assert watched.entries <= READ_BUDGET + first_round, f"request {requests} read {watched.entries} entries"
            seen += [record.id for record in page]
            assert page.next is None or page.next != after, "a request that did not move on"
            after = page.next
            if after is None:
                break
    finally:
        engine.store.redis = redis
    assert seen == [wanted] and after is None
    assert requests >= 60_000 // (READ_BUDGET + first_round), "each request stopped at its budget"


def test_since_and_until_bound_the_creation_with_or_without_a_state(make_engine: Callable[..., Any], clock: ManualClock) -> None:
    """A flow created two hours ago that succeeded a minute ago is not `since=1h`, with a state or
    without (the state's index orders by last change; `since` meant that change there, and the
    creation elsewhere); it is `until=90m`, with a state too."""
    engine: Engine
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    old = engine.start("demo", {"amount": 1}).id
    clock.advance(7200)
    recent = engine.start("demo", {"amount": 2}).id
    clock.advance(60)
    for flow_id in (old, recent):
        assert engine.run_step(flow_id, "pay") == FlowState.SUCCEEDED.value
    listing = FlowListing(engine.store, engine.registry)
    since = clock.now() - 3600
    until = clock.now() - 5400
    succeeded = [FlowState.SUCCEEDED]
    assert every_page(listing, 1, since=since) == every_page(listing, 1, since=since, states=succeeded) == [recent]
    assert every_page(listing, 1, until=until) == every_page(listing, 1, until=until, states=succeeded) == [old]
    assert [record.id for record in engine.list(state=FlowState.SUCCEEDED, since=since)] == [recent]
