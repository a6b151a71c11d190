"""The operator actions' one rule (``workflows/engine/operator_actions.py``): what the console and CLI offer and
say of an action is what the engine then does.

Issue 23, item 2: for a ``needs_attention`` flow whose call may have reached the gateway, the console's
confirmation page said the call "finishes and its effect is kept and shown" while the engine cancelled at
once with no read; item 1: a flow whose payment succeeded was offered (and accepted) a cancel.
"""

from __future__ import annotations

from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.tasks.outcomes import Advance, Attention
from durapay.workflows.engine import Engine, OperatorError, operator_actions
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition
from durapay.workflows.engine.store import FlowRecord
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary


def _flow(make_engine: Any, outcome: Any, *, money: bool) -> tuple[Engine, str]:
    step = ScriptedStep("pay", outcomes=[outcome], op=Catalogue.create_moto_order if money else Catalogue.get_order)
    definition = FlowDefinition("demo", DemoInput, (step, ScriptedStep("after")), summary)
    engine, _ = make_engine(definition)
    record = engine.start("demo", {"amount": 100})
    engine.run_step(record.id, "pay")
    return engine, record.id


@pytest.mark.parametrize(
    ("outcome", "money"),
    [
        (Attention("the gateway could not tell", {"type": "Ambiguous"}), True),
        (Attention("the gateway could not tell", {"type": "Ambiguous"}), False),
        (Advance({}), True),
    ],
    ids=["needs-attention-money-in-flight", "needs-attention-nothing-sent", "ready"],
)
def test_what_a_cancel_is_said_to_do_is_what_it_does(make_engine: Any, outcome: Any, money: bool) -> None:
    engine, flow_id = _flow(make_engine, outcome, money=money)
    record = engine.get(flow_id)
    assert "cancel" in operator_actions.allowed(record)
    said = " ".join(operator_actions.explain(record, "cancel"))
    done = engine.cancel(flow_id, "the operator cancels", by="console")
    if "reads the gateway first" in said:
        assert done.state is FlowState.READY and done.cancel_requested, (said, done.state)
    else:
        assert "cancelled now" in said, said
        assert done.state is FlowState.CANCELLED, (said, done.state)
    if money and isinstance(outcome, Attention):
        assert "reads the gateway first" in said, "a call that may have reached the gateway is read before a cancel"


def test_a_running_step_is_said_to_finish_and_the_cancel_waits_for_it(make_engine: Any) -> None:
    definition = FlowDefinition("demo", DemoInput, (ScriptedStep("pay", op=Catalogue.get_order),), summary)
    engine, _ = make_engine(definition)
    record = engine.start("demo", {"amount": 100})
    claim = engine.claim(record.id, "pay")
    assert not isinstance(claim, str)
    running = engine.get(record.id)
    said = " ".join(operator_actions.explain(running, "cancel"))
    assert "is not interrupted" in said
    done = engine.cancel(record.id)
    assert done.state is FlowState.RUNNING and done.cancel_requested
    assert operator_actions.allowed(done) == [], "asked once: nothing more to offer"
    assert engine.cancel(record.id).cancel_requested, "a repeated cancel (a retried call) is the same request"


def test_what_is_not_offered_is_refused_with_the_same_reason(make_engine: Any) -> None:
    engine, flow_id = _flow(make_engine, Advance({}), money=False)
    engine.run_step(flow_id, "after")
    done = engine.get(flow_id)
    assert done.state is FlowState.SUCCEEDED and operator_actions.allowed(done) == []
    for action, call in (("cancel", lambda: engine.cancel(flow_id)), ("retry", lambda: engine.retry(flow_id))):
        reason = operator_actions.refusal(done, action)
        assert reason is not None
        with pytest.raises(OperatorError) as refused:
            call()
        assert str(refused.value) == reason


def test_a_failed_card_flow_is_not_offered_a_retry_the_engine_refuses(make_engine: Any) -> None:
    """Issue 27, item 4: a declined card flow offered Retry, its confirm page said both "starts again" and
    "cannot be restarted", and the click answered "card data was erased". The rule now sees the erasure."""
    from durapay.gateway import Card, GatewayModel
    from durapay.tasks.outcomes import Finish

    class CardOnly(GatewayModel):
        card: Card

    declined = ScriptedStep("pay", outcomes=[Finish(False, "declined")])
    engine, _ = make_engine(FlowDefinition("demo", CardOnly, (declined,), summary))
    record = engine.start("demo", {"card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}})
    assert engine.run_step(record.id, "pay") == "failed"
    failed = engine.get(record.id)
    assert "retry" not in operator_actions.allowed(failed)
    refused = operator_actions.refusal(failed, "retry")
    assert refused is not None and "card data was erased" in refused
    with pytest.raises(OperatorError, match="card data was erased"):
        engine.retry(record.id)


def test_a_restart_is_said_to_take_the_order_id_the_engine_takes(make_engine: Any) -> None:
    """The confirm page said "suffix -1"; the first restart's order id ends in -2 (orders.gateway_order_id)."""
    from durapay.gateway import GatewayModel
    from durapay.tasks.outcomes import Finish

    class OrderInput(GatewayModel):
        orderId: str

    step = ScriptedStep("pay", outcomes=[Finish(False, "declined"), Finish(False, "declined")])
    engine, _ = make_engine(FlowDefinition("demo", OrderInput, (step,), summary, order_id=lambda data: data.orderId))
    record = engine.start("demo", {"orderId": "ord-7"})
    assert engine.run_step(record.id, "pay") == "failed"
    said = " ".join(operator_actions.explain(engine.get(record.id), "retry"))
    assert "suffix -2" in said and "cannot" not in said, said
    assert engine.retry(record.id).order_id == "ord-7-2"


def _late(flow_id: str, kind: str, state: FlowState, **fields: Any) -> FlowRecord:
    return FlowRecord(
        id=flow_id, kind=kind, state=state, step="pay", version=3, attempt=0, created=0.0, updated=0.0, input={}, **fields
    )


@pytest.mark.parametrize("refund_state", [FlowState.RUNNING, FlowState.SUCCEEDED])
def test_while_a_late_payments_refund_is_under_way_what_is_offered_is_what_is_taken(refund_state: FlowState) -> None:
    """Review of issue 27: with the refund running, nothing was offered but a refund was taken (its
    confirmation page, reached by URL, accepted it); both are now read from ``taken``. Once the refund
    succeeded (its worker lost before it closed the flow), refund is offered and taken: it closes the flow."""
    late = {"type": "LatePayment", "endedAs": "failed", "operation": {"operationId": "op-1", "operationResult": "EXECUTED"}}
    record = _late("f-late", "moto", FlowState.NEEDS_ATTENTION, error=late)
    refunding = _late("f-refund", "refund", refund_state)
    offered = operator_actions.allowed(record, refunding=refunding)
    accepted = [a for a in operator_actions.ACTIONS if operator_actions.refusal(record, a, refunding=refunding) is None]
    assert offered == accepted == (["refund"] if refund_state is FlowState.SUCCEEDED else [])
    if refund_state is FlowState.RUNNING:
        assert "is being refunded by flow f-refund" in (operator_actions.refusal(record, "refund", refunding=refunding) or "")
