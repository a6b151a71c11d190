"""When a late payment's money went back another way: what the gateway shows decides, never a guess.

A review of refund-late-payment's "already given back" close (a737a0d) found it trusted any refund on the
payment's order: a partial refund closed the whole payment as refunded, a PENDING refund that then failed
did too, and a late payment whose own refund flow failed (the money refunded elsewhere meanwhile) could
never be closed. ``late_payments.undone_by`` now counts only final refunds of the payment, summed against
its amount; what leaves it open is a doubt, never a close (the order-sharing case is tested with the
reservation flows: tests/workflows/flows/test_reservations_retry.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

from durapay.gateway import Catalogue
from durapay.workflows.engine import OperatorError
from durapay.workflows.engine.keys import derived_id
from durapay.workflows.engine.states import FlowState
from durapay.workflows.late_payments import refund_key
from tests.workflows.flow_model import FlowWorld
from tests.workflows.test_late_payments import _link_declined, _renew_and_pay, refunds_of, run_all, world

__all__ = ["world"]

FAILED = {"FAILED", "REJECTED", "DECLINED"}


def _late(world: FlowWorld, name: str) -> tuple[Any, dict[str, Any]]:
    flow, link = _link_declined(world, name)
    paid = _renew_and_pay(world, link)
    for note in world.notifications(flow):
        world.notify(note["body"])
    run_all(world)
    late = world.record(flow)
    assert late is not None and late.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    return flow, paid


def _held(world: FlowWorld, operation_id: str) -> int:
    """What of the payment the merchant still holds at the gateway (minor units)."""
    payment = world.engine.gateway().call(Catalogue.get_operation, operation_id).wire()
    back = sum(int(r.get("amount") or 0) for r in refunds_of(world, operation_id) if r.get("operationResult") not in FAILED)
    return int(payment.get("operationAmount") or 0) - back


def test_a_partial_refund_elsewhere_is_not_taken_for_the_whole(world: FlowWorld) -> None:
    flow, paid = _late(world, "r2partial")
    world.start_flow("refund", {"operationId": paid["operationId"], "amount": "100", "currency": "EUR"}, key="r2partial-refund")
    run_all(world)
    with contextlib.suppress(OperatorError):  # refused is fine: what matters is that it is not closed as given back
        world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    done = world.record(flow)
    held = _held(world, paid["operationId"])
    assert done is not None
    assert not (done.state is FlowState.CANCELLED and held > 0 and "undone" in str(done.outcome)), (
        f"closed as refunded at the gateway while {held} of payment {paid['operationId']} is held: {done.outcome}"
    )


def test_a_pending_refund_elsewhere_that_fails_closes_nothing(world: FlowWorld) -> None:
    flow, paid = _late(world, "r2pend")
    world.sim.admin.pend("refund_operation", final="FAILED")
    world.start_flow("refund", {"operationId": paid["operationId"]}, key="r2pend-plain")
    run_all(world)
    with contextlib.suppress(OperatorError):
        world.engine.refund_late_payment(flow.flow_id)
    world.sim.admin.settle_pending()
    world.settle()
    refunds = [(r["operationId"], r["operationResult"]) for r in refunds_of(world, paid["operationId"])]
    done = world.record(flow)
    assert done is not None
    assert not (done.state is FlowState.CANCELLED and _held(world, paid["operationId"]) > 0), (
        f"cancelled as refunded while the payment is held at the gateway ({refunds}): {done.outcome}"
    )


def test_a_late_payment_whose_own_refund_failed_is_closed_once_refunded_elsewhere(world: FlowWorld) -> None:
    flow, paid = _late(world, "r2stuck")
    world.start_flow("refund", {"operationId": paid["operationId"]}, key="r2stuck-plain")  # queued first
    world.engine.refund_late_payment(flow.flow_id)  # its own refund flow, which the gateway then refuses
    run_all(world)
    world.settle()
    ours = world.engine.store.get(derived_id("f", "refund", refund_key(flow.flow_id, paid["operationId"])))
    assert ours is not None and ours.state is FlowState.FAILED, "the payment was refunded by the plain flow first"
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.CANCELLED, world.describe(flow)
    assert _held(world, paid["operationId"]) == 0
