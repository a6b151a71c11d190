"""From the money review of issue 38: a call step declared through ``durapay.flows`` whose body sent a
payment its declared operation does not name (refused now, before it is sent: ``tasks.runner``)."""

from __future__ import annotations

from typing import Any

from durapay.flows import Flow
from durapay.workflows.engine.states import FlowState
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary


class DroppedGateway:
    """A gateway whose every answer is lost after the request went out: the call may have acted."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def call(self, op: Any, *path: str, **_: Any) -> Any:
        from durapay.gateway import ConnectionDropped

        self.sent.append(op.name)
        raise ConnectionDropped("connection reset after the request was sent", operation=op.name)

    def close(self) -> None:
        pass


def test_a_call_steps_body_that_sends_a_payment_is_marked_as_money_in_flight(make_engine: Any) -> None:
    """``call(..., body=)`` let a step body send any operation of the catalogue, but money in flight is
    judged by the step's *declared* operation only (issue 38 money review, finding 10); now refused before
    it is sent.

    A merchant's call step declares a read (``get_operation``) and its body, as the public API allows
    ("the operation of another form in its place"), sends ``create_moto_order``. claim.lua marks nothing
    (``inflight.money_operation`` of the declared op), the claim is not made durable before the write
    (``writes(step)``), and the answer is lost after the request went out: a cancel then ends the flow
    ``cancelled`` at once, without reading the gateway, while the charge may have been taken (invariant:
    from the claim of a step that may move money until the gateway's word, no end cancelled or failed)."""
    from durapay.flows import call
    from durapay.gateway import Catalogue

    gateway = DroppedGateway()

    def charge_instead(ctx: Any, send: Any) -> Any:
        return ctx.call(Catalogue.create_moto_order, request={"order": {"orderId": "o-1", "amount": "300"}})

    definition = Flow("demo", DemoInput, (call("lookup", "get_operation", body=charge_instead), ScriptedStep("after")), summary)
    engine, _ = make_engine(definition, client_factory=lambda *args, **kwargs: gateway)
    record = engine.start("demo", {"amount": 3})
    ran = engine.run_step(record.id, "lookup")
    assert gateway.sent == [], f"the charge a read step's body sends is refused before it goes out: {gateway.sent}"
    stopped = engine.get(record.id)
    assert ran == "needs_attention" and stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    assert "declares create_moto_order" in str(stopped.error), stopped.error
    assert stopped.unsettled is None, "nothing was sent: no money in flight"
