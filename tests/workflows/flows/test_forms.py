"""An embedded form (``build``) whose customer is still at work on the gateway's side (an APM page, a 3DS
step) is never ended ``failed`` or ``cancelled`` while they can still pay on it, whichever step the flow
is at: the form wait after ``form_completed`` (which proves nothing), or a finalize or confirm the gateway
refuses for it (an independent review: the flow failed within two minutes, or was cancelled with the form
left open, and the customer then paid). Real flows on a manual clock, the simulator over HTTP, a real Valkey.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.service.receiver import NotificationReceiver
from durapay.simulator import SimulatorAdminError, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.session_engine import engine, step_until
from tests.workflows.flows.test_waits import CHALLENGE_PAN, ENDED, advance, build_input

__all__ = ["engine"]

Parts = tuple[Engine, SimulatorServer]


def apm_build_input(order_id: str, version: str) -> dict[str, Any]:
    data = build_input(order_id, version)
    data["paymentSession"] = {**data["paymentSession"], "paymentService": "PAYPAL"}
    return data


def form_state(flows: Engine, session: str) -> Any:
    return flows.gateway().call(Catalogue.build_state, request={"sessionId": session})


def deliver(flows: Engine, sim: SimulatorServer, operation_id: str) -> None:
    """The gateway's notifications of ``operation_id``, as the receiver takes them."""
    receiver = NotificationReceiver(flows, flows.settings.receiver)
    for note in sim.admin.notifications():
        if note["body"]["operation"]["operationId"] == operation_id:
            assert receiver.receive(json.dumps(note["body"]).encode()).status == 200


def run_due(flows: Engine, sim: SimulatorServer, flow_id: str, seconds: float) -> Any:
    """Let ``seconds`` pass on both clocks, running every step that falls due; the record afterwards."""
    until = flows.clock.now() + seconds
    for _ in range(20):
        record = flows.get(flow_id)
        if record.state in ENDED or record.due is None or record.due > until:
            break
        if record.due > flows.clock.now():
            advance(flows, sim, record.due - flows.clock.now() + 0.001)
        flows.run_step(flow_id, record.step)
    advance(flows, sim, max(0.0, until - flows.clock.now()))
    return flows.get(flow_id)


@pytest.mark.parametrize("version", ["3", "2"])
def test_form_completed_while_the_customer_is_on_an_apm_page_waits_for_their_payment(engine: Parts, version: str) -> None:
    flows, sim = engine
    started = flows.start("build", apm_build_input(f"apm-done-{version}", version))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    assert form_state(flows, session).state == "REDIRECTED_TO_EXTERNAL_DOMAIN"
    flows.signal(started.id, "form_completed", {})  # the merchant's page: proves nothing
    later = run_due(flows, sim, started.id, 200)  # past late_seconds (120 s) after the create
    assert later.state is FlowState.WAITING, (
        f"the customer is on the APM page and can still pay, yet the flow is {later.state}: {(later.outcome or {}).get('reason')}"
    )
    assert later.unsettled is not None, "the form is open: money in flight"
    # The customer pays on the APM page; the gateway's notification ends the wait.
    assert sim.admin.fill_build_form(session) == "PAYMENT_COMPLETE"
    paid = [op for op in sim.admin.operations(order_id=later.order_id) if op["operationResult"] == "EXECUTED"]
    assert paid, "the customer paid on the APM page"
    deliver(flows, sim, paid[-1]["operationId"])
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid[-1]["operationId"]


def test_a_cancel_after_form_completed_on_an_apm_page_closes_the_form_first(engine: Parts) -> None:
    flows, sim = engine
    started = flows.start("build", apm_build_input("apm-cancel-1", "3"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    flows.signal(started.id, "form_completed", {})
    flows.run_step(started.id, flows.get(started.id).step)
    advance(flows, sim, 200)  # more than late_seconds after the create
    flows.cancel(started.id, "operator cancel")
    done = step_until(flows, started.id, ENDED)
    closed = form_state(flows, session)
    assert done.state is FlowState.CANCELLED, done.summary()
    assert closed.state == "PAYMENT_COMPLETE" and closed.operation is not None, f"the form was left {closed.state}"
    assert closed.operation.operationResult in {"CANCELED", "CANCELLED"}, closed.operation
    with pytest.raises(SimulatorAdminError):
        sim.admin.fill_build_form(session)  # the customer can no longer pay on it
    paid = [op for op in sim.admin.operations(order_id=done.order_id) if op["operationResult"] in {"AUTHORIZED", "EXECUTED"}]
    assert not paid, paid


def _finalize_while_at_3ds(flows: Engine, sim: SimulatorServer, order_id: str) -> tuple[Any, str]:
    """``form_completed`` while nothing is entered yet sends the flow on to finalize; before it runs, the
    customer enters a card that asks for 3DS (version 3: ``GDI_VERIFICATION``, at work on the gateway's
    side). The flow, ready at finalize."""
    started = flows.start("build", build_input(order_id, "3"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    flows.signal(started.id, "form_completed", {})
    flows.run_step(started.id, "form")
    at_finalize = flows.get(started.id)
    assert at_finalize.state is FlowState.READY and at_finalize.step == "finalize", at_finalize.summary()
    assert sim.admin.fill_build_form(session, pan=CHALLENGE_PAN, complete_gdi=False) == "GDI_VERIFICATION"
    return at_finalize, session


def test_a_finalize_refused_while_the_customer_is_at_3ds_waits_for_them_not_fails(engine: Parts) -> None:
    flows, sim = engine
    started, session = _finalize_while_at_3ds(flows, sim, "gdi-finalize-1")
    flows.run_step(started.id, "finalize")  # refused: the session is not READY_FOR_PAYMENT
    later = run_due(flows, sim, started.id, 200)
    assert later.state is FlowState.WAITING, f"{later.state}: {(later.outcome or {}).get('reason')}"
    assert later.unsettled is not None
    assert form_state(flows, session).state == "GDI_VERIFICATION"
    flows.cancel(started.id, "operator cancel")
    done = step_until(flows, started.id, ENDED)
    closed = form_state(flows, session)
    assert done.state is FlowState.CANCELLED, done.summary()
    assert closed.state == "PAYMENT_COMPLETE" and closed.operation is not None, f"the form was left {closed.state}"


def test_a_cancel_at_finalize_while_the_customer_is_at_3ds_closes_the_form_first(engine: Parts) -> None:
    flows, sim = engine
    started, session = _finalize_while_at_3ds(flows, sim, "gdi-cancel-1")
    advance(flows, sim, 200)
    flows.cancel(started.id, "operator cancel")  # finalize only reads now (the form is open: money in flight)
    done = step_until(flows, started.id, ENDED)
    closed = form_state(flows, session)
    assert done.state is FlowState.CANCELLED, done.summary()
    assert closed.state == "PAYMENT_COMPLETE" and closed.operation is not None, f"the form was left {closed.state}"
