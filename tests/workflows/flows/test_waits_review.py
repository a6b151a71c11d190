"""Waiting flows under the moves an independent review of issue 22's change tried (each failed on the first
version of the change, bd43a29..6c6017a): a cancel with a PENDING payment and a notification on the record
(a hot loop of reads), a cancel while the wait step runs (the link left open to its expiry), a failure
owed by a refused read then cleared by a read that finds the customer at work, values this version does
not know (an operation's type or result, a link or form status), a link missing from its order's read, a
PENDING payment on a renewed link, a form's signals after a deadline read, a hosted page cancelled before
its wait (kept as long as its page may be paid). Real flows, the simulator over HTTP, a real Valkey."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from durapay.gateway import Catalogue, Operation, PayByLinkRenewRequest, PaymentLink
from durapay.service.receiver import NotificationReceiver
from durapay.simulator import PAGE_PAYMENT, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.compact import Compactor
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows.waits import judge_wait
from tests.workflows.flows.session_engine import context_at, engine, link_input, session_engine, step_until
from tests.workflows.flows.test_reservations_retry import DECLINE
from tests.workflows.flows.test_waits import CHALLENGE_PAN, ENDED, advance, build_input, hpp_input, link_of, link_status

__all__ = ["engine"]

Parts = tuple[Engine, SimulatorServer]


def _pending_op(record: Any, op: dict[str, Any]) -> dict[str, Any]:
    return {
        "orderId": record.order_id,
        "operationId": op["operationId"],
        "operationType": "AUTHORIZATION",
        "operationResult": "PENDING",
    }


def test_a_cancel_with_a_pending_payment_and_its_notification_reads_once_not_in_a_loop(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, sim = engine
    started = flows.start("hpp", hpp_input("r1-hpp-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.pend(PAGE_PAYMENT, final="000")
    op = sim.admin.complete_hpp(waiting.order_id)  # an APM: PENDING
    assert op["operationResult"] == "PENDING"
    flows.cancel(started.id)  # the merchant cancels; a request: the step reads first
    flows.run_step(started.id, "payment")
    after_cancel = flows.get(started.id)
    assert after_cancel.state is FlowState.WAITING, after_cancel.summary()  # PENDING: reads on (fine)
    # The gateway's PENDING notification lands now (notifications may come late / out of order).
    flows.signal(started.id, "notification", {"operation": _pending_op(waiting, op)}, by="notification")
    t0 = flows.clock.now()
    runs = 0
    for _ in range(30):
        record = flows.get(started.id)
        if record.state is not FlowState.READY:
            break
        flows.run_step(started.id, "payment")  # no clock move at all
        runs += 1
    record = flows.get(started.id)
    [o for o in flows.history(started.id) if "read" in str(o.get("what", ""))]
    assert runs <= 1, (
        f"hot loop: {runs} runs of the wait step with the clock still at {flows.clock.now() - t0:.0f}s; "
        f"state now {record.state}, due {record.due - flows.clock.now() if record.due else None}; "
        f"signals still on record: {[s.name for s in record.signals]}"
    )


def test_a_link_cancel_with_a_pending_payment_reads_once_not_in_a_loop(engine: Parts) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("r1-pbl-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.pend(PAGE_PAYMENT, final="000")
    op = sim.admin.complete_link(link_of(waiting))
    assert op["operationResult"] == "PENDING"
    flows.signal(started.id, "notification", {"operation": _pending_op(waiting, op)}, by="notification")
    flows.cancel(started.id)  # lands before a worker ran the resumed step
    runs = 0
    for _ in range(30):
        record = flows.get(started.id)
        if record.state is not FlowState.READY:
            break
        flows.run_step(started.id, "payment")
        runs += 1
    record = flows.get(started.id)
    assert runs <= 1, (
        f"hot loop: {runs} runs with no time passing; state {record.state}; signals on record: {[s.name for s in record.signals]}"
    )


def test_a_cancel_while_the_wait_step_runs_closes_the_link_at_once(engine: Parts) -> None:
    flows, _sim = engine
    started = flows.start("paybylink", link_input("r9-pbl-1"))
    flows.run_step(started.id, "create")
    record = flows.get(started.id)
    assert record.step == "payment" and record.state is FlowState.READY, record.summary()
    claim = flows.protocol.claim(started.id, "payment", worker="w1")  # a worker runs the wait step
    answered = flows.cancel(started.id)  # the merchant cancels meanwhile
    assert answered.cancel_requested
    flows.protocol._run_claimed(claim, None, inline=False)
    after = flows.get(started.id)
    status = link_status(flows, link_of(after))
    due_in = (after.due - flows.clock.now()) / 86400 if after.due else None
    assert status == "CANCELLED" or after.due - flows.clock.now() < 3600, (
        f"flow {after.state} cancel_requested={after.cancel_requested}, next run in {due_in:.1f} days; link {status}"
    )


def test_a_refused_read_at_the_form_deadline_does_not_later_cancel_a_completed_form(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, sim = engine
    started = flows.start("build", {**build_input("r2-form-1", version="3"), "formSeconds": 60})
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    assert sim.admin.fill_build_form(session, pan=CHALLENGE_PAN, complete_gdi=False) == "GDI_VERIFICATION"
    advance(flows, sim, 61)
    sim.admin.set_faults(mode="error", status=400, operation="build_state", count=1)  # one refused read
    flows.run_step(started.id, "form")
    owed = flows.get(started.id)
    assert owed.state is FlowState.RETRYING and owed.ending, owed.summary()
    flows.run_step(started.id, "form")  # the settle read: customer still at the 3DS step -> reads on
    still = flows.get(started.id)
    assert still.state is FlowState.WAITING, still.summary()
    # The customer passes 3DS; the merchant's page says the form is complete.
    assert sim.admin.complete_build_gdi(session) == "READY_FOR_PAYMENT"
    flows.signal(started.id, "form_completed", {})
    done = step_until(flows, started.id, ENDED)
    state = flows.gateway().call(Catalogue.build_state, request={"sessionId": session})
    assert done.state is FlowState.SUCCEEDED, (
        f"{done.state}: {done.summary()}; durapay's own call left the session {state.state} "
        f"op={state.operation.operationResult if state.operation else None}; history: "
        + " | ".join(str(e.get("what")) for e in flows.history(started.id)[-6:])
    )


@pytest.mark.parametrize("field,value", [("result", "SETTLED"), ("operation_type", "SALE")])
def test_an_hpp_payment_with_a_value_durapay_does_not_know_never_ends_failed(
    engine: tuple[Engine, SimulatorServer], field: str, value: str
) -> None:
    flows, sim = engine
    started = flows.start("hpp", hpp_input(f"r3-{field}"[:18]))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    paid = sim.admin.complete_hpp(waiting.order_id)  # the customer pays (EXECUTED/AUTHORIZED)
    assert paid["operationResult"] in {"EXECUTED", "AUTHORIZED"}
    # The gateway reports it with a value this version does not know (a new result, or a new type).
    setattr(sim.simulator.state.operations[paid["operationId"]], field, value)
    advance(flows, sim, 601)  # its notification was lost; the deadline read decides
    done = step_until(flows, started.id, ENDED)
    assert done.state is not FlowState.FAILED, (
        f"{done.state} ({(done.outcome or {}).get('reason')}), unsettled={done.unsettled}: the gateway holds "
        f"operation {paid['operationId']} ({field}={value}) on the order"
    )


def test_a_paid_link_whose_payment_result_is_unknown_never_ends_failed_on_an_earlier_decline(
    engine: tuple[Engine, SimulatorServer],
) -> None:

    flows, sim = engine
    started = flows.start("paybylink", link_input("r3-pbl-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    link = link_of(waiting)
    sim.admin.complete_link(link, pan="4349940199997007")  # declined: the link is FAILED
    later = (sim.admin.now() + timedelta(days=10)).date().isoformat()
    renewal = flows.start("paybylink_renew", {"linkId": link, "expirationDate": later})  # reopens it
    assert step_until(flows, renewal.id, ENDED).state is FlowState.SUCCEEDED
    paid = sim.admin.complete_link(link)  # the customer pays: the link is PAID
    sim.simulator.state.operations[paid["operationId"]].result = "SETTLED"  # a result durapay does not know
    assert str(flows.gateway().call(Catalogue.get_paybylink, link).paymentLink.status) == "PAID"
    done = step_until(flows, started.id, ENDED)
    assert done.state is not FlowState.FAILED, (
        f"{done.state} ({(done.outcome or {}).get('reason')}) with the link PAID by {paid['operationId']}"
    )


def test_a_link_flow_whose_order_read_shows_no_link_reads_the_link(engine: Parts) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("r4-pbl-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    later = (sim.admin.now() + timedelta(days=30)).date().isoformat()
    renewal = flows.start("paybylink_renew", {"linkId": link_of(waiting), "expirationDate": later})
    assert step_until(flows, renewal.id, ENDED).state is FlowState.SUCCEEDED  # tells the holder: link_changed
    sim.admin.set_faults(mode="error", status=404, operation="get_order", count=1)  # one read finds no order
    done = step_until(flows, started.id, ENDED | {FlowState.WAITING}, limit=3)
    if done.state is FlowState.WAITING:
        flows.run_step(started.id, "payment")
        done = flows.get(started.id)
    assert done.state is not FlowState.FAILED, (
        f"{done.state}: {(done.outcome or {}).get('reason')} / {done.outputs.get('payment')}; "
        f"link is {link_status(flows, link_of(waiting))}"
    )


def test_a_pending_payment_on_a_renewed_link_is_read_to_the_renewed_horizon(engine: Parts) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("r6-pbl-1"))  # expires in 3 days
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    later = (sim.admin.now() + timedelta(days=60)).date().isoformat()
    renewal = flows.start("paybylink_renew", {"linkId": link_of(waiting), "expirationDate": later})
    assert step_until(flows, renewal.id, ENDED).state is FlowState.SUCCEEDED
    flows.run_step(started.id, "payment")  # link_changed: waits to the new expiry
    assert flows.get(started.id).state is FlowState.WAITING
    advance(flows, sim, 20 * 86400)  # day 20: the link is open until day 60
    sim.admin.pend(PAGE_PAYMENT, final="000")
    op = sim.admin.complete_link(link_of(waiting))
    assert op["operationResult"] == "PENDING"
    pending = {
        "orderId": waiting.order_id,
        "operationId": op["operationId"],
        "operationType": "AUTHORIZATION",
        "operationResult": "PENDING",
    }
    flows.signal(started.id, "notification", {"operation": pending}, by="notification")
    flows.run_step(started.id, "payment")
    now = flows.get(started.id)
    assert now.state is FlowState.WAITING, f"{now.state}: {now.error}; {[e.get('what') for e in flows.history(started.id)[-1:]]}"


def test_a_form_in_a_state_durapay_does_not_know_is_never_cancelled(engine: Parts) -> None:
    flows, sim = engine
    started = flows.start("build", {**build_input("r7-form-1", version="3"), "formSeconds": 60})
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    assert sim.admin.fill_build_form(session, pan=CHALLENGE_PAN, complete_gdi=False) == "GDI_VERIFICATION"
    # The gateway reports a state this version does not know (say, a new step of the customer's 3DS).
    sim.simulator.state.build_sessions[session].state = "CHALLENGE_IN_PROGRESS"
    advance(flows, sim, 61)
    flows.run_step(started.id, "form")
    record = flows.get(started.id)
    calls = [e.get("what") for e in flows.history(started.id)[-2:]]
    state = flows.gateway().call(Catalogue.build_state, request={"sessionId": session})
    assert state.operation is None, (
        f"durapay cancelled the customer's session: now {state.state} / {state.operation.operationResult}; "
        f"flow {record.state}: {calls}"
    )


@pytest.fixture
def short_engine(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with session_engine(redis_client, key_prefix, retention_days=0.25) as made:
        yield made


def test_a_hosted_page_cancelled_before_its_wait_is_kept_while_its_page_may_be_paid(
    short_engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, _sim = short_engine
    started = flows.start("hpp", hpp_input("r8-hpp-1"))
    flows.run_step(started.id, "create")  # the page exists; its URL is given to the customer
    flows.cancel(started.id)
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.CANCELLED, done.summary()
    Compactor(flows.redis, flows.keys, flows.orders, tell=flows.tell_holder, delay=0.0).run(
        now=flows.clock.now() + 1
    )  # the dispatcher's pass
    ttl = flows.redis.ttl(flows.keys.flow(started.id))
    assert ttl >= 86400, f"kept {ttl / 3600:.1f} h (keep_until={done.keep_until}); the page can be paid for 24 h"


def test_form_completed_after_the_deadline_read_is_heard(engine: Parts) -> None:
    flows, sim = engine
    started = flows.start("build", {**build_input("r10-form-1", version="3"), "formSeconds": 60})
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    assert sim.admin.fill_build_form(session, pan=CHALLENGE_PAN, complete_gdi=False) == "GDI_VERIFICATION"
    advance(flows, sim, 61)
    flows.run_step(started.id, "form")
    still = flows.get(started.id)
    assert still.state is FlowState.WAITING
    advance(flows, sim, 30)
    assert sim.admin.complete_build_gdi(session) == "READY_FOR_PAYMENT"  # the customer finished, at 91 s
    told = flows.signal(started.id, "form_completed", {})
    done = step_until(flows, started.id, ENDED | {FlowState.WAITING}, limit=3)
    if done.state is FlowState.WAITING:  # not woken: the next read comes at its pace; the gateway's clock moves too
        advance(flows, sim, done.due - flows.clock.now() + 1)
        done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, (
        f"form_completed was {told!r}; flow {done.state}: {(done.outcome or {}).get('reason')}"
    )


def test_an_unknown_link_status_is_not_taken_as_closed_after_a_decline() -> None:
    ctx = context_at(now=1_000_000.0, created=999_000.0)
    declined = Operation.model_validate(
        {"operationId": "1", "orderId": "o", "operationType": "AUTHORIZATION", "operationResult": "DECLINED"}
    )
    link = PaymentLink.model_validate({"linkId": "L1", "status": "SUSPENDED", "expirationDate": "2099-01-01"})
    outcome = judge_wait(ctx, ("notification",), [declined], [link], ends=999_500.0)
    assert type(outcome).__name__ != "Finish", f"{outcome!r}"


def test_a_success_notification_does_not_hide_a_payment_on_the_earlier_order(engine: tuple[Engine, SimulatorServer]) -> None:
    """Review of this stop's waits: a retried pay-by-link flow (new order -2); its first link, renewed at
    the gateway, is paid and that notification is lost; the new link is paid and notified. The notified
    success went round the earlier-order rule (only the reads applied it): invariants 1 and 4."""
    flows, sim = engine
    far = (datetime.now(UTC) + timedelta(days=10)).date().isoformat()
    started = flows.start("paybylink", {**link_input("rv-early-1"), "expirationDate": far})
    first = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.complete_link(link_of(first), pan=DECLINE)
    assert step_until(flows, started.id, ENDED).state is FlowState.FAILED
    flows.retry(started.id)
    second = step_until(flows, started.id, {FlowState.WAITING})
    assert second.order_id != first.order_id
    later = (sim.admin.now() + timedelta(days=20)).date().isoformat()
    flows.gateway().call(Catalogue.renew_paybylink, link_of(first), request=PayByLinkRenewRequest(expirationDate=later).wire())
    early = sim.admin.complete_link(link_of(first))  # its notification is lost
    paid = sim.admin.complete_link(link_of(second))
    (note,) = [n for n in sim.admin.notifications() if n["body"]["operation"]["operationId"] == paid["operationId"]]
    assert NotificationReceiver(flows, flows.settings.receiver).receive(json.dumps(note["body"]).encode()).status == 200
    done = step_until(flows, started.id, ENDED)
    shown = json.dumps([done.outcome, done.error, done.outputs.get("payment")])
    shown += json.dumps(done.fields, default=str)
    assert early["operationId"] in shown, (done.state, done.summary())
