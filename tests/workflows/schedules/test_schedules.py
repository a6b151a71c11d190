"""Schedules on a real Valkey with a manual clock and a scripted ``mit`` flow (no Celery, no HTTP here).

The scripted MIT step answers per contract from a queue of ISO response codes ("000" approves, "116" is
a soft decline, "208" a hard one; "FAIL" fails, "ATTN" stops the flow for a person), so every path of
firing, missed occurrences, dunning and operator actions is exercised exactly; ``test_integration``
runs the same against the simulator with a worker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.gateway import Catalogue, MitRequest, decline_kind
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from durapay.workflows.engine import Engine, InputError, NotFound, OperatorError
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.events import SCHEDULE_TYPES
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition
from durapay.workflows.engine.store import StartConflict
from durapay.workflows.flows._common import summarize
from durapay.workflows.schedules import Schedules, ScheduleState

T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
DAY = 86400.0


@dataclass
class ScriptedMit:
    """The ``pay`` step of a stand-in MIT flow: answers from ``script[contractId]`` (default approve)."""

    script: dict[str, list[str]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    name: str = "pay"
    when: Any = None
    customer_url: Any = None
    #: Called with the contract while its call is at the gateway (the flow running, its call sent).
    during: Callable[[str], Any] | None = None

    @property
    def operation(self) -> Any:
        return Catalogue.create_mit_order

    @property
    def task_name(self) -> str:
        return "test.mit"

    def execute(self, ctx: StepContext) -> Outcome:
        contract = ctx.input.contractId
        code = self.script.get(contract, []).pop(0) if self.script.get(contract) else "000"
        self.calls.append((ctx.input.order.orderId, ctx.idempotency_key))
        if self.during is not None:
            self.during(contract)
        operation = {
            "operationId": f"op-{len(self.calls)}",
            "orderId": ctx.input.order.orderId,
            "additionalData": {"responseCode": code},
        }
        if code == "000":
            return Advance({"operation": {**operation, "operationResult": "EXECUTED"}})
        if code == "ATTN":
            return Attention("the gateway answered what no one expected", {"type": "UnknownResult"})
        if code == "NOCODE":  # declined with no response code at all
            error = {"type": "PaymentDeclined", "responseCode": None, "decline": None, "operationId": operation["operationId"]}
            declined = {"operation": {**operation, "additionalData": {}, "operationResult": "DECLINED"}}
            return Finish(False, "payment DECLINED", declined, error)
        if code == "FAIL":
            return Finish(
                False, "the gateway refused create_mit_order", error={"type": "BadRequest", "message": "PS0017 no contract"}
            )
        error = {
            "type": "PaymentDeclined",
            "responseCode": code,
            "decline": decline_kind(code),
            "operationId": operation["operationId"],
        }
        return Finish(False, f"payment DECLINED ({code})", {"operation": {**operation, "operationResult": "DECLINED"}}, error)

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        return NOT_COMMITTED


@dataclass
class World:
    engine: Engine
    schedules: Schedules
    clock: ManualClock
    mit: ScriptedMit

    def at(self, moment: datetime | float) -> None:
        self.clock.set(moment.timestamp() if isinstance(moment, datetime) else moment)

    def tick(self) -> int:
        """One scheduler pass, then run every MIT flow that is ready (what a worker would do)."""
        started = self.schedules.tick()
        for flow in self.engine.list(kind="mit", state=FlowState.READY, limit=10_000):
            self.engine.run_step(flow.id, "pay")
        return started

    def flows(self) -> list[Any]:
        return sorted(self.engine.list(kind="mit", limit=10_000), key=lambda flow: (flow.created, flow.start_key))

    def events(self, schedule_id: str, name: str) -> list[dict[str, Any]]:
        return [event for event in self.schedules.history(schedule_id) if event["event"] == name]


def make_world(redis_client: redis.Redis, key_prefix: str, **settings: Any) -> World:
    clock = ManualClock(T0)
    mit = ScriptedMit()
    definition = FlowDefinition("mit", MitRequest, (mit,), summarize, lambda data: str(data.order.orderId))  # type: ignore[arg-type]
    loaded = load_settings({"engine": {"key_prefix": key_prefix, "partitions": 3, "lease_seconds": 30}, **settings})
    engine = Engine(loaded, redis_client, {"mit": definition}, clock=clock)
    return World(engine, Schedules(engine, batch=50), clock, mit)


@pytest.fixture
def world(redis_client: redis.Redis, key_prefix: str) -> Iterator[World]:
    yield make_world(redis_client, key_prefix)


def monthly(day: int = 1, **extra: Any) -> dict[str, Any]:
    data = {"contractId": "c-1", "amount": 1500, "currency": "EUR", "description": "Gym", "rule": {"every": "month", "day": day}}
    return {**data, "timezone": "Europe/Rome", "start": "2026-01-01T09:00:00", **extra}


def rome(month: int, day: int = 1, year: int = 2026, hour: int = 9) -> datetime:
    from zoneinfo import ZoneInfo

    return datetime(year, month, day, hour, tzinfo=ZoneInfo("Europe/Rome"))


# -- the Python API ----------------------------------------------------------------------------------


def test_create_get_list_and_summary(world: World) -> None:
    record = world.schedules.create(monthly(31), key="gym-42")
    assert record.state is ScheduleState.ACTIVE and len(record.id) == 13
    summary = world.schedules.get(record.id).summary()
    assert summary["nextRun"] == "2026-01-31T08:00:00Z" and summary["nextRunLocal"] == "2026-01-31T09:00:00+01:00"
    assert summary["rule"] == {"every": "month", "day": 31} and summary["counts"]["fired"] == 0
    assert [r.id for r in world.schedules.list()] == [record.id]
    assert world.schedules.list(state="paused") == []
    assert world.schedules.history(record.id)[0]["event"] == "created"


def test_a_create_key_returns_the_same_schedule_and_refuses_another_input(world: World) -> None:
    first = world.schedules.create(monthly(), key="k")
    assert world.schedules.create(monthly(), key="k").id == first.id
    with pytest.raises(StartConflict):
        world.schedules.create(monthly(amount=999), key="k")


def test_create_many_writes_what_create_writes_and_refuses_per_item(world: World) -> None:
    one = world.schedules.create(monthly(), key="one")
    results = world.schedules.create_many(
        [(monthly(), "one"), (monthly(contractId="c-2"), "two"), (monthly(currency="EURO"), "bad"), (monthly(amount=9), "one")]
    )
    assert results[0] == one.id and isinstance(results[1], str)
    assert isinstance(results[2], InputError) and results[2].field == "currency"
    assert isinstance(results[3], StartConflict)
    two = world.schedules.get(results[1])
    assert two.spec.contractId == "c-2" and two.next_at == one.next_at and two.start_key == "two"
    assert [event["event"] for event in world.schedules.history(two.id)] == ["created"]
    world.at(rome(1))
    assert world.tick() == 2
    assert sorted(flow.input["contractId"] for flow in world.flows()) == ["c-1", "c-2"]


def test_errors_name_what_is_wrong(world: World) -> None:
    with pytest.raises(InputError) as raised:
        world.schedules.create(monthly(currency="EURO"))
    assert raised.value.field == "currency"
    with pytest.raises(InputError, match="end"):
        world.schedules.create(monthly(end="2025-12-31"))
    with pytest.raises(NotFound):
        world.schedules.get("s000000000000")
    with pytest.raises(InputError, match="state"):
        world.schedules.list(state="sleepy")


def test_each_occurrence_starts_one_mit_keyed_by_schedule_and_occurrence(world: World) -> None:
    record = world.schedules.create(monthly(31, customerId="cust-1", captureType="EXPLICIT"))
    world.at(rome(1, 31))
    assert world.tick() == 1
    assert world.tick() == 0
    (flow,) = world.flows()
    assert flow.start_key == f"{record.id}@2026-01-31T08:00:00Z"
    order = flow.input["order"]
    assert order == {
        "orderId": f"{record.id}00000",
        "amount": "1500",
        "currency": "EUR",
        "description": "Gym",
        "customerId": "cust-1",
    }
    assert flow.input["captureType"] == "EXPLICIT" and flow.state is FlowState.SUCCEEDED


@pytest.mark.parametrize("check", [None, 2.0], ids=["default", "check-2s"])
def test_a_started_charge_is_looked_at_after_check_seconds_then_at_doubling_intervals(
    redis_client: redis.Redis, key_prefix: str, check: float | None
) -> None:
    """DURAPAY_SCHEDULES__CHECK_SECONDS (30 s): when the scheduler first reads a charge's flow. It was a
    constant: a chaos run, whose one occurrence fires near its end, waited 30 s past the flows for it."""
    world = make_world(redis_client, key_prefix, **({"schedules": {"check_seconds": check}} if check else {}))
    first = check or 30.0
    record = world.schedules.create(monthly())
    world.at(rome(1, 1))
    assert world.schedules.tick() == 1  # started; no worker ran it: its flow is still ready
    (attempt,) = world.schedules.get(record.id).open
    assert attempt.due == pytest.approx(world.clock.now() + first)
    world.clock.advance(first)
    assert world.schedules.tick() == 0
    (attempt,) = world.schedules.get(record.id).open
    assert attempt.due == pytest.approx(world.clock.now() + 2 * first), "still running: looked at later"
    world.tick()  # the worker runs it; the next look finds it charged
    world.clock.advance(2 * first)
    world.tick()
    assert world.schedules.get(record.id).counts["charged"] == 1


def test_occurrences_start_on_the_trusted_path_which_still_checks_what_the_occurrence_adds(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler starts its flows with ``start_many(trusted=True)``: the schedule's fields were read
    strictly when it was created, so the merchant checks (unknown fields, "did you mean") are not made
    again; the same typed input is built, and every field's own type and bounds are still checked, the
    occurrence's ``orderId`` included."""
    calls: list[dict[str, Any]] = []
    real = world.engine.start_many

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(world.engine, "start_many", recording)
    record = world.schedules.create(monthly(31, customerId="cust-1", captureType="EXPLICIT"))
    world.at(rome(1, 31))
    # (``within``: on a single server the creates run inside the schedule's own script, fire.lua.)
    assert world.tick() == 1 and [{k: v for k, v in call.items() if k != "within"} for call in calls] == [
        {"owners": [record.id], "trusted": True}
    ]
    (fired,) = world.flows()
    strict = world.engine.validate("mit", fired.input)
    assert strict.model_dump(mode="json", by_alias=True, exclude_none=True) == fired.input, "the same input as a strict read"

    order = {"orderId": "x" * 28, "amount": "1500", "currency": "EUR", "description": "Gym"}
    too_long, bad_character, bad_amount, no_contract = world.engine.start_many(
        [
            ("mit", {"order": order, "contractId": "c-1"}, "k1"),
            ("mit", {"order": {**order, "orderId": "s1-0 r1"}, "contractId": "c-1"}, "k2"),
            ("mit", {"order": {**order, "orderId": "s1-1", "amount": "-5"}, "contractId": "c-1"}, "k3"),
            ("mit", {"order": {**order, "orderId": "s1-2"}}, "k4"),
        ],
        trusted=True,
    )
    assert isinstance(too_long, InputError) and too_long.field == "order.orderId" and "27" in too_long.reason
    assert isinstance(bad_character, InputError) and bad_character.field == "order.orderId"
    assert isinstance(bad_amount, InputError) and bad_amount.field == "order.amount"
    assert isinstance(no_contract, InputError) and no_contract.field == "contractId"
    assert [flow.start_key for flow in world.flows()] == [fired.start_key], "nothing else started"


def test_a_server_that_forgot_the_scripts_gets_them_again(world: World) -> None:
    """The scheduler queues its scripts on the pipeline by their SHA: the pipeline still loads the ones
    the server lacks (a restart without persistence, ``SCRIPT FLUSH``) before running them."""
    first = world.schedules.create(monthly(31))
    world.at(rome(1, 31))
    world.engine.redis.script_flush()
    assert world.tick() == 1
    world.engine.redis.script_flush()
    world.at(rome(2, 28))
    assert world.tick() == 1
    assert [flow.start_key for flow in world.flows()] == [f"{first.id}@2026-01-31T08:00:00Z", f"{first.id}@2026-02-28T08:00:00Z"]
    assert world.schedules.get(first.id).counts["fired"] == 2


def test_a_monthly_schedule_charges_once_a_month_for_24_months(world: World) -> None:
    record = world.schedules.create(monthly(31))
    for month in range(24):
        year, index = divmod(month, 12)
        world.at(rome(index + 1, 1, 2026 + year) + (rome(2, 1) - rome(1, 1)))  # the 1st of the next month: past day 31
        world.tick()
        world.clock.advance(60)
        world.tick()
    flows = world.flows()
    assert len(flows) == 24 and len({flow.input["order"]["orderId"] for flow in flows}) == 24
    assert world.schedules.get(record.id).counts["charged"] == 24
    assert [flow.start_key.split("@")[1][:10] for flow in flows[:3]] == ["2026-01-31", "2026-02-28", "2026-03-31"]


def test_count_and_end_complete_the_schedule(world: World) -> None:
    counted = world.schedules.create(monthly(count=2))
    ended = world.schedules.create(monthly(end="2026-02-01"))
    for month in (1, 2, 3):
        world.at(rome(month, 1, hour=10))
        world.tick()
    world.clock.advance(60)
    world.tick()
    for schedule_id in (counted.id, ended.id):
        record = world.schedules.get(schedule_id)
        assert record.state is ScheduleState.COMPLETED and record.counts["charged"] == 2
    assert len(world.flows()) == 4


# -- many schedulers -----------------------------------------------------------------------------------


def test_many_schedulers_at_once_fire_each_occurrence_once(world: World) -> None:
    ids = [world.schedules.create(monthly((n % 28) + 1, contractId=f"c-{n}")).id for n in range(60)]
    others = [Schedules(world.engine, batch=7) for _ in range(6)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(schedules: Schedules) -> None:
        while not stop.is_set():
            try:
                schedules.tick()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in others]
    for thread in threads:
        thread.start()
    try:
        for month in range(1, 7):
            world.at(rome(month, 28, hour=23))
            expected = 60 * month
            wait_for(
                lambda expected=expected: len(world.engine.list(kind="mit", limit=10_000)) >= expected, what=f"month {month}"
            )
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not errors
    flows = world.engine.list(kind="mit", limit=10_000)
    assert len(flows) == 360 and len({flow.start_key for flow in flows}) == 360
    assert all(world.schedules.get(schedule_id).counts["fired"] == 6 for schedule_id in ids)


def wait_for(probe: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition") -> None:
    import time

    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


# -- missed occurrences ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "fired", "skipped", "coalesced"), [("each", 3, 0, 0), ("once", 1, 0, 2), ("skip", 0, 3, 0)])
def test_a_scheduler_stopped_for_three_occurrences_catches_up_by_policy(
    world: World, policy: str, fired: int, skipped: int, coalesced: int
) -> None:
    record = world.schedules.create(monthly(missed=policy))
    world.at(rome(3, 2))  # down from before 1 January to 2 March: three occurrences missed
    world.tick()
    after = world.schedules.get(record.id)
    assert (after.counts.get("fired", 0), after.counts.get("skipped", 0), after.counts.get("coalesced", 0)) == (
        fired,
        skipped,
        coalesced,
    )
    (missed,) = world.events(record.id, "missed")
    assert missed["policy"] == policy and missed["occurrences"] == [
        "2026-01-01T08:00:00Z",
        "2026-02-01T08:00:00Z",
        "2026-03-01T08:00:00Z",
    ]
    assert after.summary()["nextRun"] == "2026-04-01T07:00:00Z"
    world.at(rome(4, 1))
    world.tick()
    assert len(world.flows()) == fired + 1


def test_skip_still_fires_an_occurrence_that_is_only_a_little_late(world: World) -> None:
    record = world.schedules.create(monthly(missed="skip"))
    world.at(rome(1, 1, hour=9).timestamp() + 600)
    assert world.tick() == 1
    assert world.schedules.get(record.id).counts.get("skipped", 0) == 0


# -- dunning -------------------------------------------------------------------------------------------------


def test_soft_declines_are_retried_after_1_3_7_days_then_the_schedule_stops(world: World) -> None:
    world.mit.script["c-1"] = ["116", "116", "116", "116"]
    record = world.schedules.create(monthly())
    first = rome(1, 1).timestamp()
    for offset in (0, 60, DAY, DAY + 60, 3 * DAY, 3 * DAY + 60, 7 * DAY, 7 * DAY + 60, 30 * DAY):
        world.at(first + offset)
        world.tick()
    flows = world.flows()
    assert [flow.created - first for flow in flows] == [0, DAY, 3 * DAY, 7 * DAY]
    assert [flow.input["order"]["orderId"] for flow in flows] == [
        f"{record.id}00000",
        f"{record.id}00001",
        f"{record.id}00002",
        f"{record.id}00003",
    ]
    assert len({key for _, key in world.mit.calls}) == 4  # a fresh idempotency key per retry
    stopped = world.schedules.get(record.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and "dunning exhausted" in stopped.reason
    assert stopped.counts["declined"] == 4 and stopped.counts["retried"] == 3 and stopped.last["responseCode"] == "116"
    assert [event["at"] for event in world.events(record.id, "retry scheduled")] == [
        "2026-01-02T08:00:00Z",
        "2026-01-04T08:00:00Z",
        "2026-01-08T08:00:00Z",
    ]


def test_a_hard_decline_stops_at_once(world: World) -> None:
    world.mit.script["c-1"] = ["208"]
    record = world.schedules.create(monthly())
    for moment in (rome(1, 1).timestamp(), rome(1, 1).timestamp() + 60, rome(3, 1).timestamp()):
        world.at(moment)
        world.tick()
    stopped = world.schedules.get(record.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and "hard decline (208 Lost card" in stopped.reason
    assert len(world.flows()) == 1 and world.events(record.id, "retry scheduled") == []


def test_a_success_after_a_retry_resumes_the_rule(world: World) -> None:
    world.mit.script["c-1"] = ["116", "000"]
    record = world.schedules.create(monthly())
    first = rome(1, 1).timestamp()
    for moment in (first, first + 60, first + DAY, first + DAY + 60):
        world.at(moment)
        world.tick()
    assert world.schedules.get(record.id).state is ScheduleState.ACTIVE
    for moment in (rome(2, 1).timestamp(), rome(2, 1).timestamp() + 60):
        world.at(moment)
        world.tick()
    keys = [flow.start_key.split("@")[1] for flow in world.flows()]
    assert keys == ["2026-01-01T08:00:00Z", "2026-01-01T08:00:00Z#1", "2026-02-01T08:00:00Z"]
    assert world.schedules.get(record.id).counts == {"fired": 2, "declined": 1, "retried": 1, "charged": 2}


def test_occurrences_passing_during_dunning_are_skipped(world: World) -> None:
    world.mit.script["c-1"] = ["116", "116", "000"]
    record = world.schedules.create({**monthly(), "rule": {"every": "days", "interval": 2}, "dunning": [1, 5]})
    first = rome(1, 1).timestamp()
    for offset in (0, 60, DAY, DAY + 60, 5 * DAY, 5 * DAY + 60):
        world.at(first + offset)
        world.tick()
    (skipped,) = world.events(record.id, "skipped")
    assert skipped["reason"] == "dunning" and skipped["count"] == 2
    assert world.schedules.get(record.id).summary()["nextRun"] == "2026-01-07T08:00:00Z"


def test_a_failure_that_is_not_a_decline_needs_a_person(world: World) -> None:
    world.mit.script["c-1"] = ["FAIL"]
    record = world.schedules.create(monthly())
    for moment in (rome(1, 1).timestamp(), rome(1, 1).timestamp() + 60):
        world.at(moment)
        world.tick()
    stopped = world.schedules.get(record.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and "PS0017" in stopped.reason


# -- operators and crashes ----------------------------------------------------------------------------------


def test_pause_resume_cancel_and_change_amount(world: World) -> None:
    record = world.schedules.create(monthly())
    world.schedules.pause(record.id, by="ops")
    with pytest.raises(OperatorError, match="paused"):
        world.schedules.pause(record.id)
    world.at(rome(2, 15))
    assert world.tick() == 0
    world.schedules.change_amount(record.id, 2500)
    resumed = world.schedules.resume(record.id)
    assert resumed.state is ScheduleState.ACTIVE and resumed.counts["skipped"] == 2
    world.at(rome(3, 1))
    world.tick()
    (flow,) = world.flows()
    assert flow.input["order"]["amount"] == "2500"
    cancelled = world.schedules.cancel(record.id, "customer left")
    assert cancelled.state is ScheduleState.CANCELLED and cancelled.reason == "customer left"
    with pytest.raises(OperatorError):
        world.schedules.resume(record.id)
    with pytest.raises(InputError, match="amount"):
        world.schedules.change_amount(record.id, 0)
    events = [event["event"] for event in world.schedules.history(record.id)]
    assert events == ["created", "paused", "amount changed", "resumed", "skipped", "fired", "cancelled"]


def test_a_start_lost_after_the_write_is_made_at_the_next_look(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's path (the schedule's change, the flows' creates and the mark apart: their keys sit in
    other slots), taken here on a single server; there the three are one script (test_fire.py)."""
    monkeypatch.setattr(world.schedules.store, "fires_in_one", False)
    record = world.schedules.create(monthly())
    world.at(rome(1, 1))
    real_start = world.engine.start_many
    monkeypatch.setattr(world.engine, "start_many", lambda *args, **kwargs: (_ for _ in ()).throw(ConnectionError("down")))
    world.schedules.tick()
    assert world.flows() == [] and world.schedules.get(record.id).counts["fired"] == 1
    monkeypatch.setattr(world.engine, "start_many", real_start)
    world.clock.advance(30)
    world.tick()
    assert len(world.flows()) == 1
    world.clock.advance(120)
    world.tick()
    assert world.schedules.get(record.id).counts["charged"] == 1


def test_a_charged_occurrence_whose_flow_expired_while_paused_is_never_charged_again(world: World) -> None:
    """The occurrence's flow succeeded; the schedule was paused past the flows' retention (30 days), so
    the finished flow's record expired; on resume the schedule must not start that occurrence again."""
    record = world.schedules.create(monthly())
    world.at(rome(1, 1))
    world.tick()
    assert len(world.mit.calls) == 1
    world.schedules.pause(record.id)
    (flow,) = world.flows()
    world.engine.redis.delete(world.engine.keys.flow(flow.id), world.engine.keys.log(flow.id))  # what the TTL does
    world.at(rome(2, 15))
    world.schedules.resume(record.id)
    world.tick()
    world.clock.advance(3600)
    world.tick()
    assert len(world.mit.calls) == 1, "the occurrence was charged once, ever"
    stopped = world.schedules.get(record.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and "2026-01-01" in stopped.reason


def test_cancelling_a_dunning_retry_skips_the_occurrences_that_passed_during_dunning(world: World) -> None:
    """Daily charges, every missed occurrence fired (``missed: each``); a soft decline opens a retry three
    days later; the operator cancels the retry's flow. The occurrences that passed meanwhile are skipped,
    whatever ended the dunning."""
    world.mit.script["c-1"] = ["116"]
    record = world.schedules.create({**monthly(), "rule": {"every": "days", "interval": 1}, "dunning": [3], "missed": "each"})
    first = rome(1, 1).timestamp()
    world.at(first)
    world.tick()
    world.at(first + 60)
    world.tick()
    assert world.schedules.get(record.id).state is ScheduleState.DUNNING
    world.at(first + 3 * DAY)
    world.schedules.tick()  # the retry's flow is started ...
    retry = [flow for flow in world.flows() if flow.state is FlowState.READY]
    assert len(retry) == 1
    world.engine.cancel(retry[0].id, "customer asked to stop")  # ... and cancelled before it runs
    world.clock.advance(60)
    world.tick()
    world.clock.advance(3600)
    world.tick()
    assert len(world.mit.calls) == 1, "no occurrence that passed during dunning was charged"
    (skipped,) = world.events(record.id, "skipped")
    assert skipped["reason"] == "dunning" and skipped["count"] == 3


def test_a_schedules_charges_declines_dunning_and_end_are_told_in_events(world: World) -> None:
    world.mit.script["c-1"] = ["000", "116", "116"]
    record = world.schedules.create({**monthly(), "count": 3, "dunning": [1]})
    for moment in (rome(1, 1), rome(2, 1)):
        world.at(moment)
        world.tick()
        world.clock.advance(60)
        world.tick()
    world.clock.advance(DAY)
    world.tick()
    world.clock.advance(60)
    world.tick()
    told = [event for event, _ in world.engine.events(types=SCHEDULE_TYPES) if event.body.get("schedule") == record.id]
    assert [event.type for event in told] == [
        "schedule.charged",
        "schedule.declined",
        "schedule.dunning",
        "schedule.declined",
        "schedule.needs_attention",
    ]
    declined = told[1].wire()
    assert (
        declined["schedule"] == record.id and declined["data"]["responseCode"] == "116" and declined["data"]["decline"] == "soft"
    )
    assert "dunning exhausted" in told[-1].body["data"]["reason"]
    charged = told[0].wire()
    assert charged["orderId"] == f"{record.id}00000" and charged["operationId"] and declined["orderId"] == f"{record.id}00010"
    assert {"id", "type", "timestamp", "schedule", "orderId", "operationId", "data"} <= set(charged)


# -- an occurrence whose flow is gone ----------------------------------------------------------------------


def stopped_on_a_gone_flow(world: World, **spec: Any) -> tuple[str, str]:
    """A monthly schedule whose 1 January charge succeeded while it was paused past the flows' retention:
    the flow's record expired before the schedule read its outcome, so the look after ``resume`` stops
    it in ``needs_attention``. Returns (schedule id, the gone flow's id)."""
    record = world.schedules.create(monthly(**spec))
    world.at(rome(1, 1))
    world.tick()
    world.schedules.pause(record.id)
    (flow,) = [flow for flow in world.flows() if flow.start_key.startswith(f"{record.id}@")]
    world.engine.redis.delete(world.engine.keys.flow(flow.id), world.engine.keys.log(flow.id))  # what the TTL does
    world.at(rome(2, 15))
    world.schedules.resume(record.id)
    world.tick()
    stopped = world.schedules.get(record.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and flow.id in stopped.reason
    return record.id, flow.id


JANUARY = "2026-01-01T08:00:00Z"


def test_resuming_a_schedule_stopped_by_a_gone_flow_is_refused_month_after_month(world: World) -> None:
    """The finding: resumed three months in a row, the schedule made the gone attempt due, the next look
    stopped it again, and no further occurrence ever fired. Resume now refuses, naming the occurrence
    and the action that moves it on, and the schedule never loops."""
    schedule_id, _ = stopped_on_a_gone_flow(world)
    for month in (3, 4, 5):
        world.at(rome(month, 2))
        with pytest.raises(OperatorError, match=rf"{JANUARY}.*resolve"):
            world.schedules.resume(schedule_id)
        world.tick()
        assert world.schedules.get(schedule_id).state is ScheduleState.NEEDS_ATTENTION
    assert len(world.mit.calls) == 1
    assert len(world.events(schedule_id, "needs attention")) == 1, "stopped once, not once per resume"


def test_an_occurrence_the_gateway_shows_charged_counts_as_a_charge_and_the_schedule_goes_on(world: World) -> None:
    schedule_id, flow_id = stopped_on_a_gone_flow(world)
    world.at(rome(3, 2))
    resolved = world.schedules.resolve(schedule_id, JANUARY, "charged", operation_id="op-1", by="ops")
    assert resolved.state is ScheduleState.NEEDS_ATTENTION and resolved.open == [], "closed; resuming is the operator's call"
    assert resolved.counts["charged"] == 1 and resolved.summary()["counts"]["not_charged"] == 0
    assert resolved.last == {
        "result": "charged",
        "occurrence": JANUARY,
        "attempt": 0,
        "flow": flow_id,
        "operationId": "op-1",
        "responseCode": None,
        "decline": None,
        "at": rome(3, 2).timestamp(),
        "by": "ops",
    }
    assert "resolved as charged by ops" in resolved.reason
    (charged,) = world.events(schedule_id, "charged")
    assert charged["orderId"] == f"{schedule_id}00000" and charged["operationId"] == "op-1" and charged["source"] == "operator"
    told = [e for e, _ in world.engine.events(types=["schedule.charged"]) if e.body.get("schedule") == schedule_id]
    assert [event.wire()["operationId"] for event in told] == ["op-1"], "the merchant hears of the charge"

    assert world.schedules.resume(schedule_id).state is ScheduleState.ACTIVE
    world.tick()
    world.at(rome(4, 1))
    world.tick()
    world.clock.advance(60)
    world.tick()
    after = world.schedules.get(schedule_id)
    assert after.state is ScheduleState.ACTIVE and after.counts["charged"] == 2
    assert [flow.start_key.split("@")[1] for flow in world.flows()] == ["2026-04-01T07:00:00Z"], "January never again"
    assert len(world.mit.calls) == 2


def test_an_occurrence_the_gateway_shows_not_charged_is_closed_and_never_fired_again(world: World) -> None:
    schedule_id, _ = stopped_on_a_gone_flow(world)
    before = world.schedules.get(schedule_id)
    resolved = world.schedules.resolve(  # any UTC offset names the same instant
        schedule_id, "2026-01-01T09:00:00+01:00", "not_charged", operation_id="op-declined", by="ops"
    )
    assert resolved.open == [] and resolved.counts.get("charged", 0) == 0 and resolved.counts["not_charged"] == 1
    assert resolved.last == before.last, "no charge to report"
    (closed,) = world.events(schedule_id, "not charged")
    assert closed["occurrence"] == JANUARY and "never fired again" in closed["note"] and closed["by"] == "ops"
    assert closed["operationId"] == "op-declined", "the operation found at the gateway is kept"
    world.at(rome(3, 2))
    world.schedules.resume(schedule_id)
    for moment in (rome(3, 2).timestamp() + 60, rome(4, 1).timestamp(), rome(4, 1).timestamp() + 60):
        world.at(moment)
        world.tick()
    keys = [flow.start_key.split("@")[1] for flow in world.flows()]
    assert keys == ["2026-04-01T07:00:00Z"], "the next occurrence only: January is not charged again"
    assert world.schedules.get(schedule_id).counts["charged"] == 1


def test_resolve_is_refused_unless_the_flow_of_that_occurrence_is_gone(world: World) -> None:
    active = world.schedules.create(monthly(contractId="c-2"))
    with pytest.raises(OperatorError, match="is active; only an occurrence of a needs_attention schedule"):
        world.schedules.resolve(active.id, JANUARY, "charged")

    schedule_id, _ = stopped_on_a_gone_flow(world)
    with pytest.raises(OperatorError, match=rf"no open occurrence '2026-02-01T08:00:00Z'; .*gone: {JANUARY}"):
        world.schedules.resolve(schedule_id, "2026-02-01T08:00:00Z", "charged")
    with pytest.raises(OperatorError, match=rf"no open occurrence '2026-01-01T08:00:00'; did you mean `{JANUARY}`\?"):
        world.schedules.resolve(schedule_id, "2026-01-01T08:00:00", "charged")  # no offset: which instant?
    with pytest.raises(OperatorError, match="no open occurrence '1 January'"):
        world.schedules.resolve(schedule_id, "1 January", "charged")
    with pytest.raises(NotFound):
        world.schedules.resolve("s000000000000", JANUARY, "charged")
    for occurrence, outcome, operation, named, reason in [
        (JANUARY, "charge", None, "outcome", "did you mean `charged`?"),
        (JANUARY, "paid", None, "outcome", "known values: charged, not_charged"),
        ("", "charged", None, "occurrence", "at least 1 character"),
        (JANUARY, "charged", "op 1", "operationId", "pattern"),
    ]:
        with pytest.raises(InputError) as refused:
            world.schedules.resolve(schedule_id, occurrence, outcome, operation_id=operation)
        assert (refused.value.field, reason in refused.value.reason) == (named, True), refused.value
    assert world.schedules.get(schedule_id).open, "nothing was closed"

    world.mit.script["c-3"] = ["ATTN"]
    waiting = world.schedules.create(monthly(contractId="c-3"))
    world.at(rome(3, 1))
    world.tick()
    world.clock.advance(60)
    world.tick()
    stopped = world.schedules.get(waiting.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and "needs attention" in stopped.reason
    with pytest.raises(OperatorError, match=r"still exists \(needs_attention\): its own outcome decides.*retry or cancel"):
        world.schedules.resolve(waiting.id, "2026-03-01T08:00:00Z", "not_charged")
    assert world.schedules.gone(waiting.id) == [] and [a.occurrence for a in world.schedules.gone(schedule_id)] == [JANUARY]


# -- issue 23 ---------------------------------------------------------------------------------------------------


def run_days(world: World, first: float, days: int) -> None:
    """Ticks at ``first`` and every day after for ``days`` days, each followed by a look a minute later."""
    for day in range(days + 1):
        world.at(first + day * DAY)
        world.tick()
        world.clock.advance(60)
        world.tick()


def test_a_decline_without_a_response_code_is_not_retried(world: World) -> None:
    """Item 7: a decline with no response code counted as soft and was retried (a stolen card may be
    declined without one); it now stops the schedule for a person, as a hard decline does."""
    world.mit.script["c-1"] = ["NOCODE", "000"]
    record = world.schedules.create(monthly())
    run_days(world, rome(1, 1).timestamp(), 3)
    stopped = world.schedules.get(record.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION, stopped.state
    assert "no response code" in stopped.reason and "not retried" in stopped.reason
    assert len(world.mit.calls) == 1 and world.events(record.id, "retry scheduled") == []


def test_dunning_retries_are_capped_in_30_days(redis_client: redis.Redis, key_prefix: str) -> None:
    """Item 7: nothing capped retries (the card networks fine more than 15 reattempts in 30 days). With a
    cap of 3, a schedule whose charges keep declining and sometimes pass stops at the fourth retry."""
    world = make_world(redis_client, key_prefix, schedules={"retries_per_30_days": 3})
    world.mit.script["c-1"] = ["116", "116", "000", "116", "116", "116", "000"]
    record = world.schedules.create({**monthly(), "rule": {"every": "days", "interval": 1}, "dunning": [1, 2, 3]})
    run_days(world, rome(1, 1).timestamp(), 12)
    stopped = world.schedules.get(record.id)
    assert stopped.counts["retried"] == 3, stopped.counts
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and "dunning capped: 3 retries" in stopped.reason
    (capped,) = world.events(record.id, "dunning capped")
    assert "RETRIES_PER_30_DAYS" in capped["reason"]


def test_no_retry_after_too_many_declines_in_a_day(redis_client: redis.Redis, key_prefix: str) -> None:
    """Item 7: a daily schedule down for four days fires every missed occurrence (``missed: each``); all
    are declined: with a cap of 3 declines a day, none is retried."""
    world = make_world(redis_client, key_prefix, schedules={"declines_per_day": 3})
    world.mit.script["c-1"] = ["116"] * 5
    record = world.schedules.create({**monthly(), "rule": {"every": "days", "interval": 1}, "missed": "each"})
    world.at(rome(1, 1).timestamp() + 4 * DAY + 60)
    world.tick()
    world.clock.advance(60)
    world.tick()  # five declines seen; their retries are due tomorrow
    world.at(rome(1, 1).timestamp() + 5 * DAY + 60)
    world.tick()
    stopped = world.schedules.get(record.id)
    assert stopped.counts["declined"] == 5 and stopped.counts.get("retried", 0) == 0
    assert stopped.state is ScheduleState.NEEDS_ATTENTION and "dunning capped: 5 declines in the last 24 hours" in stopped.reason


def test_retries_after_a_long_pause_keep_their_spacing(world: World) -> None:
    """Item 14: paused during dunning past every retry's date, then resumed: the retries fired back to back
    (minutes apart). They now keep the delays between them (1, 3, 7 days: 2 then 4 days apart)."""
    world.mit.script["c-1"] = ["116", "116", "116", "116"]
    record = world.schedules.create(monthly())
    first = rome(1, 1).timestamp()
    run_days(world, first, 0)
    world.schedules.pause(record.id)
    resumed = first + 20 * DAY
    world.at(resumed)
    world.schedules.resume(record.id)
    for hour in range(0, 10 * 24):
        world.at(resumed + hour * 3600)
        world.tick()
    created = [flow.created for flow in world.flows()][1:]
    assert len(created) == 3
    assert created[0] == resumed and created[1] - created[0] >= 2 * DAY and created[2] - created[1] >= 4 * DAY, [
        (moment - resumed) / DAY for moment in created
    ]


def test_a_cancel_still_counts_and_tells_its_charges_in_flight(world: World) -> None:
    """Item 14: a cancel dropped its charges in flight from the schedule's counts and ``schedule.*``
    events. They are followed to their end: counted and told, never retried. (A charge not yet sent is
    not in flight: the cancel cancels its flow, test_cancel.py.)"""
    world.mit.script["c-2"] = ["116"]
    paid = world.schedules.create(monthly())
    declined = world.schedules.create(monthly(contractId="c-2"))
    world.at(rome(1, 1))
    assert world.schedules.tick() == 2  # both started; the worker has not run them yet
    by_contract = {"c-1": paid.id, "c-2": declined.id}
    # Each schedule cancelled while its charge is at the gateway (a charge not yet sent is never sent:
    # test_cancel.py).
    world.mit.during = lambda contract: world.schedules.cancel(by_contract[contract], "customer left")
    world.tick()
    world.mit.during = None
    for schedule_id in (paid.id, declined.id):
        assert world.schedules.get(schedule_id).state is ScheduleState.CANCELLED
    world.clock.advance(60)
    world.tick()
    world.at(rome(3, 1))
    world.tick()
    after_paid, after_declined = world.schedules.get(paid.id), world.schedules.get(declined.id)
    assert after_paid.counts.get("charged") == 1 and after_paid.open == [], after_paid.counts
    # The declined charge's flow had the cancel asked of it: nothing charged, so it ends cancelled, its
    # decline kept in its outcome; the schedule records the occurrence cancelled, and retries nothing.
    (declined_flow,) = [flow for flow in world.flows() if flow.state is FlowState.CANCELLED]
    assert declined_flow.outcome["operation"]["operationResult"] == "DECLINED"
    assert [event["flow"] for event in world.events(declined.id, "occurrence cancelled")] == [declined_flow.id]
    assert after_declined.open == [] and after_declined.counts.get("retried", 0) == 0 and len(world.mit.calls) == 2
    assert {after_paid.state, after_declined.state} == {ScheduleState.CANCELLED}
    told = [(event.body["schedule"], event.type) for event, _ in world.engine.events(types=SCHEDULE_TYPES)]
    assert (paid.id, "schedule.charged") in told
    assert world.schedules.store.next_due() is None, "nothing left to follow"


def test_an_occurrence_that_failed_is_charged_again_on_resume(world: World) -> None:
    """Item 14: a charge that failed for a reason other than a decline (the gateway refused it: nothing
    was charged) was dropped, and resume never charged that occurrence (nor can its flow be retried: the
    engine refuses a schedule's failed charge and says to resume the schedule). It now stays owed: resume
    charges it again, under a fresh key and order id."""
    world.mit.script["c-1"] = ["FAIL", "000"]
    record = world.schedules.create(monthly())
    run_days(world, rome(1, 1).timestamp(), 0)
    stopped = world.schedules.get(record.id)
    assert stopped.state is ScheduleState.NEEDS_ATTENTION
    world.at(rome(1, 2))
    world.schedules.resume(record.id)
    world.tick()
    world.clock.advance(60)
    world.tick()
    after = world.schedules.get(record.id)
    assert len(world.mit.calls) == 2 and after.counts.get("charged") == 1 and after.state is ScheduleState.ACTIVE
    assert [flow.start_key.split("@")[1] for flow in world.flows()] == [JANUARY, f"{JANUARY}#1"]
    assert after.last is not None and after.last["occurrence"] == JANUARY
    assert "then resume to charge it again" in stopped.reason


def test_skipping_a_week_of_a_minutely_rule_is_counted_not_walked(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 9: resuming a ``* * * * *`` schedule paused a week walked every missed occurrence (35.9 s).
    The rule is now evaluated a few times per day skipped; the count is exact."""
    import durapay.workflows.schedules.rules as rules
    from tests.workflows.schedules.test_rules import _Counted

    record = world.schedules.create({**monthly(), "rule": {"cron": "* * * * *"}, "start": "2026-06-01T10:00:00"})
    world.schedules.pause(record.id)
    world.at(rome(6, 8, hour=10).timestamp() + 30)
    monkeypatch.setattr(rules, "croniter", _Counted)
    _Counted.calls = 0
    resumed = world.schedules.resume(record.id)
    assert _Counted.calls <= 200, f"{_Counted.calls} rule evaluations"
    assert resumed.counts["skipped"] == 7 * 1440 + 1 and resumed.seq == 7 * 1440 + 1
    assert resumed.summary()["nextRun"] == "2026-06-08T08:01:00Z"


@pytest.mark.parametrize(("missed", "fired"), [("once", 1), ("skip", 60)])
def test_a_minutely_rule_down_for_a_week_catches_up_without_walking(
    world: World, monkeypatch: pytest.MonkeyPatch, missed: str, fired: int
) -> None:
    """Item 9: the scheduler's tick after a week down: ``once`` fires the latest occurrence, ``skip`` the
    last hour's; the rest is counted, not walked."""
    import durapay.workflows.schedules.rules as rules
    from tests.workflows.schedules.test_rules import _Counted

    record = world.schedules.create({**monthly(missed=missed), "rule": {"cron": "* * * * *"}, "start": "2026-06-01T10:00:00"})
    world.at(rome(6, 8, hour=10).timestamp() + 30)
    monkeypatch.setattr(rules, "croniter", _Counted)
    _Counted.calls = 0
    assert world.schedules.tick() == fired
    assert _Counted.calls <= 800, f"{_Counted.calls} rule evaluations"
    after = world.schedules.get(record.id)
    assert after.seq == 7 * 1440 + 1 and after.summary()["nextRun"] == "2026-06-08T08:01:00Z"
    keys = sorted(flow.start_key.split("@")[1] for flow in world.engine.list(kind="mit", limit=100))
    assert keys[-1] == "2026-06-08T08:00:00Z" and len(keys) == fired
    assert after.open[-1].data["order"]["orderId"] == f"{record.id}07s00", "occurrence 10080, numbered as if walked"


def test_every_order_id_fits_18_characters_and_is_unique_at_large_numbers() -> None:
    """Item 5: retries from occurrence 10 on derived ``s<12 hex>-<n>-r<k>``, 19 characters and more, past
    the gateway's 18. Every id now has 18 characters, and (schedule, occurrence, attempt) gives one id."""
    from durapay.workflows.schedules import order_id

    schedules = ["s0123456789ab", "s0123456789ac"]
    indexes = [0, 1, 9, 10, 35, 36, 99, 1295, 1296, 46655, 46656, 99_999, 36**4 - 1]
    attempts = [0, 1, 3, 9, 10, 12, 35]
    ids = {(s, n, k): order_id(s, n, k) for s in schedules for n in indexes for k in attempts}
    assert {len(value) for value in ids.values()} == {18}
    assert len(set(ids.values())) == len(ids), "one id per (schedule, occurrence, attempt)"
    assert all(value.startswith(s) for (s, _, _), value in ids.items())
    with pytest.raises(ValueError):
        order_id("s0123456789ab", 36**4, 0)
    from durapay.workflows.schedules import order_parts

    assert all(order_parts(value) == triple for triple, value in ids.items()), "read back as derived"
    assert order_parts("s0123456789ab-12-r3") == ("s0123456789ab", 12, 3) and order_parts("gym-42") is None


def test_an_order_id_limit_shorter_than_a_schedules_ids_is_refused_at_start(redis_client: redis.Redis, key_prefix: str) -> None:
    from durapay.config.settings import SettingsError

    with pytest.raises(SettingsError, match="DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH: 17 is shorter"):
        make_world(redis_client, key_prefix, gateway={"order_id_max_length": 17})


def test_a_retry_of_a_late_occurrence_has_an_order_id_the_gateway_takes(world: World) -> None:
    """Item 5 end to end: the twelfth daily occurrence is declined and retried; both order ids fit 18."""
    world.mit.script["c-1"] = ["000"] * 11 + ["116", "000"]
    record = world.schedules.create({**monthly(), "rule": {"every": "days", "interval": 1}})
    run_days(world, rome(1, 1).timestamp(), 12)
    ids = [flow.input["order"]["orderId"] for flow in world.flows()]
    assert len(ids) == 13 and {len(value) for value in ids} == {18} and len(set(ids)) == 13
    assert ids[11:] == [f"{record.id}000b0", f"{record.id}000b1"]
    assert world.schedules.get(record.id).counts["charged"] == 12


# -- a contract's frequency (item 6) ------------------------------------------------------------------------


def test_after_a_late_retry_the_next_occurrence_waits_for_the_contract(world: World) -> None:
    """The gateway refuses a charge fewer than contractFrequency days (its days, UTC+01:00) after the
    contract's last payment: January's charge, made by its 7-day retry on the 22nd, moves February's to
    the 16th (25 days later), at the rule's time of day; March's is on time again."""
    world.mit.script["c-1"] = ["116", "116", "116", "000"]
    record = world.schedules.create(monthly(15, contractFrequency=25, start="2026-01-15T09:00:00"))
    first = rome(1, 15).timestamp()
    run_days(world, first, 60)
    starts = [
        datetime.fromtimestamp(flow.created, UTC).astimezone(rome(1).tzinfo).strftime("%m-%d %H:%M") for flow in world.flows()
    ]
    assert starts == ["01-15 09:00", "01-16 09:00", "01-18 09:00", "01-22 09:00", "02-16 09:00", "03-15 09:00"], starts
    (waited,) = world.events(record.id, "waits for the contract")
    assert waited["until"] == "2026-02-16T08:00:00Z"
    assert world.schedules.get(record.id).counts["charged"] == 3


def test_a_schedules_charges_run_on_its_terminal_and_an_unknown_one_is_refused(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    world = make_world(redis_client, key_prefix, terminals={"it": {"api_key": "key-of-it"}})
    record = world.schedules.create(monthly(terminal="it"))
    assert world.schedules.get(record.id).spec.terminal == "it"
    with pytest.raises(InputError) as refused:
        world.schedules.create(monthly(contractId="c-2", terminal="fr"))
    assert (refused.value.field, refused.value.reason) == ("terminal", "unknown terminal 'fr'; known terminals: default, it")
    plain = world.schedules.create(monthly(contractId="c-3"))
    assert plain.spec.terminal is None and "terminal" not in plain.spec.dumped(), "none: not one byte more"
    world.at(rome(1))
    assert world.tick() == 2
    terminals = {flow.input["contractId"]: flow.terminal for flow in world.flows()}
    assert terminals == {"c-1": "it", "c-3": "default"}
    assert "terminal" not in next(flow for flow in world.flows() if flow.input["contractId"] == "c-1").input, (
        "not the charge's input"
    )
