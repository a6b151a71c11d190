"""A keep (or accept) of a late payment and its refund, asked by two operators at once.

Invariants 3 and 4 (and the project's own rule in ``LatePayments.accepting``: no keep or accept takes a payment
being refunded). ``LatePayments.keep`` checks "no refund under way" (``refunding``), then reads the gateway
(``undone``: ``GET /operations/{id}`` and ``GET /orders/{id}``), then writes the flow by compare-and-set on
the flow's version. A refund asked meanwhile starts its own refund flow and leaves the late flow's record
as it was (it is closed only once the refund succeeded), so the version the keep's write is guarded by has
not moved: the keep goes through, and the refund then returns the payment the flow just took as its outcome.
The window is a gateway round trip long, not a few microseconds. ``Engine.retry`` (the console's "Accept")
has the same gap (``_retry_takes_late_payment`` then ``store.transition``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durapay.simulator import SimulatorServer
from durapay.workflows.engine.states import FlowState
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld
from tests.workflows.test_late_payments import _hpp_failed_then_paid


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=962)
    yield built
    built.close()


@pytest.mark.parametrize("action", ["keep", "accept"])
def test_a_keep_or_accept_never_takes_a_payment_whose_refund_was_asked_during_its_gateway_read(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """Moves: a hosted page flow ends ``failed`` at its deadline, its page still open; the customer pays it
        (``LatePayment``). Operator 1 keeps the payment (``keep-late-payment``), or accepts it (``retry``, the
    console's "Accept"); while that reads the gateway,
        operator 2 refunds it (``refund-late-payment``: a refund flow is started); the refund flow then runs.

        What goes wrong: the keep's write goes through (the late flow's version did not move) and the flow ends
        ``succeeded`` with the payment as its outcome, while its refund flow gives that payment back: the flow
        reports money the merchant no longer holds (its outcome names a payment the gateway shows refunded), and
        the refund's end finds the flow no longer a ``LatePayment`` and leaves it so."""
    flow, paid = _hpp_failed_then_paid(world)
    real_undone = world.engine.late.undone
    asked: list[Any] = []

    def refund_asked_meanwhile(flow_id: str, operation_id: str) -> Any:
        if not asked:  # the keep's read: operator 2's refund arrives while it is on its way
            asked.append("refund")  # (its own read of the gateway comes through here too)
            asked.append(world.engine.refund_late_payment(flow.flow_id, "operator 2 refunds it", by="operator-2"))
        return real_undone(flow_id, operation_id)

    monkeypatch.setattr(world.engine.late, "undone", refund_asked_meanwhile)
    kept_or_refused: Any
    try:
        if action == "keep":
            kept_or_refused = world.engine.keep_late_payment(flow.flow_id, by="operator-1")
        else:
            kept_or_refused = world.engine.retry(flow.flow_id, by="operator-1")
    except Exception as exc:  # noqa: BLE001 - a refusal is the right answer here; shown in the assertion
        kept_or_refused = exc
    monkeypatch.undo()
    assert asked, f"operator 2 refund was asked during the keep: {kept_or_refused!r}"
    world.settle()
    refunds = [op for op in world.sim.admin.operations(order_id=flow.base) if op.get("parentOperationId") == paid["operationId"]]
    done = world.record(flow)
    assert done is not None
    named = (done.outcome or {}).get("operation") or {}
    took_it = done.state is FlowState.SUCCEEDED and named.get("operationId") == paid["operationId"]
    given_back = any(op["operationResult"] in {"REFUNDED", "VOIDED"} for op in refunds)
    assert not (took_it and given_back), (
        f"flow {flow.flow_id} ended succeeded naming payment {paid['operationId']} as its own (operator 1's {action}: "
        f"{getattr(kept_or_refused, 'state', kept_or_refused)}), and the refund flow asked meanwhile gave it back "
        f"({refunds}): {world.describe(flow)}"
    )
