"""A money call step sends the operation it declares, or another form of the same act in its place (the
catalogue's ``gateway.FORM_OF``), never another money operation: money in flight, the durable claim and
the read-back of a lost answer are all the declared operation's (``tasks.runner.StepContext.call``).

Found by the review of stop 46: the rule let a step declared with one money operation (a refund) send a
different one (a capture), which its read-back (the refund's) would never find."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.flows import Flow, call
from durapay.gateway import FORM_OF, Catalogue, same_act
from tests.workflows.engine.test_steps_review import DroppedGateway
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary


def _read_back(ctx: Any) -> Any:
    from durapay.tasks.runner import NOT_COMMITTED

    return NOT_COMMITTED


def _started(make_engine: Any, step: Any) -> tuple[Any, DroppedGateway, str]:
    """An engine of one flow (``step``, then a plain step) whose every gateway answer is lost, and a flow of it."""
    gateway = DroppedGateway()
    definition = Flow("demo", DemoInput, (step, ScriptedStep("after")), summary)
    engine, _ = make_engine(definition, client_factory=lambda *args, **kwargs: gateway)
    return engine, gateway, engine.start("demo", {"amount": 3}).id


def test_a_step_may_send_another_form_of_its_act_in_the_declared_operations_place(make_engine: Any) -> None:
    def earlier_form(ctx: Any, send: Any) -> Any:
        return ctx.call(Catalogue.create_paybylink_v2, request={})

    link = call("link", Catalogue.create_paybylink_v3, adopt=_read_back, body=earlier_form)
    engine, gateway, flow_id = _started(make_engine, link)
    engine.run_step(flow_id, "link")
    assert gateway.sent == ["create_paybylink_v2"], "a form of the declared act is sent in its place"
    assert engine.get(flow_id).unsettled is not None, "and it is money in flight like the declared one"


@pytest.mark.parametrize(
    ("declared", "sent"),
    [
        (Catalogue.refund_operation, Catalogue.capture_operation),  # another act, another read-back
        (Catalogue.create_moto_order, Catalogue.create_hpp_order),  # a charge vs a payable page
        (Catalogue.create_paybylink_v3, Catalogue.create_moto_order),  # a payable page vs a charge
        (Catalogue.create_paybylink_v3, Catalogue.create_hpp_order),  # two pages, two acts
    ],
    ids=["refund-as-capture", "moto-as-hpp", "link-as-moto", "link-as-hpp"],
)
def test_no_definition_makes_another_act_a_form(make_engine: Any, declared: Any, sent: Any) -> None:
    """Review of the first version of this rule (``call(forms=)``): a definition named what its body may
    send instead, and nothing checked that it was the same act (a refund step naming the capture; a MOTO
    step opening a hosted page, which its answer then settled, so a cancel ended the flow while the page
    was payable). Which calls are one act is the catalogue's (``gateway.FORM_OF``), not a definition's."""

    def instead(ctx: Any, send: Any) -> Any:
        return ctx.call(sent, *("op-1",) * len(sent.path_params), request={})

    engine, gateway, flow_id = _started(make_engine, call("pay", declared, adopt=_read_back, body=instead))
    assert engine.run_step(flow_id, "pay") == "needs_attention"
    assert gateway.sent == [], f"{sent.name} in place of {declared.name} is refused before it goes out"
    stopped = engine.get(flow_id)
    assert stopped.error is not None and stopped.error["type"] == "UndeclaredMoney", stopped.error
    assert declared.name in stopped.error["message"] and sent.name in stopped.error["message"], stopped.error


@pytest.mark.parametrize("form", list(FORM_OF), ids=lambda op: op.name)
def test_each_form_is_the_same_act_as_the_operation_it_stands_for(form: Any) -> None:
    """What the engine judges a money step by (money in flight, a page opened, the read-back) is the
    declared operation's: a form must agree with it on each."""
    of = FORM_OF[form]
    assert (form.moves_money, form.notifies, form.reconcile, form.area) == (of.moves_money, of.notifies, of.reconcile, of.area)
    assert form.response is of.response or form.notifies, "a charge's form answers as the charge does"
    assert same_act(form, of) and same_act(of, form) and not same_act(form, Catalogue.create_moto_order)
