"""Refunds, captures and cancels of a capture: what each succeeds with, a partial refund of an authorization
not captured, a lost answer read back, and the order their events name (issue 23, items 10 and 14).

The real flows run step by step on a manual clock against the simulator over HTTP (``session_engine``);
one test answers from a stand-in gateway, for a result the simulator never gives.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.gateway import Catalogue, GatewayOperation
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows import REGISTRY
from tests.workflows.flows.session_engine import engine, step_until

__all__ = ["engine"]

ENDED = {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION}
APPROVE = "4349940199004549"


def sale(flows: Engine, order_id: str, amount: int = 2500, *, explicit: bool = False) -> str:
    """A MOTO payment made outside any flow (what a post-operation acts on): its operation id."""
    body: dict[str, Any] = {
        "order": {"orderId": order_id, "amount": str(amount), "currency": "EUR"},
        "card": {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"},
    }
    if explicit:
        body["captureType"] = "EXPLICIT"
    return str(flows.gateway().call(Catalogue.create_moto_order, request=body).operation.operationId)


def run_one(flows: Engine, flow_id: str) -> Any:
    """Run the flow's next step once, when it is due on the manual clock."""
    record = flows.get(flow_id)
    if record.due is not None and record.due > flows.clock.now():
        flows.clock.advance(record.due - flows.clock.now() + 0.001)  # type: ignore[attr-defined]
    flows.run_step(flow_id, record.step)
    return flows.get(flow_id)


def forget_keys(sim: SimulatorServer) -> None:
    """The gateway forgets the Idempotency-Keys it has seen (``test_reservations_charges.forget_keys``)."""
    state = sim.simulator.state
    with state.lock:
        state.idempotency.clear()


# -- item 14: each post-operation succeeds with its own results --------------------------------------


def test_a_capture_read_back_cancelled_is_not_a_success(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: refund, capture and cancel_capture shared {REFUNDED, VOIDED, CANCELED} as successes."""
    flows, _sim = engine
    authorization = sale(flows, "cap-1", explicit=True)
    started = flows.start("capture", {"operationId": authorization})
    posted = run_one(flows, started.id)
    capture = posted.outputs["post"]["operationId"]
    flows.gateway().call(Catalogue.cancel_operation, capture, request={})  # cancelled the same day, elsewhere
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.FAILED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationResult"] == "CANCELED"


class StandIn:
    """A gateway that accepts a refund and then shows it ``result``."""

    def __init__(self, result: str) -> None:
        self.result = result

    def call(self, op: GatewayOperation[Any], *path: str, request: Any = None, idempotency_key: str | None = None) -> Any:
        answers = {
            "refund_operation": {"operationId": "op-r", "operationTime": "2026-07-01 10:00:00.000"},
            "get_operation": {
                "operationId": "op-r",
                "orderId": "o-1",
                "operationType": "REFUND",
                "operationResult": self.result,
                "operationAmount": "900",
                "operationCurrency": "EUR",
            },
            # The payment's order, read with it held before the refund is sent (workflows.engine.targets).
            "get_order": {"orderStatus": {"order": {"orderId": "o-1"}}, "operations": []},
        }
        return op.response.model_validate(answers[op.name])


@pytest.mark.parametrize(("result", "state"), [("CANCELED", FlowState.FAILED), ("REFUNDED", FlowState.SUCCEEDED)])
def test_a_refund_succeeds_only_with_a_refund_s_results(
    redis_client: redis.Redis, key_prefix: str, result: str, state: FlowState
) -> None:
    """Confirmed: a refund read back CANCELED was counted a success."""
    settings = load_settings({"engine": {"key_prefix": key_prefix, "partitions": 2}})
    client = StandIn(result)
    flows = Engine(settings, redis_client, REGISTRY, clock=ManualClock(1782900000.0), client_factory=lambda: client)  # type: ignore[arg-type,return-value]
    done = step_until(flows, flows.start("refund", {"operationId": "op-9"}).id, ENDED)
    assert done.state is state, done.summary()


def test_a_partial_refund_of_an_authorization_not_captured_is_refused(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: the gateway voids an authorization not captured whole, and the flow reported that void of
    2500 as the refund of 500 it was asked for."""
    flows, sim = engine
    authorization = sale(flows, "auth-1", 2500, explicit=True)
    started = flows.start("refund", {"operationId": authorization, "amount": 500, "currency": "EUR"})
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.FAILED, done.summary()
    assert done.error is not None and done.error["field"] == "amount" and "2500" in done.error["reason"], done.error
    assert sim.admin.operations(order_id="auth-1", operation_type="VOID") == []
    whole = step_until(flows, flows.start("refund", {"operationId": authorization}).id, ENDED)
    assert whole.state is FlowState.SUCCEEDED and whole.outcome is not None, whole.summary()
    assert whole.outcome["operation"]["operationResult"] == "VOIDED"


def test_a_partial_refund_of_a_captured_payment_goes_on(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    payment = sale(flows, "paid-1", 2500)
    done = step_until(flows, flows.start("refund", {"operationId": payment, "amount": 500, "currency": "EUR"}).id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    (refund,) = sim.admin.operations(order_id="paid-1", operation_type="REFUND")
    assert refund["amount"] == 500


def test_a_refund_s_events_name_the_payment_s_order(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: a refund's (and a reservation charge's) events carried ``orderId: null``, so a payment's
    refunds could not be found from its order. Passes once events.lua names the order of the flow's
    operation when the flow holds none (report: workflows/engine/lua/events.lua)."""
    flows, _sim = engine
    payment = sale(flows, "evt-1", 2500)
    started = flows.start("refund", {"operationId": payment})
    assert step_until(flows, started.id, ENDED).state is FlowState.SUCCEEDED
    ended = [event for event, _ in flows.events() if event.body.get("flow") == started.id and event.type == "flow.succeeded"]
    assert [event.body.get("orderId") for event in ended] == ["evt-1"]


# -- item 10: a lost answer is read back, not only replayed -----------------------------------------


def lost_refund(flows: Engine, sim: SimulatorServer, order_id: str) -> str:
    """A refund the gateway made but whose answer was lost (a 500), and a gateway that has since forgotten
    its Idempotency-Key."""
    payment = sale(flows, order_id, 2500)
    sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    started = flows.start("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"})
    retrying = step_until(flows, started.id, {FlowState.RETRYING})
    assert retrying.step == "post" and len(sim.admin.operations(order_id=order_id, operation_type="REFUND")) == 1
    forget_keys(sim)
    return started.id


def test_a_cancel_after_a_lost_refund_answer_reads_the_order_instead_of_refunding_again(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, sim = engine
    flow_id = lost_refund(flows, sim, "lost-1")
    flows.cancel(flow_id)
    done = step_until(flows, flow_id, ENDED)
    (refund,) = sim.admin.operations(order_id="lost-1", operation_type="REFUND")
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == refund["operationId"]


def test_a_retry_after_a_lost_refund_answer_reads_the_order_before_refunding_again(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    """Passes once keyed money calls are read back first (report: gateway/_catalogue.py)."""
    flows, sim = engine
    flow_id = lost_refund(flows, sim, "lost-2")
    done = step_until(flows, flow_id, ENDED)
    (refund,) = sim.admin.operations(order_id="lost-2", operation_type="REFUND")
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == refund["operationId"]
