"""``Engine.list`` pages by a cursor, a position (the last flow's time and id), never by a count.

Why: with ``offset`` a page read, then flows started, then the next page read by its offset showed the
last flows of the first page again (every new start shifts the list by one). The cursor is where the
last page ended: flows started since sort before it, flows created at one instant keep one order (by
id), and flows that move on meanwhile keep their place (the unfiltered list is ordered by creation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durapay.tasks.outcomes import Advance
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import WaitStep
from durapay.workflows.listing import BadCursor, Cursor
from tests.workflows.engine_support import ScriptedStep, flow


def wait_step(name: str) -> WaitStep:
    """A step that waits for the signal ``paid`` (a customer's answer), then moves on."""
    return WaitStep(
        name,
        ("paid",),
        on_signal=lambda ctx, signal, payload: Advance({"signal": signal}),
        on_deadline=lambda ctx: Advance({}),
        timeout=lambda ctx: 1000.0,
    )


def pages(engine: Engine, first: list[str], after: str | None, limit: int, **filters: Any) -> list[str]:
    """The ids of ``first`` and of every page after ``after`` (bounded: a cursor that never ends fails)."""
    seen = list(first)
    for _ in range(100):
        if after is None:
            return seen
        page = engine.list(limit=limit, after=after, **filters)
        assert len(page) <= limit
        seen += [record.id for record in page]
        after = page.next
    raise AssertionError("pages never ended")


def test_flows_started_between_pages_neither_repeat_nor_skip_a_flow(make_engine: Callable[..., Any], clock: ManualClock) -> None:
    engine: Engine
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    tied = [engine.start("demo", {"amount": n}).id for n in range(1, 6)]  # one instant: ordered by id
    clock.advance(1)
    later = [engine.start("demo", {"amount": 10 + n}).id for n in range(4)]
    expected = sorted(later, reverse=True) + sorted(tied, reverse=True)
    for limit in (1, 3, 4):
        first = engine.list(limit=limit)
        assert [record.id for record in first] == expected[:limit] and first.next is not None
        clock.advance(1)
        for n in range(6):  # six new starts before the next page: with an offset, page two repeated page one's end
            engine.start("demo", {"amount": 100 + n})
        assert pages(engine, [record.id for record in first], first.next, limit) == expected, f"limit {limit}"
        expected = [record.id for record in engine.list(limit=1000)]  # the new ones are part of the next round


def test_flows_that_move_on_between_pages_keep_their_place(make_engine: Callable[..., Any], clock: ManualClock) -> None:
    engine: Engine
    engine, _ = make_engine(flow(ScriptedStep("pay", [Advance({"n": n}) for n in range(20)])))
    ids = []
    for n in range(8):
        clock.advance(1)
        ids.append(engine.start("demo", {"amount": n + 1}).id)
    first = engine.list(limit=3)
    clock.advance(1)
    for flow_id in ids:  # every flow changes (ready -> succeeded): the unfiltered list is by creation
        assert engine.run_step(flow_id, "pay") == FlowState.SUCCEEDED.value
    assert pages(engine, [record.id for record in first], first.next, 3) == list(reversed(ids))
    succeeded = engine.list(state=FlowState.SUCCEEDED, limit=5)  # by last change: one instant, so by id
    assert pages(engine, [record.id for record in succeeded], succeeded.next, 5, state=FlowState.SUCCEEDED) == sorted(
        ids, reverse=True
    )


def test_the_last_page_says_so_and_filters_page_too(make_engine: Callable[..., Any], clock: ManualClock) -> None:
    engine: Engine
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    ids = []
    for n in range(5):
        clock.advance(1)
        ids.append(engine.start("demo", {"amount": n + 1}).id)
    whole = engine.list(limit=5)
    assert [record.id for record in whole] == list(reversed(ids)) and whole.next is None, "no page after the end"
    assert engine.list(limit=5, after=whole[-1].id and f"{whole[-1].created!r}:{whole[-1].id}") == []
    by_kind = engine.list(kind="demo", limit=2)
    assert pages(engine, [record.id for record in by_kind], by_kind.next, 2, kind="demo") == list(reversed(ids))
    recent: dict[str, Any] = {"state": FlowState.READY, "kind": "demo", "since": clock.now() - 1.5}
    ready = engine.list(limit=1, **recent)
    assert pages(engine, [record.id for record in ready], ready.next, 1, **recent) == [ids[-1], ids[-2]]


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [
        ("", "a cursor is <time>:<flow id>"),
        ("abc", "a cursor is <time>:<flow id>"),
        ("12.5:", "a cursor is <time>:<flow id>"),
        ("soon:f1", "the cursor's time"),
        ("nan:f1", "the cursor's time"),
        ("-1:f1", "the cursor's time"),
        ("12.5:f 1", "the cursor's flow id"),
        ("12.5:" + "f" * 101, "the cursor's flow id"),
    ],
)
def test_a_malformed_cursor_is_refused_saying_why(make_engine: Callable[..., Any], cursor: str, reason: str) -> None:
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    with pytest.raises(BadCursor, match=reason):
        engine.list(after=cursor)


def test_a_flow_that_changes_within_its_state_between_pages_moves_to_the_top(
    make_engine: Callable[..., Any], clock: ManualClock
) -> None:
    """A list of one state is by last change: a flow waiting at one step when page one is read, then
    waiting at the next (transition.lua gives it a new score) is not met again paging down (it went
    above page one); a listing from the top shows it first, and every flow that kept its place is shown
    once (README, GET /flows; Engine.list)."""
    engine: Engine
    engine, _ = make_engine(flow(wait_step("first"), wait_step("second"), ScriptedStep("done")))
    ids = []
    for n in range(6):
        clock.advance(1)
        flow_id = engine.start("demo", {"amount": n + 1}).id
        assert engine.run_step(flow_id, "first") == FlowState.WAITING.value
        ids.append(flow_id)
    first = engine.list(state=FlowState.WAITING, limit=2)
    assert [record.id for record in first] == [ids[5], ids[4]]
    clock.advance(1)
    moved = ids[0]  # not listed yet: it takes its signal and waits again at the next step
    engine.signal(moved, "paid", {})
    for _ in range(3):
        record = engine.get(moved)
        if record.state is FlowState.WAITING and record.step == "second":
            break
        engine.run_step(moved, record.step)
    assert (engine.get(moved).state, engine.get(moved).step) == (FlowState.WAITING, "second")
    paged = pages(engine, [record.id for record in first], first.next, 2, state=FlowState.WAITING)
    assert paged == [ids[5], ids[4], ids[3], ids[2], ids[1]], "each flow that kept its place, once"
    assert [record.id for record in engine.list(state=FlowState.WAITING, limit=1)] == [moved], "found from the top"


ODD_CURSORS = [
    "99999999999999999999.99999999999999999999e99:" + "-" * 100,
    "0:.",
    "0e-99:a",
    "1e+99::::",
    "00000:0",
    "1" * 20 + ":" + "z" * 100,
    "5e-324:x",
    "1:\u0661",
    "\uff11:x",
    "1:x\n",
    "1:x\x00",
    "1:" + "a" * 101,
]


@pytest.mark.parametrize("cursor", ODD_CURSORS)
def test_any_cursor_is_a_page_or_bad_cursor(make_engine: Callable[..., Any], cursor: str) -> None:
    """Whatever the text, with any filter: a page whose next is a cursor, or BadCursor (never another error)."""
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    engine.start("demo", {"amount": 1})
    filters: list[dict[str, Any]] = [{}, {"state": FlowState.READY}, {"kind": "demo", "state": FlowState.READY, "since": 0.0}]
    for each in filters:
        try:
            page = engine.list(after=cursor, limit=5, **each)
        except BadCursor:
            continue
        assert page.next is None or Cursor.parse(page.next)
