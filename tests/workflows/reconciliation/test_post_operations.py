"""Post-operations (captures, refunds, cancels of a capture) found by their order, not by their own id:
``GET /operations`` names no parent, so the judge must tell a capture of the order's authorization from
a second payment (``money.post_operation``), and say whose it is: a flow of durapay whose call's answer
was lost (in flight), or nobody's (an operator at the gateway: money without a flow). Never a second
payment of the order's flow, which would move a healthy flow to a late payment. And a payment given
back later (a same-day cancel of a capture) agrees with the flow that recorded it taken."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from durapay.workflows.reconciliation import IN_FLIGHT, MONEY_WITHOUT_FLOW, Reconciler, Report
from tests.workflows.flows.session_engine import session_engine, step_until
from tests.workflows.reconciliation.test_run import catch_up, moto_input

STOPPED = {FlowState.NEEDS_ATTENTION, FlowState.FAILED, FlowState.SUCCEEDED}


@pytest.fixture
def flows(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with session_engine(redis_client, key_prefix) as made:
        yield made


def run(engine: Engine, kind: str, data: dict[str, Any]) -> FlowRecord:
    record = engine.start(kind, data)
    engine.run_step(record.id, record.step, follow=8)
    return engine.get(record.id)


def show(report: Report) -> list[tuple[str, str | None, str]]:
    return [(f.category, f.flow, f.what) for f in report.findings]


def lose_the_answer(sim: SimulatorServer, operation: str) -> None:
    """The call is made at the gateway, its answer lost, and every read of it refused: the flow stops
    needing a person with the money in flight (``unsettled``)."""
    sim.admin.set_faults(mode="commit_then_fail", operation=operation, count=1, drop=True)
    refuse_reads(sim)


def refuse_reads(sim: SimulatorServer) -> None:
    for read in ("get_order", "get_operation", "list_orders"):
        sim.admin.set_faults(mode="error", operation=read, status=401, count=1000)


def lost_post(engine: Engine, sim: SimulatorServer, kind: str, operation_id: str, operation: str) -> FlowRecord:
    """A post-operation whose call the gateway made and whose answer was lost, every read refused after it
    (its reads of the payment's order, made with the order held before the call, were answered)."""
    sim.admin.set_faults(mode="commit_then_fail", operation=operation, count=1, drop=True)
    started = engine.start(kind, {"operationId": operation_id})
    engine.run_step(started.id, "post")
    refuse_reads(sim)
    stopped = step_until(engine, started.id, STOPPED, limit=30)
    assert stopped.state is FlowState.NEEDS_ATTENTION and stopped.unsettled, stopped.summary()
    sim.admin.clear_faults()
    return stopped


def test_durapay_post_operations_are_no_mismatch(flows: tuple[Engine, SimulatorServer]) -> None:
    """An authorization, its capture, the same-day cancel of that capture, a sale's partial refund, and
    the same-day cancel of a sale: every flow succeeded, nothing is wrong at the gateway."""
    engine, sim = flows
    since = engine.clock.now() - 60
    auth = run(engine, "moto", {**moto_input("auth-1"), "captureType": "EXPLICIT"})
    capture = run(engine, "capture", {"operationId": auth.outcome["operation"]["operationId"]})  # type: ignore[index]
    cancel = run(engine, "cancel_capture", {"operationId": capture.outcome["operation"]["operationId"]})  # type: ignore[index]
    sale = run(engine, "moto", moto_input("sale-1"))
    refund = run(engine, "refund", {"operationId": sale.outcome["operation"]["operationId"], "amount": "500", "currency": "EUR"})  # type: ignore[index]
    cancelled_sale = run(engine, "moto", moto_input("sale-2"))
    cancel_sale = run(engine, "cancel_capture", {"operationId": cancelled_sale.outcome["operation"]["operationId"]})  # type: ignore[index]
    for record in (auth, capture, cancel, sale, refund, cancelled_sale, cancel_sale):
        assert record.state is FlowState.SUCCEEDED, record.summary()
    report = Reconciler(engine).run(since, catch_up(engine, sim))
    assert report.ok and report.findings == [], show(report)


def test_an_operators_capture_at_the_gateway_is_money_without_a_flow(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, sim = flows
    since = engine.clock.now() - 60
    auth = run(engine, "moto", {**moto_input("auth-2"), "captureType": "EXPLICIT"})
    op = auth.outcome["operation"]  # type: ignore[index]
    engine.gateway().call(
        Catalogue.capture_operation,
        op["operationId"],
        request={"amount": op["operationAmount"], "currency": "EUR"},
        idempotency_key="k1",
    )
    report = Reconciler(engine).run(since, catch_up(engine, sim))
    assert [(f.category, f.flow, (f.operation or {}).get("operationType")) for f in report.findings] == [
        (MONEY_WITHOUT_FLOW, auth.id, "CAPTURE")
    ], show(report)
    assert engine.get(auth.id).state is FlowState.SUCCEEDED  # marked, not moved to a late payment


def test_durapays_capture_in_flight_is_in_flight_on_its_own_flow(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, sim = flows
    since = engine.clock.now() - 60
    auth = run(engine, "moto", {**moto_input("auth-3"), "captureType": "EXPLICIT"})
    capture = lost_post(engine, sim, "capture", auth.outcome["operation"]["operationId"], "capture_operation")  # type: ignore[index]
    report = Reconciler(engine).run(since, catch_up(engine, sim))
    assert [(f.category, f.flow) for f in report.findings] == [(IN_FLIGHT, capture.id)], show(report)
    assert engine.get(auth.id).state is FlowState.SUCCEEDED


def test_durapays_refund_in_flight_is_in_flight_on_its_own_flow(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, sim = flows
    since = engine.clock.now() - 60
    sale = run(engine, "moto", moto_input("sale-3"))
    refund = lost_post(engine, sim, "refund", sale.outcome["operation"]["operationId"], "refund_operation")  # type: ignore[index]
    report = Reconciler(engine).run(since, catch_up(engine, sim))
    assert [(f.category, f.flow) for f in report.findings] == [(IN_FLIGHT, refund.id)], show(report)
