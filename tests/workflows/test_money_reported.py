"""Money the gateway reports always shows in the flow: ``succeeded``, or ``needs_attention`` naming it.

A notification of a payment can arrive at any moment: while the flow waits, while a step runs (the
deadline read), after a cancel request, after the flow ended, for an earlier order of the flow. Each
test delivers it at one of those moments (a real Valkey, scripted steps, a manual clock) and checks
where the flow ends, and that a cancel request is used once, not again after an operator's retry.
"""

from __future__ import annotations

from typing import Any

import pytest

from durapay.gateway import Catalogue, GatewayUnreachable
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome, Retry
from durapay.tasks.runner import NOT_COMMITTED, UNCLEAR, StepContext
from durapay.workflows.engine import Claim
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.errors import OperatorError
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition, WaitStep
from durapay.workflows.engine.store import Change, MoneyTaken
from durapay.workflows.flows._common import summarize
from tests.workflows.engine_support import DemoInput, HeldGateway, ScriptedStep, flow, wait_step

PAID = {"operation": {"operationId": "op-9", "orderId": "ord-1", "operationResult": "AUTHORIZED", "amount": "500"}}
OTHER = {"operation": {**PAID["operation"], "operationId": "op-10"}}
DECLINED = {"operation": {**PAID["operation"], "operationResult": "DECLINED"}}


def paid_on(signal: str, payload: dict[str, Any]) -> Outcome:
    operation = payload.get("operation") or {}
    if operation.get("operationResult") in {"AUTHORIZED", "EXECUTED"}:
        return Advance({"operation": operation})
    return Finish(False, f"payment {operation.get('operationResult')}")


def racing_wait(deliver: Any) -> WaitStep:
    """A wait whose deadline read runs while ``deliver(ctx)`` reports the payment, then finds nothing."""

    def at_deadline(ctx: StepContext) -> Outcome:
        deliver(ctx)
        return Finish(False, "no payment by the deadline", error={"type": "Expired"})

    return WaitStep(
        "customer",
        ("paid",),
        on_signal=lambda ctx, name, payload: paid_on(name, payload),
        on_deadline=at_deadline,
        timeout=lambda ctx: 100.0,
    )


def test_a_payment_reported_during_the_deadline_read_ends_succeeded(make_engine: Any, clock: ManualClock) -> None:
    engines: list[Any] = []
    engine, _ = make_engine(flow(racing_wait(lambda ctx: engines[0].signal(ctx.flow_id, "paid", PAID))))
    engines.append(engine)
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "customer") == "waiting"
    clock.advance(101)
    outcome = engine.run_step(record.id, "customer")
    assert outcome == "ready", "the reported payment is read before the flow may fail"
    assert engine.run_step(record.id, "customer") == "succeeded"
    assert engine.get(record.id).outputs["customer"]["operation"]["operationId"] == "op-9"


def test_a_payment_reported_while_a_cancel_is_pending_needs_a_person(make_engine: Any, clock: ManualClock) -> None:
    engines: list[Any] = []

    def report_then_cancel(ctx: StepContext) -> None:
        engines[0].signal(ctx.flow_id, "paid", PAID)
        engines[0].cancel(ctx.flow_id, "customer gave up")

    engine, _ = make_engine(flow(racing_wait(report_then_cancel)))
    engines.append(engine)
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "customer")
    clock.advance(101)
    assert engine.run_step(record.id, "customer") == "needs_attention"
    stopped = engine.get(record.id)
    assert stopped.error is not None and stopped.error["type"] == "LatePayment"
    assert stopped.error["operation"]["operationId"] == "op-9"


def test_a_payment_reported_after_the_flow_failed_needs_a_person(make_engine: Any, clock: ManualClock) -> None:
    engine, _ = make_engine(flow(wait_step()), client_factory=HeldGateway)
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "customer")
    clock.advance(101)
    assert engine.run_step(record.id, "customer") == "failed", "no payment by the deadline"
    assert engine.signal(record.id, "paid", DECLINED) == "finished", "only money taken needs a person"
    assert engine.signal(record.id, "paid", PAID) == "late_payment"
    late = engine.get(record.id)
    assert late.state is FlowState.NEEDS_ATTENTION and late.error is not None
    assert late.error["type"] == "LatePayment" and late.error["operation"]["operationId"] == "op-9"
    assert engine.redis.ttl(engine.keys.flow(record.id)) == -1, "kept until a person acts"
    engine.retry(record.id)  # the operator accepts the payment: the waiting step takes the notification
    assert engine.run_step(record.id, "customer") == "succeeded"
    assert engine.get(record.id).outputs["customer"]["operation"]["operationId"] == "op-9"


def test_a_second_payment_reported_for_a_succeeded_flow_needs_a_person(make_engine: Any, clock: ManualClock) -> None:
    """The flow's outcome names the payments it made (every flow kind's summary lists ``operationIds``)."""
    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (wait_step(),), summarize))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "customer")
    engine.signal(record.id, "paid", PAID)
    assert engine.run_step(record.id, "customer") == "succeeded"
    assert engine.signal(record.id, "paid", PAID) == "finished", "its own payment, repeated"
    assert engine.signal(record.id, "paid", OTHER) == "late_payment"
    doubled = engine.get(record.id)
    assert doubled.state is FlowState.NEEDS_ATTENTION and doubled.error is not None
    assert doubled.error["type"] == "LatePayment" and doubled.error["endedAs"] == "succeeded"
    assert doubled.error["operation"]["operationId"] == "op-10"


def test_a_cancel_is_applied_once_not_again_after_an_operators_retry(make_engine: Any, clock: ManualClock) -> None:
    """Cancelled while a step ran; the customer's payment arrives later; the operator accepts it."""
    engine, _ = make_engine(flow(wait_step()), client_factory=HeldGateway)
    record = engine.start("demo", {"amount": 5})
    assert isinstance(engine.claim(record.id, "customer"), Claim)
    engine.cancel(record.id, "changed my mind")
    clock.advance(31)
    assert engine.run_step(record.id, "customer") == "cancelled"
    assert engine.signal(record.id, "paid", PAID) == "late_payment"
    engine.retry(record.id)
    assert not engine.get(record.id).cancel_requested
    assert engine.run_step(record.id, "customer") == "succeeded"


def test_a_cancel_requested_during_a_step_that_stops_for_a_person_is_not_applied_after_retry(make_engine: Any) -> None:
    step = ScriptedStep("pay", outcomes=[Advance({"paid": True})])
    engine, _ = make_engine(flow(step))
    record = engine.start("demo", {"amount": 5})
    claim = engine.claim(record.id, "pay")
    assert isinstance(claim, Claim)
    engine.cancel(record.id)
    assert engine.complete(claim, Attention("unclear")) == "needs_attention"
    engine.retry(record.id)  # the operator decides the payment goes on after all
    assert engine.run_step(record.id, "pay") == "succeeded"


def test_a_late_payment_is_closed_by_a_refund_flow_not_by_a_plain_cancel(make_engine: Any) -> None:
    """A plain cancel cannot close a LatePayment (the kept notification would be money unaccounted): it is
    refused, naming the ways to close it; ``refund_late_payment`` starts a refund of the reported operation and
    leaves the flow to a person until that refund succeeded (``test_late_payments`` follows it to the
    gateway and back). Asking twice refunds once; no accept meanwhile."""
    from durapay.workflows.engine import OperatorError
    from durapay.workflows.engine.keys import derived_id
    from durapay.workflows.flows.backoffice import REFUND
    from durapay.workflows.late_payments import refund_key

    engine, _ = make_engine(flow(wait_step()), client_factory=HeldGateway)  # the refund's read: still held
    engine.registry["refund"] = REFUND
    record = engine.start("demo", {"amount": 5})
    engine.cancel(record.id, "changed my mind")
    assert engine.signal(record.id, "paid", PAID) == "late_payment"
    with pytest.raises(OperatorError, match="refund-late-payment"):
        engine.cancel(record.id, "just close it")  # refused: workflows/engine/operator_actions.py
    assert engine.get(record.id).state is FlowState.NEEDS_ATTENTION
    under_way = engine.refund_late_payment(record.id, "customer asked")
    assert under_way.state is FlowState.NEEDS_ATTENTION, "closed only once the refund succeeded"
    refund = engine.get(derived_id("f", "refund", refund_key(record.id, "op-9")))
    assert refund.kind == "refund" and refund.input["operationId"] == "op-9"
    assert engine.refund_late_payment(record.id).state is FlowState.NEEDS_ATTENTION
    assert len(engine.list(kind="refund")) == 1, "asked twice, one refund"
    with pytest.raises(OperatorError, match="being refunded"):
        engine.retry(record.id)


def test_a_read_that_fails_every_attempt_after_the_charge_moved_money_stops_for_a_person(make_engine: Any) -> None:
    """A charge answered EXECUTED (its money in flight settled by that answer), then its read-back fails
    until ``max_attempts``: the retry policy's verdict is ``failed`` (``RetryPolicy.on_error``), which the
    flow used to take although the gateway had taken the money. transition.lua keeps such a flow
    (``money_moved``) for a person, whose retry reads the gateway and ends it by its word."""
    executed = {**PAID["operation"], "operationType": "DELAY_CHARGE", "operationResult": "EXECUTED"}
    charge = ScriptedStep("charge", outcomes=[Advance({"operation": executed})], op=Catalogue.create_delay_charge)
    result = ScriptedStep("result", op=Catalogue.get_operation)
    engine, _ = make_engine(flow(charge, result))
    policy = engine.retry_policy
    refused = GatewayUnreachable("get_operation: connection refused")
    gave_up = policy.on_error(refused, Catalogue.get_operation, policy.max_attempts, resend=False)
    assert isinstance(gave_up, Finish) and not gave_up.succeeded, "the policy gives up on the read"
    result.outcomes.append(gave_up)
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "charge") == "ready"
    assert engine.run_step(record.id, "result") == "needs_attention"
    stopped = engine.get(record.id)
    assert stopped.error is not None and stopped.error["type"] == "MoneyMoved"
    assert stopped.error["operation"]["operationId"] == "op-9" and "failed 3 times" in stopped.error["reason"]
    assert not (stopped.outcome or {}).get("result"), "no outcome says failed"
    engine.retry(record.id)
    assert engine.run_step(record.id, "result") == "succeeded", "the read, answered now, ends it"


def test_a_flow_whose_charge_moved_money_is_not_cancelled_while_its_read_back_retries(
    make_engine: Any, clock: ManualClock
) -> None:
    """The charge answered EXECUTED (money in flight settled by that answer); its read-back is retrying.
    A cancel now would end the flow ``cancelled`` over money the gateway took: refused, by the one rule
    of transition.lua (``money_moved``), whether asked directly or met as a request at the step's end."""
    executed = {**PAID["operation"], "operationType": "DELAY_CHARGE", "operationResult": "EXECUTED"}
    charge = ScriptedStep("charge", outcomes=[Advance({"operation": executed})], op=Catalogue.create_delay_charge)
    result = ScriptedStep("result", op=Catalogue.get_operation)
    engine, _ = make_engine(flow(charge, result))
    refused = GatewayUnreachable("get_operation: connection refused")
    result.outcomes.append(engine.retry_policy.on_error(refused, Catalogue.get_operation, 1, resend=False))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "charge") == "ready"
    assert engine.run_step(record.id, "result") == "retrying"
    assert "cancel" not in engine.actions(engine.get(record.id)), "not offered"
    with pytest.raises(OperatorError, match="op-9"):
        engine.cancel(record.id, "changed my mind")
    assert engine.get(record.id).state is FlowState.RETRYING
    # The store's own rule, under the operator's check (a cancel that raced the charge's answer):
    with pytest.raises(MoneyTaken):
        engine.store.transition(
            engine.get(record.id), Change(FlowState.CANCELLED, "cancelled: race", {}), now=engine.clock.now(), by="test"
        )
    clock.advance(engine.retry_policy.cap_seconds + 1)
    assert engine.run_step(record.id, "result") == "succeeded", "the read ends it by the gateway's word"


def test_a_cancel_left_unjudged_when_the_flow_stops_for_a_person_is_the_persons_again(
    make_engine: Any, clock: ManualClock
) -> None:
    """A charge's answer is lost (money in flight); the operator cancels; the read cannot tell, bounded,
    so the flow stops for a person. The request used to stay on it: a second cancel answered "requested"
    on a flow no step runs, only retry was offered, and it dropped the stop and sent the charge again. The
    request is the person's now (said in the history): a second cancel reads the gateway again and, as
    nothing was charged, ends the flow cancelled without a second call."""
    pay = ScriptedStep("pay", [Retry(1.0, {"type": "Timeout", "ambiguous": True}, True)], reconciles=[UNCLEAR] * 10)
    engine, _ = make_engine(flow(pay, ScriptedStep("confirm", op=None)))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "pay") == "retrying"
    assert engine.cancel(record.id, "customer left").cancel_requested
    for _ in range(10):
        clock.advance(60)
        if engine.run_step(record.id, "pay") == "needs_attention":
            break
    stopped = engine.get(record.id)
    assert stopped.state is FlowState.NEEDS_ATTENTION and not stopped.cancel_requested
    assert "left to a person" in engine.history(record.id)[-1]["what"]
    assert set(engine.actions(stopped)) == {"retry", "cancel"}
    again = engine.cancel(record.id, "still want it stopped")
    assert again.state is FlowState.READY and again.cancel_requested, "a read first: money may be in flight"
    pay.reconciles[:] = [NOT_COMMITTED]
    assert engine.run_step(record.id, "pay") == "cancelled"
    assert pay.runs == [1], "the charge was not sent again"
