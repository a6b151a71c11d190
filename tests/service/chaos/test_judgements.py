"""The chaos run's judgements without running one: the money rule on cancelled, failed and retried flows,
the report's split of the time after the last chaos event, and the seeded plans of the new events."""

from __future__ import annotations

import random
from typing import Any

import pytest

from durapay.service.chaos.campaign import APPROVED_ONLY, BACKSTOP, PEND, PENDING_OPERATIONS, SETTLE, fault_rule, plan_pending
from durapay.service.chaos.operator import CANCEL, RESOLVE, plan_operator
from durapay.service.chaos.reconcile import Findings, Ledger, check_money
from durapay.service.chaos.report import ChaosReport, flow_times, recovery
from durapay.service.chaos.stack import GATEWAY_TIMEOUT, LATE_SECONDS, LATEST_ACT_SECONDS
from durapay.service.chaos.workload import OPERATIONS
from durapay.simulator._pending import PENDABLE
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord


def flow(state: FlowState, *, outcome: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> FlowRecord:
    return FlowRecord(
        id="f1",
        kind="hpp",
        state=state,
        step="wait",
        version=3,
        attempt=0,
        created=0.0,
        updated=0.0,
        input={},
        order_id="o-1",
        orders=["o-1"],
        outcome=outcome,
        error=error,
    )


def payment(operation_id: str, order: str = "o-1", result: str = "EXECUTED") -> dict[str, Any]:
    return {"operationId": operation_id, "orderId": order, "operationType": "CAPTURE", "operationResult": result}


def refund_of(parent: str, result: str = "REFUNDED") -> dict[str, Any]:
    return {
        "operationId": f"r-{parent}",
        "orderId": "o-1",
        "operationType": "REFUND",
        "operationResult": result,
        "parentOperationId": parent,
    }


def judge(record: FlowRecord, operations: list[dict[str, Any]]) -> Findings:
    ledger = Ledger(operations)
    charges = ledger.charges(record.orders)
    findings = Findings()
    check_money(record, charges, "hpp f1 (o-1)", findings, refunded=ledger.refunded(charges))
    return findings


# -- the money rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [FlowState.CANCELLED, FlowState.FAILED])
def test_a_cancelled_or_failed_flow_with_its_money_at_the_gateway_is_a_violation(state: FlowState) -> None:
    findings = judge(flow(state, outcome={"reason": "cancelled"}), [payment("p1")])
    assert len(findings.not_reflected) == 1 and "p1" in findings.not_reflected[0], findings
    assert state.value in findings.not_reflected[0]
    assert not findings.clean


def test_a_cancelled_flow_without_money_is_fine() -> None:
    declined = payment("p1", result="DECLINED")
    assert judge(flow(FlowState.CANCELLED, outcome={"reason": "cancelled"}), [declined]).clean


def test_a_cancel_that_ended_succeeded_because_the_money_had_moved_is_fine() -> None:
    outcome = {"operation": {"operationId": "p1"}, "operationIds": ["p1"], "result": "succeeded"}
    assert judge(flow(FlowState.SUCCEEDED, outcome=outcome), [payment("p1")]).clean


def test_a_late_payment_the_operator_refunded_is_accounted_once_the_gateway_shows_the_refund() -> None:
    outcome = {"reason": "chaos", "refund": {"flow": "fr", "operationId": "p1"}}
    cancelled = flow(FlowState.CANCELLED, outcome=outcome)
    assert judge(cancelled, [payment("p1"), refund_of("p1")]).clean
    not_yet = judge(cancelled, [payment("p1"), refund_of("p1", result="FAILED")])
    assert len(not_yet.not_reflected) == 1 and "refund (flow fr)" in not_yet.not_reflected[0], not_yet


def test_a_refund_names_only_its_own_payment() -> None:
    """A refund of one payment does not account for another on the same flow."""
    outcome = {"reason": "chaos", "refund": {"flow": "fr", "operationId": "p1"}}
    findings = judge(flow(FlowState.CANCELLED, outcome=outcome), [payment("p1"), refund_of("p1"), payment("p2")])
    assert len(findings.charged_twice) == 1, findings
    assert [line.split(": ")[1].split(" ")[0] for line in findings.not_reflected] == ["p2"], findings


def test_a_late_payment_waiting_for_a_person_is_accounted_when_named() -> None:
    error = {"type": "LatePayment", "endedAs": "cancelled", "operation": {"operationId": "p1"}}
    assert judge(flow(FlowState.NEEDS_ATTENTION, error=error), [payment("p1")]).clean


def test_a_flow_stopped_because_the_gateway_could_not_tell_accounts_for_its_call() -> None:
    """Its reads failed: it cannot name an operation id it never read, and says its call may have
    taken effect (money in flight for that operation); a person's retry reads it back."""
    error = {"type": "RateLimited", "operation": "get_order", "during": "reconcile"}
    record = flow(FlowState.NEEDS_ATTENTION, error=error)
    verification = {**payment("p1"), "operationType": "CARD_VERIFICATION", "operation": "card_verification"}
    assert len(judge(record, [verification]).not_reflected) == 1, "nothing says money may be there"
    record.unsettled = {"op": "card_verification", "step": "pay", "t": 1.0}
    assert judge(record, [verification]).clean
    record.unsettled = {"op": "create_moto_order", "step": "pay", "t": 1.0}
    assert len(judge(record, [verification]).not_reflected) == 1, "in flight is another call"
    record.state = FlowState.CANCELLED
    record.unsettled = None
    assert len(judge(record, [verification]).not_reflected) == 1


def test_a_flow_retried_after_failing_owns_the_money_on_each_of_its_orders() -> None:
    record = flow(FlowState.SUCCEEDED, outcome={"operation": {"operationId": "p2"}, "operationIds": ["p2"]})
    record.orders = ["o-1", "o-1-2"]
    assert judge(record, [payment("p2", order="o-1-2")]).clean
    twice = judge(record, [payment("p1"), payment("p2", order="o-1-2")])
    assert len(twice.charged_twice) == 1, twice
    failed = flow(FlowState.FAILED, outcome={"reason": "declined"})
    failed.orders = ["o-1", "o-1-2"]
    assert len(judge(failed, [payment("p2", order="o-1-2")]).not_reflected) == 1


# -- the time after the last chaos event -----------------------------------------------------------------------


def entry(t: float, to: str) -> dict[str, Any]:
    return {"t": t, "to": to}


def test_time_spent_waiting_on_a_customer_is_not_the_engines() -> None:
    since = 100.0
    link = [entry(10, "ready"), entry(11, "running"), entry(12, "waiting"), entry(250, "running"), entry(250.5, "succeeded")]
    retried = [entry(90, "running"), entry(95, "retrying"), entry(103, "running"), entry(104, "succeeded")]
    assert flow_times(link, since) == (250.5, 150.0)
    found = recovery({"link": link, "retried": retried}, {}, since)
    assert found.engine == pytest.approx(4.0) and found.engine_flow == "retried"
    assert found.waiting == pytest.approx(150.0) and found.waiting_flow == "link"


def test_a_follow_up_of_a_payment_that_waited_does_not_count_that_wait() -> None:
    since = 100.0
    parent = [entry(50, "waiting"), entry(180, "running"), entry(181, "succeeded")]
    child = [entry(181.5, "ready"), entry(181.6, "running"), entry(182, "succeeded")]
    found = recovery({"p": parent, "c": child}, {"c": "p"}, since)
    assert found.waiting == pytest.approx(80.0)
    assert found.engine == pytest.approx(2.0) and found.engine_flow == "c"


def test_flows_done_before_the_last_event_take_no_time_and_a_timer_counts_as_waiting() -> None:
    since = 100.0
    done = [entry(10, "ready"), entry(20, "succeeded")]
    timer = [entry(95, "sleeping"), entry(120, "running"), entry(121, "succeeded")]
    found = recovery({"done": done, "timer": timer}, {}, since)
    assert found.engine == pytest.approx(1.0) and found.waiting == pytest.approx(20.0)
    assert recovery({}, {}, since).engine == 0.0


def test_the_report_prints_both_times_and_the_new_counts() -> None:
    report = ChaosReport(seed=1, duration=30, lose_last_writes=False)
    report.finished, report.recover_seconds, report.waiting_seconds, report.finished_seconds = True, 1.25, 145.0, 146.5
    report.operator = {"cancels": 3, "retries": 1, "refused": 2, "cancel_answers": {"requested": 1, "cancelled": 2}}
    report.pending = {"rules": 2, "answered": 3, "approved": 2, "declined": 1, "settled_by_run": 1}
    rows = dict(report.rows())
    assert rows["time to recover"].startswith("1.2 s") and "engine's own" in rows["time to recover"]
    assert rows["waiting on customers"].startswith("145.0 s") and "146.5 s" in rows["waiting on customers"]
    assert rows["operator"].startswith("6: 3 cancels (2 cancelled, 1 requested)") and "2 refused" in rows["operator"]
    assert rows["PENDING"].startswith("3 answered (2 approved, 1 declined")
    assert report.ok, "refusals are normal: no finding"


# -- the plans ----------------------------------------------------------------------------------------------


def test_pending_outcomes_aim_at_the_mix_and_never_decline_what_the_schedule_needs() -> None:
    assert set(PENDING_OPERATIONS) <= set(OPERATIONS) & set(PENDABLE)
    events = plan_pending(random.Random("7:pending"), 240)
    pends = [event for event in events if event.what == PEND]
    assert len(pends) == 8 and all(24 <= event.at <= 168 for event in pends)
    for event in pends:
        rule = event.detail["rule"]
        assert rule["operation"] in PENDING_OPERATIONS
        assert rule["final"] == "000" or rule["operation"] not in APPROVED_ONLY
    by_run = [event.detail["rule"]["operation"] for event in pends if event.detail["rule"]["settle_after"] == BACKSTOP]
    assert 0 < len(by_run) < len(pends), "some settle by the simulator's clock, some by the run"
    settles = [event for event in events if event.what == SETTLE]
    assert sorted(event.detail["operation"] for event in settles) == sorted(by_run)
    assert all(event.at <= 0.85 * 240 for event in settles)
    assert events == plan_pending(random.Random("7:pending"), 240), "the same seed, the same outcomes"


def test_operator_actions_are_drawn_in_the_window_from_their_own_generator() -> None:
    actions = plan_operator(random.Random("7:operator"), 240)
    assert sum(action.what == CANCEL for action in actions) == 20
    assert sum(action.what == RESOLVE for action in actions) == 8
    assert all(24 <= action.at <= 204 for action in actions)
    assert actions == sorted(actions, key=lambda action: action.at)
    assert actions == plan_operator(random.Random("7:operator"), 240)
    short = plan_operator(random.Random("11:operator"), 30)
    assert {action.what for action in short} == {CANCEL, RESOLVE}


def test_the_runs_late_window_outlasts_every_act_its_faults_can_delay() -> None:
    """The chaos stack's late window (15 s, not production's 120 s) is sound only while no fault makes its
    gateway act later: a request acts at most LATEST_ACT_SECONDS after it was sent (a latency fault; a
    hang acts first or never), past the client's timeout, and the window is five times that."""
    rules = [fault_rule(random.Random(n)) for n in range(400)]
    latencies = {rule["latency_ms"] / 1000 for rule in rules if rule["mode"] == "latency"}
    hangs = [rule for rule in rules if rule["mode"] == "hang"]
    assert latencies == {LATEST_ACT_SECONDS} and LATEST_ACT_SECONDS > GATEWAY_TIMEOUT, latencies
    assert hangs and all(rule["seconds"] > GATEWAY_TIMEOUT for rule in hangs), "a hang outlasts the client"
    assert LATE_SECONDS >= 5 * LATEST_ACT_SECONDS


def test_a_schedule_lost_with_the_aofs_tail_ends_the_wait_and_is_counted_lost() -> None:
    """Under everysec on a server that answers WAITAOF before its fsync, a cut of the AOF's tail may lose
    the run's acknowledged schedule: the run's wait asked for it and stopped with "NotFound: no schedule"
    (seed 38 under load), instead of counting it lost as it counts a flow gone from Redis."""
    from types import SimpleNamespace

    from durapay.service.chaos.run import Run
    from durapay.workflows.engine import NotFound

    class Gone:
        def get(self, schedule_id: str) -> Any:
            raise NotFound(f"no schedule {schedule_id!r}")

    run = Run.__new__(Run)
    run.schedule_id, run.schedules = "s3a311c7cb33a", Gone()
    run.workload = SimpleNamespace(started=[])  # type: ignore[assignment]
    run.report = ChaosReport(seed=38, duration=30.0, lose_last_writes=True)
    assert run._all_finished(), "a schedule gone is waited for no more"
    assert run._schedule() is None
