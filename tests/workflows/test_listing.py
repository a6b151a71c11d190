"""Cursor pages and search (``workflows.listing``) on a real Valkey: every flow exactly once, newest
first, ties included; filters; search by flow id, start key and operation id; the operation lookup and
the gateway call kept in the log by the transition that records the step's output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durapay.tasks.outcomes import Advance
from durapay.workflows.clock import ManualClock
from durapay.workflows.engine import Engine
from durapay.workflows.listing import Cursor, FlowListing
from durapay.workflows.states import FlowState
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
