"""The public way to declare a flow (``durapay.flows``): definitions refused at load, versions."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from durapay.flows import Call, DefinitionError, Flow, call, step, timer, wait_signal
from durapay.gateway import Catalogue
from durapay.gateway import Order as GatewayOrder
from durapay.tasks.outcomes import Advance, Finish
from durapay.workflows.engine.steps import CallStep, MerchantStep, SleepStep, WaitStep
from durapay.workflows.flows import REGISTRY
from durapay.workflows.flows._adopt import adopt_order_payment


def charge_call(*args: Any, **kwargs: Any) -> CallStep:
    """A MOTO charge step, with the read-back a money call must declare (``durapay.flows.call``)."""
    return call("charge", "create_moto_order", *args, adopt=adopt_order_payment, **kwargs)


class Order(BaseModel):
    amount: int


def summary(data: Any, outputs: Any) -> dict[str, Any]:
    return {}


def fraud(given: Any) -> dict[str, Any]:
    return {"score": 1}


def ledger(given: Any) -> dict[str, Any]:
    return {}


def shop(*steps: Any, model: type[BaseModel] = Order) -> Flow:
    return Flow("shop", model, tuple(steps), summary)


def test_every_built_in_kind_is_declared_with_the_public_steps() -> None:
    kinds = {CallStep, WaitStep, SleepStep}
    assert all(isinstance(flow, Flow) for flow in REGISTRY.values())
    assert all(type(s) in kinds for flow in REGISTRY.values() for s in flow.steps), "no step class of its own"
    assert len({flow.version for flow in REGISTRY.values()}) == len(REGISTRY), "each kind its own version"


def test_a_step_name_twice_is_refused_naming_the_flow_and_the_step() -> None:
    with pytest.raises(DefinitionError, match=r"flow 'shop', step 'fraud': the step name repeats"):
        shop(step(fraud), step(fraud))


def test_an_unknown_operation_is_refused_naming_it() -> None:
    with pytest.raises(DefinitionError, match=r"^step .charge.: no gateway operation named .create_mot_order."):
        call("charge", "create_mot_order", lambda ctx: Call())


class Sale(BaseModel):
    order: GatewayOrder


def test_a_payment_in_a_flow_without_its_gateway_order_is_refused() -> None:
    """A payment's lost answer is read back from the flow's gateway order: a Flow with a payment and no
    ``order_id`` was accepted, its read-back asked for order "" and took the 404 as "never acted", and the
    next try charged again (issue 38 money review, finding 12)."""
    from durapay.flows import payment

    charge = payment("charge", Catalogue.create_moto_order, lambda ctx: {"order": {}})
    with pytest.raises(DefinitionError, match=r"flow 'sale', step 'charge': a payment's lost answer is read back from"):
        Flow("sale", Sale, (charge,), lambda data, outputs: {})


def test_a_step_reading_an_output_no_earlier_step_makes_is_refused() -> None:
    with pytest.raises(DefinitionError, match=r"step 'ledger': reads the output of 'charge', which no earlier step makes"):
        shop(step(fraud), step(ledger, reads=("charge",)), charge_call(lambda ctx: Call()))


def test_a_lambda_step_needs_a_name_and_retries_are_bounded() -> None:
    with pytest.raises(DefinitionError, match="needs a name"):
        step(lambda given: {})
    with pytest.raises(DefinitionError, match="retry must be 1 to 100"):
        step(fraud, retry=0)


def test_the_constructors_build_the_engines_steps() -> None:
    charge = charge_call(lambda ctx: Call(), reads=("fraud",))
    assert isinstance(charge, CallStep) and charge.op is Catalogue.create_moto_order
    assert isinstance(step(fraud), MerchantStep) and step(fraud).name == "fraud"
    waiting = wait_signal("paid", ["notification"], lambda c, n, p: Advance(), lambda c: Finish(False, "late"), 60)
    assert waiting.signals == ("notification",) and waiting.timeout(None) == 60.0  # type: ignore[arg-type]
    assert isinstance(timer("later", lambda ctx: None), SleepStep)
    shop(step(fraud), charge)  # reads an earlier step: accepted


def test_the_version_changes_with_what_a_flow_in_flight_depends_on_only() -> None:
    charge = charge_call(lambda ctx: Call())
    base = shop(step(fraud), charge)
    assert base.version == shop(step(fraud), charge_call(lambda ctx: Call(request={}))).version, (
        "a step body's code is not part of the version"
    )
    assert Flow("shop", Order, (step(fraud), charge), summary, label="v1").version == base.version, "nor the label"

    class Bigger(BaseModel):
        amount: int
        note: str = ""

    changed = [
        shop(step(fraud, name="risk"), charge),  # a step renamed
        shop(step(fraud), charge, step(ledger)),  # a step added
        shop(charge, step(fraud)),  # the order
        shop(step(fraud), call("charge", "create_mit_order", lambda ctx: Call(), adopt=adopt_order_payment)),  # the operation
        shop(step(fraud), charge, model=Bigger),  # the input's schema
        shop(step(fraud, output=Order), charge),  # a step's output schema
    ]
    versions = {base.version} | {flow.version for flow in changed}
    assert len(versions) == len(changed) + 1
    assert len(base.version) == 12 and all(c in "0123456789abcdef" for c in base.version)


def test_previous_versions_are_held_beside_the_current_one() -> None:
    first = shop(step(fraud), charge_call(lambda ctx: Call()))
    second = Flow("shop", Order, (*first.steps, step(ledger)), summary, label="ledger", previous=(first,))
    assert list(second.versions()) == [second.version, first.version]
    with pytest.raises(DefinitionError, match="a previous version is of kind 'other'"):
        Flow("shop", Order, first.steps, summary, previous=(Flow("other", Order, first.steps, summary),))
