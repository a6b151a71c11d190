"""Review (merchant steps calling the gateway through ``StepContext.call``), both fixed at their rule.

1. ``StepContext.call`` refused a money operation a step does not declare only in a *call* step; a
   ``wait_signal`` handler, given the same ``StepContext``, could send one with nothing marked in
   flight, and a cancel after its lost answer ended the flow ``cancelled`` while the gateway held the
   payment. Now any step that is not a call step declaring a money operation is refused one, before
   it is sent (``tasks.runner.UndeclaredMoney``): the flow stops for a person, nothing is charged.
2. A ``call`` step that declared a money operation without ``adopt=`` got ``never_committed`` as its
   read-back: the cancel's "read" read nothing and ended the flow ``cancelled`` while the gateway held
   its payment. Now ``durapay.flows.call`` refuses that definition at load.

Real Valkey, a Celery worker, the simulator over HTTP."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from pydantic import BaseModel

from durapay.flows import Call, DefinitionError, Flow, call, wait_signal
from durapay.gateway import Catalogue
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorServer
from durapay.tasks.outcomes import Advance, Finish
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows._adopt import adopt_order_payment
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_flows import APPROVE, order

pytestmark = pytest.mark.integration


class Approval(BaseModel):
    order: dict[str, Any]


def _charge(ctx: Any, name: str, payload: dict[str, Any]) -> Any:
    """A merchant's wait: once the shop's approval comes, charge the card (MOTO) from the handler."""
    answer = ctx.call(
        Catalogue.create_moto_order,
        request={"order": ctx.input.order, "card": {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"}},
    )
    return Advance(answer.wire())


def _not_approved(ctx: Any) -> Any:
    return Finish(False, "not approved in time")


APPROVE_THEN_CHARGE = Flow(
    "approve_then_charge",
    Approval,
    (wait_signal("approval", ["approved"], _charge, _not_approved, 600),),
    lambda data, outputs: {},
    lambda data: str(data.order["orderId"]),
)


KINDS = {APPROVE_THEN_CHARGE.kind: APPROVE_THEN_CHARGE}


@pytest.fixture
def runtime(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Runtime]:
    simulator.admin.clear_faults()
    # A short late window: a read that finds nothing is believed 1 s after the call (120 s by default).
    settings = stack_settings(key_prefix, simulator.base_url, retry={"late_seconds": 1.0})
    built = build_runtime(settings, redis_url=redis_url, rng=random.Random(5), flows=KINDS)
    with ExitStack() as stack:
        stack.enter_context(start_worker(built.celery, pool="threads", concurrency=2, perform_ping_check=False))
        dispatcher = Dispatcher(built.engine, interval=0.05).start()
        stack.callback(dispatcher.stop)
        yield built
    simulator.admin.clear_faults()
    built.close()


def test_a_wait_handlers_money_call_is_refused_before_it_is_sent(runtime: Runtime, simulator: SimulatorServer) -> None:
    engine = runtime.engine
    data = {"order": order()}
    order_id = data["order"]["orderId"]
    record = engine.start("approve_then_charge", data)
    wait_until(lambda: engine.get(record.id).state is FlowState.WAITING, 20, "the flow waits for its approval")
    engine.signal(record.id, "approved", {})
    wait_until(lambda: engine.get(record.id).state is FlowState.NEEDS_ATTENTION, 20, "the handler's call refused")
    stopped = engine.get(record.id)
    assert stopped.error is not None and stopped.error["type"] == "UndeclaredMoney", stopped.summary()
    assert "create_moto_order" in stopped.error["message"] and "not a call step" in stopped.error["message"], stopped.error
    # Money invariant 2 at its root: the money call was never sent, so there is nothing a cancel could miss.
    assert simulator.admin.operations(order_id=order_id) == [], "nothing reached the gateway"


def _moto(ctx: Any) -> Call:
    return Call(request={"order": ctx.input.order, "card": {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"}})


def test_a_money_call_step_without_a_read_back_is_refused_at_load() -> None:
    with pytest.raises(DefinitionError) as refused:
        call("charge", Catalogue.create_moto_order, _moto)
    assert refused.value.step == "charge" and "adopt=" in str(refused.value), refused.value
    with pytest.raises(DefinitionError):
        call("link", Catalogue.create_paybylink_v3, _moto)  # opens a page a customer pays on
    # A read, or a money call with its read-back, is taken.
    assert call("read", Catalogue.get_order, lambda ctx: Call(("o-1",))).name == "read"
    assert call("charge", Catalogue.create_moto_order, _moto, adopt=adopt_order_payment).name == "charge"
