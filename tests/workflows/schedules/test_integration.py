"""Schedules end to end: the simulator over HTTP, a real Celery worker, real dispatchers, a moved clock.

Acceptance of issue 5: a monthly schedule makes exactly one MIT per month over 24 months; two schedulers
at once still make one per occurrence; a scheduler stopped for three occurrences catches up by its
policy; soft declines are retried after 1, 3 and 7 days and then stop; a hard decline stops at once; a
success after a retry resumes the rule. Counts are read from the simulator's own record of payments.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from durapay.workflows.engine import InputError
from durapay.workflows.engine.keys import derived_id
from durapay.workflows.engine.states import TERMINAL
from durapay.workflows.schedules import ScheduleRecord, ScheduleState, occurrence_key, occurrences
from durapay.workflows.schedules.rules import iso
from tests.workflows.schedules.harness import Stack

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
DAY = 86400.0


def monthly(contract: str, **extra: Any) -> dict[str, Any]:
    data = {"contractId": contract, "amount": 1990, "currency": "EUR", "description": "Gym membership"}
    return {**data, "rule": {"every": "month", "day": 31}, "timezone": "Europe/Rome", "start": "2026-01-01T09:00:00", **extra}


def flow_id(record: ScheduleRecord, moment: datetime, attempt: int = 0) -> str:
    return derived_id("f", "mit", occurrence_key(record.id, iso(moment), attempt))


def finished(stack: Stack, flow: str) -> Any:
    record = stack.engine.store.get(flow)
    return record if record is not None and record.state in TERMINAL else None


def charge_at(stack: Stack, moment: float, flow: str) -> Any:
    """Move the clock to ``moment`` and wait for the scheduler to start ``flow`` and the worker to finish it."""
    stack.clock.set(moment)
    return stack.wait_until(lambda: finished(stack, flow), what=f"flow {flow} at {iso(datetime.fromtimestamp(moment, UTC))}")


def schedule_state(stack: Stack, record: ScheduleRecord, moment: float, state: ScheduleState) -> ScheduleRecord:
    stack.clock.set(moment)
    return stack.wait_until(lambda: (found := stack.schedules.get(record.id)).state is state and found, what=f"state {state}")


def test_a_monthly_schedule_makes_exactly_one_mit_a_month_over_24_months(stack: Stack) -> None:
    stack.clock.set(T0)
    record = stack.schedules.create(monthly(stack.contract(), count=24))
    stack.start_dispatchers(1)
    moments = occurrences(record.spec.calendar(), count=24)
    for moment in moments:
        assert charge_at(stack, moment.timestamp(), flow_id(record, moment)).state.value == "succeeded"
    stack.clock.set(moments[-1].timestamp() + 20 * DAY)
    done = stack.wait_until(
        lambda: (found := stack.schedules.get(record.id)).counts.get("charged") == 24 and found, what="24 charged"
    )
    payments = stack.mit_operations(record.id)
    assert len(payments) == 24 and {p["operationResult"] for p in payments} == {"EXECUTED"}
    assert len({p["orderId"] for p in payments}) == 24 and len({p["idempotencyKey"] for p in payments}) == 24
    assert done.counts["fired"] == 24 and done.state is ScheduleState.COMPLETED and done.summary()["nextRun"] is None
    assert [moment.strftime("%m-%d") for moment in moments[:4]] == ["01-31", "02-28", "03-31", "04-30"]
    stack.settle(moments[-1].timestamp() + 400 * DAY)
    assert len(stack.mit_operations(record.id)) == 24


def test_two_schedulers_at_once_still_charge_each_occurrence_once(stack: Stack) -> None:
    stack.clock.set(T0)
    contract = stack.contract()
    records = [stack.schedules.create(monthly(contract, rule={"every": "month", "day": day})) for day in range(1, 9)]
    first, second = stack.another_scheduler(batch=1), stack.another_scheduler(batch=1)  # small batches: they interleave
    stack.start_dispatchers(2, schedules=[first, second])
    for month in range(1, 7):
        stack.clock.set(datetime(2026, month, 9, tzinfo=UTC).timestamp())
        stack.wait_until(lambda month=month: len(stack.mit_operations("s")) >= 8 * month, what=f"month {month}")
    stack.settle(datetime(2026, 6, 20, tzinfo=UTC).timestamp())
    payments = stack.mit_operations("s")
    assert len(payments) == 48 and len({p["orderId"] for p in payments}) == 48
    assert all(stack.schedules.get(r.id).counts["fired"] == 6 for r in records)


def test_a_scheduler_stopped_for_three_occurrences_catches_up_by_its_policy(stack: Stack) -> None:
    stack.clock.set(T0)
    contract = stack.contract()
    schedules = {policy: stack.schedules.create(monthly(contract, missed=policy)) for policy in ("each", "once", "skip")}
    stack.start_dispatchers(1)
    january = occurrences(schedules["each"].spec.calendar(), count=5)
    for record in schedules.values():
        charge_at(stack, january[0].timestamp(), flow_id(record, january[0]))
    stack.stop_dispatchers()
    stack.clock.set(january[3].timestamp() + 2 * DAY)  # February, March and April pass with no scheduler
    stack.start_dispatchers(1)
    expected = {"each": 4, "once": 2, "skip": 1}
    for policy, record in schedules.items():
        stack.wait_until(
            lambda r=record: stack.schedules.get(r.id).summary()["nextRun"] == iso(january[4]), what=f"{policy} caught up"
        )
        stack.wait_until(lambda r=record, n=expected[policy]: len(stack.mit_operations(r.id)) == n, what=f"{policy} charges")
        (missed,) = [event for event in stack.schedules.history(record.id) if event["event"] == "missed"]
        assert missed["policy"] == policy and missed["count"] == 3
    assert [len(stack.mit_operations(r.id)) for r in schedules.values()] == [4, 2, 1]
    assert stack.schedules.get(schedules["once"].id).open[0].occurrence == iso(january[3])
    for record in schedules.values():
        charge_at(stack, january[4].timestamp(), flow_id(record, january[4]))
    assert [len(stack.mit_operations(r.id)) for r in schedules.values()] == [5, 3, 2]


def test_soft_declines_are_retried_after_1_3_and_7_days_then_the_schedule_stops(stack: Stack) -> None:
    stack.clock.set(T0)
    contract = stack.contract()
    stack.sim.admin.script_outcomes(["116", "116", "116", "116"], contract_id=contract)
    record = stack.schedules.create(monthly(contract))
    stack.start_dispatchers(1)
    first = occurrences(record.spec.calendar(), count=1)[0]
    declined = charge_at(stack, first.timestamp(), flow_id(record, first))
    assert declined.error["decline"] == "soft" and declined.error["responseCode"] == "116"
    for attempt, days in enumerate((1, 3, 7), start=1):
        retry = charge_at(stack, declined.updated + days * DAY, flow_id(record, first, attempt))
        assert retry.created == declined.updated + days * DAY and retry.state.value == "failed"
    stopped = schedule_state(stack, record, declined.updated + 8 * DAY, ScheduleState.NEEDS_ATTENTION)
    assert "dunning exhausted" in stopped.reason and stopped.counts["declined"] == 4
    payments = stack.mit_operations(record.id)
    assert [p["orderId"] for p in payments] == [f"{record.id}0000{attempt}" for attempt in range(4)]
    assert len({p["idempotencyKey"] for p in payments}) == 4
    stack.settle(declined.updated + 60 * DAY)
    assert len(stack.mit_operations(record.id)) == 4


def test_a_hard_decline_stops_the_schedule_at_once(stack: Stack) -> None:
    stack.clock.set(T0)
    contract = stack.contract()
    stack.sim.admin.script_outcomes(["208"], contract_id=contract)
    record = stack.schedules.create(monthly(contract))
    stack.start_dispatchers(1)
    first = occurrences(record.spec.calendar(), count=1)[0]
    charge_at(stack, first.timestamp(), flow_id(record, first))
    stopped = schedule_state(stack, record, first.timestamp() + 60, ScheduleState.NEEDS_ATTENTION)
    assert "hard decline (208" in stopped.reason and stopped.counts.get("retried", 0) == 0
    stack.settle(first.timestamp() + 45 * DAY)
    assert len(stack.mit_operations(record.id)) == 1


def test_a_success_after_a_retry_resumes_the_normal_rule(stack: Stack) -> None:
    stack.clock.set(T0)
    contract = stack.contract()
    stack.sim.admin.script_outcomes(["116", "000"], contract_id=contract)
    record = stack.schedules.create(monthly(contract))
    stack.start_dispatchers(1)
    first, second = occurrences(record.spec.calendar(), count=2)
    declined = charge_at(stack, first.timestamp(), flow_id(record, first))
    assert charge_at(stack, declined.updated + DAY, flow_id(record, first, 1)).state.value == "succeeded"
    schedule_state(stack, record, declined.updated + DAY + 60, ScheduleState.ACTIVE)
    assert charge_at(stack, second.timestamp(), flow_id(record, second)).state.value == "succeeded"
    payments = stack.mit_operations(record.id)
    assert [p["orderId"] for p in payments] == [f"{record.id}00000", f"{record.id}00001", f"{record.id}00010"]
    assert [p["operationResult"] for p in payments] == ["DECLINED", "EXECUTED", "EXECUTED"]


# -- a contract's frequency at the simulator (issue 23, item 6) --------------------------------------------


def charged_at(stack: Stack, moment: float, flow: str) -> Any:
    """:func:`charge_at` with the simulator's clock moved too (it counts a contract's days)."""
    stack.move(moment)
    return stack.wait_until(lambda: finished(stack, flow), what=f"flow {flow} at {iso(datetime.fromtimestamp(moment, UTC))}")


def test_a_monthly_rule_on_the_31st_against_a_contract_of_30_days(stack: Stack) -> None:
    """January 31 then February 28 is 28 days: the gateway (the simulator) refuses the second charge on a
    contract of contractFrequency 30. Told the frequency, durapay refuses the rule at creation; not told,
    it charges January and the refusal of February stops the schedule."""
    stack.move(T0)
    contract = stack.contract(frequency="30")
    with pytest.raises(InputError) as refused:
        stack.schedules.create(monthly(contract, contractFrequency=30))
    assert refused.value.field == "rule" and "28 days apart (2026-01-31 and 2026-02-28" in refused.value.reason
    record = stack.schedules.create(monthly(contract, count=2))
    stack.start_dispatchers(1)
    january, february = occurrences(record.spec.calendar(), count=2)
    assert charged_at(stack, january.timestamp(), flow_id(record, january)).state.value == "succeeded"
    second = charged_at(stack, february.timestamp(), flow_id(record, february))
    assert second.state.value == "failed" and "PS0043" in str(second.error), second.error
    stopped = schedule_state(stack, record, february.timestamp() + 60, ScheduleState.NEEDS_ATTENTION)
    assert "PS0043" in stopped.reason
    assert [p["operationResult"] for p in stack.mit_operations(record.id)] == ["EXECUTED"]


def test_dunning_retries_and_the_next_occurrence_keep_the_contracts_frequency(stack: Stack) -> None:
    """A contract of 25 days made on January 1; a schedule on the 15th from February, told the frequency.
    February is declined three times and paid by its 7-day retry on the 22nd: March 15 would be 21 days
    later, which the simulator refuses, so the schedule waits until March 19 (25 days), then April is on
    time. Every charge it starts is one the simulator takes."""
    stack.move(T0)
    contract = stack.contract(frequency="25")
    stack.sim.admin.script_outcomes(["116", "116", "116", "000"], contract_id=contract)
    record = stack.schedules.create(
        monthly(contract, rule={"every": "month", "day": 15}, start="2026-02-01T09:00:00", count=3, contractFrequency=25)
    )
    stack.start_dispatchers(1)
    february, march, april = occurrences(record.spec.calendar(), count=3)
    declined = charged_at(stack, february.timestamp(), flow_id(record, february))
    assert declined.error["decline"] == "soft"
    for attempt, days in enumerate((1, 3, 7), start=1):
        retry = charged_at(stack, declined.updated + days * DAY, flow_id(record, february, attempt))
        assert retry.state.value == ("succeeded" if attempt == 3 else "failed"), retry.error
    schedule_state(stack, record, declined.updated + 7 * DAY + 120, ScheduleState.ACTIVE)  # the charge seen
    stack.move(march.timestamp())
    stack.settle(march.timestamp() + 3600)
    assert stack.engine.store.get(flow_id(record, march)) is None, "not started: the contract does not allow it yet"
    (waited,) = [event for event in stack.schedules.history(record.id) if event["event"] == "waits for the contract"]
    allowed = datetime(2026, 3, 19, 8, tzinfo=UTC)  # 09:00 in Rome, 25 gateway days after February 22
    assert waited["until"] == iso(allowed)
    assert charged_at(stack, allowed.timestamp(), flow_id(record, march)).state.value == "succeeded"
    assert charged_at(stack, april.timestamp(), flow_id(record, april)).state.value == "succeeded"
    done = schedule_state(stack, record, april.timestamp() + 60, ScheduleState.COMPLETED)
    assert done.counts["charged"] == 3 and done.counts["declined"] == 3
    results = [p["operationResult"] for p in stack.mit_operations(record.id)]
    assert results == ["DECLINED", "DECLINED", "DECLINED", "EXECUTED", "EXECUTED", "EXECUTED"]
