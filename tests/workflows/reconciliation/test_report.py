"""What a kept report says and what follows it: the standing report the metrics and the home page show
(a newer run clears a mismatch only by reading its window again), a report's size bound (its counts
whole), and the money rule's reading of which operation a flow names (a whole id, not a substring)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from durapay.service.metrics import _reconciliation_series
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from durapay.workflows.reconciliation import MONEY_WITHOUT_FLOW, Finding, Reconciler, Report, Reports, money
from durapay.workflows.reconciliation.report import MAX_FINDINGS
from tests.workflows.flows.session_engine import session_engine
from tests.workflows.reconciliation.test_run import catch_up, pay_directly


@pytest.fixture
def flows(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with session_engine(redis_client, key_prefix) as made:
        yield made


def test_a_short_clean_run_does_not_clear_a_days_mismatch(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, sim = flows
    since = engine.clock.now() - 60
    pay_directly(engine, "stray-m")
    day = Reconciler(engine).run(since, catch_up(engine, sim), by="scheduler")
    assert not day.ok
    sim.admin.advance_clock(120)
    now = catch_up(engine, sim)
    assert Reconciler(engine).run(now - 1, now).ok  # someone checks the last second
    ok = [line for line in _reconciliation_series(engine) if line.startswith("durapay_reconciliation_ok")]
    assert ok == ["durapay_reconciliation_ok 0"]
    assert Reconciler(engine).reports.standing() == day
    # A newer run that reads the day again stands instead (here it finds the payment again).
    again = Reconciler(engine).run(since, catch_up(engine, sim))
    assert Reconciler(engine).reports.standing() == again


def test_a_kept_report_holds_a_bounded_number_of_findings(redis_client: redis.Redis, key_prefix: str) -> None:
    reports = Reports(redis_client, Keys(prefix=key_prefix), 3600)
    findings = [Finding(MONEY_WITHOUT_FLOW, f"payment {n}", operation={"operationId": str(n)}) for n in range(MAX_FINDINGS + 5)]
    report = Report(id="rec_1_a", since=0.0, until=10.0, started=10.0, finished=11.0, findings=findings)
    reports.save(report, now=11.0)
    kept = reports.get("rec_1_a")
    assert kept is not None and len(kept.findings) == MAX_FINDINGS
    # Read back (the API, the console), it still says how many lines it left out.
    assert kept.counts()[MONEY_WITHOUT_FLOW] == MAX_FINDINGS + 5 and kept.wire()["left_out"] == 5
    assert report.wire()["left_out"] == 5 and not kept.ok


def test_a_flow_names_an_operation_by_its_whole_id() -> None:
    record = FlowRecord(
        id="f1",
        kind="moto",
        state=FlowState.NEEDS_ATTENTION,
        step="pay",
        version=1,
        attempt=0,
        created=0.0,
        updated=0.0,
        input={},
        error={"type": "X", "reason": "operation 800000000000000123 was declined", "operationId": "800000000000000456"},
    )
    assert money.names(record, "800000000000000123") and money.names(record, "800000000000000456")
    assert not money.names(record, "123") and not money.names(record, "80000000000000012")
    assert money.shown(record, {"operationId": "123", "operationType": "CAPTURE"}) is None


def test_in_flight_past_the_carried_bound_is_said_and_the_report_is_not_clean(
    flows: tuple[Engine, SimulatorServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of issue 25: past MAX_CARRIED in-flight operations of one run, the rest were neither handed
    on nor said, and the report read ok. Now a gap line counts them (the report is not clean)."""
    from durapay.workflows.reconciliation import report as report_module

    engine, sim = flows
    monkeypatch.setattr(report_module, "MAX_CARRIED", 1)
    since = engine.clock.now() - 60
    sim.admin.pend("create_moto_order", count=2, final="000")
    strays = [pay_directly(engine, f"stray-pend-{letter}") for letter in "ab"]
    assert all(op["operationResult"] == "PENDING" for op in strays)
    report = Reconciler(engine).run(since, catch_up(engine, sim))
    carried = Reconciler(engine).reports.carried(now=engine.clock.now())
    assert len({op["operationId"] for op in strays} & set(carried.ids)) == 1
    assert not report.ok and any("1 operation(s) in flight are not followed" in gap for gap in report.gaps), report.gaps
