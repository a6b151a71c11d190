"""A money call step sends the operation it declares, or one of the forms it names in its place
(``durapay.flows.call(..., forms=)``), never another money operation: money in flight, the durable claim
and the read-back of a lost answer are all the declared operation's (``tasks.runner.StepContext.call``).

Found by the review of stop 46: the rule let a step declared with one money operation (a refund) send a
different one (a capture), which its read-back (the refund's) would never find."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.flows import DefinitionError, Flow, call
from durapay.gateway import Catalogue
from durapay.workflows.engine.states import FlowState
from tests.workflows.engine.test_steps_review import DroppedGateway
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary


def _read_back(ctx: Any) -> Any:
    from durapay.tasks.runner import NOT_COMMITTED

    return NOT_COMMITTED


def test_a_step_declared_with_one_money_operation_cannot_send_another(make_engine: Any) -> None:
    gateway = DroppedGateway()

    def capture_instead(ctx: Any, send: Any) -> Any:
        return ctx.call(Catalogue.capture_operation, "op-1", request={"amount": "300"})

    refund = call("refund", Catalogue.refund_operation, adopt=_read_back, body=capture_instead)
    definition = Flow("demo", DemoInput, (refund, ScriptedStep("after")), summary)
    engine, _ = make_engine(definition, client_factory=lambda *args, **kwargs: gateway)
    record = engine.start("demo", {"amount": 3})
    ran = engine.run_step(record.id, "refund")
    assert gateway.sent == [], f"a capture sent by a step declared as a refund is refused before it goes out: {gateway.sent}"
    stopped = engine.get(record.id)
    assert ran == "needs_attention" and stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    assert "capture_operation" in str(stopped.error) and "refund_operation" in str(stopped.error), stopped.error


def test_a_step_may_send_a_form_it_names_in_the_declared_operations_place(make_engine: Any) -> None:
    gateway = DroppedGateway()

    def earlier_form(ctx: Any, send: Any) -> Any:
        return ctx.call(Catalogue.create_paybylink_v2, request={})

    link = call("link", Catalogue.create_paybylink_v3, adopt=_read_back, body=earlier_form, forms=("create_paybylink_v2",))
    definition = Flow("demo", DemoInput, (link, ScriptedStep("after")), summary)
    engine, _ = make_engine(definition, client_factory=lambda *args, **kwargs: gateway)
    record = engine.start("demo", {"amount": 3})
    engine.run_step(record.id, "link")
    assert gateway.sent == ["create_paybylink_v2"], "a form the step names is sent in the declared one's place"
    assert engine.get(record.id).unsettled is not None, "and it is money in flight like the declared one"


def test_a_form_must_be_a_money_operation_like_the_declared_one() -> None:
    with pytest.raises(DefinitionError, match="get_operation"):
        call("refund", Catalogue.refund_operation, adopt=_read_back, forms=("get_operation",))
    with pytest.raises(DefinitionError, match="no gateway operation named"):
        call("refund", Catalogue.refund_operation, adopt=_read_back, forms=("refund_operashun",))
    with pytest.raises(DefinitionError, match="create_moto_order"):
        call("lookup", Catalogue.get_operation, forms=(Catalogue.create_moto_order,))
