"""Merchant events: written by the change that causes them, never otherwise; read back in order from any cursor.

A real Valkey, scripted steps and a manual clock (``engine_support``); schedules as in their own tests.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from durapay.tasks.outcomes import Advance, Attention, Finish, Retry
from durapay.workflows.engine import Claim, Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.events import Cursor, EventFeed
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.steps import FlowDefinition
from durapay.workflows.flows import REGISTRY
from durapay.workflows.flows._common import summarize
from durapay.workflows.flows.examples import MAKERS
from tests.workflows.engine_support import DemoInput, ScriptedStep, flow, wait_step

PAID = {"operation": {"operationId": "op-9", "orderId": "ord-1", "operationResult": "AUTHORIZED", "operationAmount": "500"}}


def types(engine: Engine, flow_id: str | None = None) -> list[str]:
    return [event.type for event, _ in engine.events() if flow_id is None or event.body.get("flow") == flow_id]


def test_a_flows_life_is_told_in_events(make_engine: Any, clock: ManualClock) -> None:
    create = ScriptedStep("create", customer_url=lambda output: "https://pay.example/page")
    pay = ScriptedStep("pay", outcomes=[Advance({"operation": {"operationId": "op-1", "operationResult": "EXECUTED"}})])
    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (create, wait_step(), pay), summarize))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "create")
    engine.run_step(record.id, "customer")
    engine.signal(record.id, "paid", {})
    engine.run_step(record.id, "customer")
    engine.run_step(record.id, "pay")
    events = [event for event, _ in engine.events()]
    assert [event.type for event in events] == ["flow.created", "flow.waiting", "flow.succeeded"]
    created, waiting, succeeded = (event.wire() for event in events)
    assert created["flow"] == record.id and created["kind"] == "demo" and created["data"]["state"] == "ready"
    assert waiting["data"]["customerUrl"] == "https://pay.example/page" and waiting["data"]["signals"] == ["paid"]
    assert succeeded["operationId"] == "op-1" and succeeded["data"]["operation"]["operationResult"] == "EXECUTED"
    assert succeeded["timestamp"].endswith("Z") and len({event.id for event in events}) == 3


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (
            Finish(False, "payment DECLINED", error={"type": "PaymentDeclined", "responseCode": "116", "decline": "soft"}),
            "flow.failed",
        ),
        (Attention("unclear"), "flow.needs_attention"),
    ],
)
def test_an_end_is_one_event_with_its_reason(make_engine: Any, outcome: Any, expected: str) -> None:
    engine, _ = make_engine(flow(ScriptedStep("pay", outcomes=[outcome])))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "pay")
    (_, end) = [event for event, _ in engine.events()]
    assert end.type == expected
    if expected == "flow.failed":
        assert end.body["data"]["decline"] == "soft" and end.body["data"]["error"]["responseCode"] == "116"
    else:
        assert end.body["data"]["reason"] == "pay: unclear"


def test_no_event_without_its_transition(make_engine: Any, clock: ManualClock) -> None:
    """A stale completion writes nothing, so it tells nothing; a retry or a claim tells nothing either."""
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    record = engine.start("demo", {"amount": 5})
    stale = engine.claim(record.id, "pay", worker="slow")
    assert isinstance(stale, Claim)
    clock.advance(31)
    assert engine.run_step(record.id, "pay", worker="fast") == "succeeded"
    assert engine.complete(stale, Finish(False, "too late")) == "stale"
    assert types(engine) == ["flow.created", "flow.succeeded"]
    retrying = engine.start("demo", {"amount": 6})
    claim = engine.claim(retrying.id, "pay")
    assert isinstance(claim, Claim)
    engine.complete(claim, Retry(1.0, {"type": "ServerError"}))
    assert types(engine, retrying.id) == ["flow.created"]


def test_a_cancel_requested_during_a_step_is_told_as_the_cancel(make_engine: Any) -> None:
    engine, _ = make_engine(flow(ScriptedStep("pay"), ScriptedStep("after")))
    record = engine.start("demo", {"amount": 5})
    claim = engine.claim(record.id, "pay")
    assert isinstance(claim, Claim)
    engine.cancel(record.id, "customer left")
    engine.complete(claim, Advance({}))
    assert types(engine, record.id) == ["flow.created", "flow.cancelled"]


def test_a_late_payment_is_told_with_the_operation(make_engine: Any, clock: ManualClock) -> None:
    engine, _ = make_engine(flow(wait_step()))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "customer")
    clock.advance(101)
    engine.run_step(record.id, "customer")
    assert engine.signal(record.id, "paid", PAID) == "late_payment"
    tail = [event for event, _ in engine.events()][-3:]
    assert [event.type for event in tail] == ["flow.failed", "payment.late", "flow.needs_attention"]
    assert tail[1].body["operationId"] == "op-9" and tail[1].body["data"]["endedAs"] == "failed"
    assert tail[2].body["data"]["error"]["type"] == "LatePayment"


def test_the_feed_resumes_from_any_cursor_in_the_same_order(make_engine: Any) -> None:
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    for amount in range(1, 13):
        record = engine.start("demo", {"amount": amount})
        engine.run_step(record.id, "pay")
    everything = list(engine.events())
    assert len(everything) == 24
    for index in (0, 5, 17, 23):
        resumed = [event.id for event, _ in engine.events(after=everything[index][1].text())]
        assert resumed == [event.id for event, _ in everything[index + 1 :]]
    feed = EventFeed(engine.redis, engine.keys)
    page, cursor = feed.read(types=["flow.succeeded"], limit=5)
    assert len(page) == 5 and all(event.type == "flow.succeeded" for event in page)
    rest, _ = feed.read(Cursor.parse(cursor.text()), types=["flow.succeeded"], limit=100)
    assert len(page) + len(rest) == 12
    per_stream: dict[str, list[str]] = {}
    for event, _ in everything:
        per_stream.setdefault(event.stream, []).append(event.entry)
    for entries in per_stream.values():
        assert entries == sorted(entries, key=lambda entry: tuple(int(part) for part in entry.split("-")))


def test_events_carry_no_card_data(make_engine: Any) -> None:
    engine, _ = make_engine(flow(ScriptedStep("pay", outcomes=[Finish(False, "declined", error={"type": "PaymentDeclined"})])))
    engine.start("demo", {"amount": 4349940199004549})
    for event, _ in engine.events():
        assert "4349940199004549" not in json.dumps(event.wire())


def test_a_bad_cursor_is_refused_naming_the_part() -> None:
    with pytest.raises(ValueError, match="p0=x"):
        Cursor.parse("p0=x")
    for not_ascii in ("p0=\u00b2-0", "p0=1-\u0661"):  # str.isdigit takes superscripts and Arabic-Indic digits
        with pytest.raises(ValueError, match="p0="):
            Cursor.parse(not_ascii)
    assert Cursor.parse("p0=1-0.s2=5-1").positions == {"p0": "1-0", "s2": "5-1"}


def test_a_stream_is_read_in_entry_order_even_when_its_times_go_backwards(redis_client: Any, key_prefix: str) -> None:
    """Times come from the writers' clocks, ids from the server's: paging must follow the ids, or a
    cursor would pass an event it never returned."""
    keys = Keys(prefix=key_prefix, partitions=2)
    for moment in (30.0, 10.0, 20.0):
        redis_client.xadd(keys.events(0), {"e": json.dumps({"type": "flow.created", "time": moment})})
    redis_client.xadd(keys.events(1), {"e": json.dumps({"type": "flow.created", "time": 15.0})})
    feed = EventFeed(redis_client, keys)
    seen, cursor = [], Cursor()
    for _ in range(10):
        page, cursor = feed.read(cursor, limit=2)
        seen += [(event.stream, event.time) for event in page]
    assert [time for stream, time in seen if stream == "p0"] == [30.0, 10.0, 20.0]
    assert len(seen) == 4


def read_all(feed: EventFeed, limit: int, types: list[str] | None = None) -> list[list[Any]]:
    """Every page a reader gets from the start, going on for as long as the cursor moves."""
    pages, cursor = [], Cursor()
    for _ in range(1000):
        page, following = feed.read(cursor, types=types, limit=limit)
        if not page and following == cursor:
            return pages
        pages.append(page)
        cursor = following
    raise AssertionError("the feed never ended")


def test_a_typed_page_is_filled_and_pages_keep_time_order_across_streams(redis_client: Any, key_prefix: str) -> None:
    """A stream that filled its fetch is read again before any later event of another stream passes
    its next one. Before, with types asked for, ``p0``'s 7 and 9 came after ``p1``'s 10.5."""
    keys = Keys(prefix=key_prefix, partitions=2)
    for moment in range(1, 13):
        kind = "flow.succeeded" if moment % 2 else "flow.created"
        redis_client.xadd(keys.events(0), {"e": json.dumps({"type": kind, "time": float(moment)})})
    for moment in (2.5, 6.5, 10.5):
        redis_client.xadd(keys.events(1), {"e": json.dumps({"type": "flow.succeeded", "time": moment})})
    pages = read_all(EventFeed(redis_client, keys), limit=3, types=["flow.succeeded"])
    times = [event.time for page in pages for event in page]
    assert times == [1.0, 2.5, 3.0, 5.0, 6.5, 7.0, 9.0, 10.5, 11.0]
    assert [len(page) for page in pages] == [3, 3, 3, 0]  # the last: the cursor steps over p0's 12


def test_every_event_is_read_once_in_stream_order_whatever_the_limit_and_types(redis_client: Any, key_prefix: str) -> None:
    """Random streams (seeded): times that go backwards within a stream, runs of one time (a batch),
    two types; every limit from 1 to 6, with and without a type, reads each wanted event once, in
    entry order within its stream."""
    rng = random.Random(15)
    keys = Keys(prefix=key_prefix, partitions=3)
    written: dict[str, list[tuple[float, str]]] = {}
    for _ in range(60):
        partition = rng.randrange(3)
        moment = float(rng.choice([rng.randrange(100), 50]))  # many at 50: entries that share a time
        kind = rng.choice(["flow.created", "flow.succeeded"])
        redis_client.xadd(keys.events(partition), {"e": json.dumps({"type": kind, "time": moment})})
        written.setdefault(f"p{partition}", []).append((moment, kind))
    feed = EventFeed(redis_client, keys)
    for limit in range(1, 7):
        for wanted in (None, ["flow.succeeded"]):
            seen: dict[str, list[tuple[float, str]]] = {}
            for page in read_all(feed, limit, wanted):
                assert len(page) <= limit
                for event in page:
                    seen.setdefault(event.stream, []).append((event.time, event.type))
            expected = {
                stream: [(moment, kind) for moment, kind in events if wanted is None or kind in wanted]
                for stream, events in written.items()
            }
            assert seen == {stream: events for stream, events in expected.items() if events}, (limit, wanted)


def test_a_created_event_names_the_kind_order_and_start_the_script_just_wrote(make_engine: Any, clock: ManualClock) -> None:
    """``create.lua`` builds ``flow.created`` from the fields it writes (no read back of the record)."""
    engine, _ = make_engine(REGISTRY["mit"])
    today = datetime.fromtimestamp(clock.now(), UTC)
    now_data, later_data = MAKERS["mit"]("evnow00001", today).data, MAKERS["mit"]("evlater001", today).data
    at_once = engine.start("mit", now_data)
    run_at = clock.now() + 3600
    later = engine.start("mit", later_data, run_at=run_at)
    created = {event.body["flow"]: event.wire() for event, _ in engine.events() if event.type == "flow.created"}
    assert created[at_once.id]["kind"] == created[later.id]["kind"] == "mit"
    assert created[at_once.id]["orderId"] == now_data["order"]["orderId"]
    assert created[later.id]["orderId"] == later_data["order"]["orderId"]
    assert created[at_once.id]["data"] == {"state": "ready", "step": at_once.step, "runAt": None}
    assert created[later.id]["data"] == {"state": "sleeping", "step": later.step, "runAt": run_at}
