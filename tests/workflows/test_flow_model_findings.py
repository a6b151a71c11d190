"""What the flow model test (``test_flow_model.py``) found, each replayed as a fixed sequence of moves.

Same world as the model (the engine, the simulator over HTTP, a Valkey whose AOF tail can be cut), the
same invariants checked at the end: money at the gateway shows in its flow, no flow charged twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from durapay.simulator import SimulatorAdminError, SimulatorServer
from durapay.workflows.engine.states import FlowState
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=900)
    yield built
    built.close()


def test_a_cancel_waits_for_the_read_of_a_call_that_may_have_charged(world: FlowWorld) -> None:
    """A worker dies after the MOTO payment committed; the next run's read back is answered 429 while
    a cancel is pending. The retried read must still come: the completion into ``retrying`` (reconcile
    first) was turned into ``cancelled``, with the card charged."""
    flow = world.start("moto", "approve")
    assert world.kill_mid_step(flow) == "killed"
    world.sim.admin.set_faults(mode="error", operation="get_order", count=1, status=429, retry_after=2)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    world.advance(31)
    world.settle()
    world.check_settled()
    record = world.record(flow)
    assert record is not None and record.state in {FlowState.SUCCEEDED, FlowState.NEEDS_ATTENTION}


def test_a_page_shown_to_the_merchant_is_never_forgotten_by_redis(world: FlowWorld) -> None:
    """The hosted page is created and its URL shown (the flow waits for the customer); then Redis loses
    its last writes, the completion among them (and the notification token). The create runs again,
    finds the order unpaid and moves to ``<orderId>-2``; the merchant cancels; the customer pays the
    page they were given. The payment must show in the flow: the completion that shows a customer URL
    is durable before the step returns."""
    flow = world.start("hpp", "approve")
    while world.messages.chains:
        world.deliver(0)
    shown = world.record(flow)
    assert shown is not None and shown.state is FlowState.WAITING and shown.customer_url
    world.lose_tail(50)
    world.advance(31)
    world.engine.dispatch_due()
    while world.messages.chains:
        world.deliver(0)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    with contextlib.suppress(SimulatorAdminError):
        world.sim.admin.complete_hpp(shown.order_id)
    world.settle()
    world.check_settled()


def test_a_cancel_never_ends_a_flow_whose_payment_may_still_arrive_late(world: FlowWorld) -> None:
    """The MOTO payment is answered 500 and reaches the gateway only later (the request was still in
    flight when its client gave up). The merchant cancels; the step's read back finds no order yet.
    Ending the flow ``cancelled`` on that read leaves the late charge unseen."""
    flow = world.start("moto", "approve")
    world.sim.admin.set_faults(mode="late", operation="create_moto_order", count=1)
    while world.messages.chains:
        world.deliver(0)
    retrying = world.record(flow)
    assert retrying is not None and retrying.state is FlowState.RETRYING and retrying.reconcile, world.describe(flow)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    world.clock.advance(5)  # not world.advance, which lets held requests act first
    world.sim.admin.advance_clock(5)
    world.engine.dispatch_due()
    while world.messages.chains:
        world.deliver(0)
    assert world.sim.admin.release_late() == [200], "the late payment acts"
    world.settle()
    world.check_settled()


def test_a_completion_whose_claim_redis_lost_never_overwrites_a_later_move(world: FlowWorld) -> None:
    """Found by the extended model: a slow worker claims a step (version v+1) and runs it; Redis loses that
    claim (the record is back at v); the merchant cancels (v -> v+1 again, ``cancelled``); the slow worker
    completes against v+1. The version alone matched: the completion tried to move a cancelled flow on.
    The compare-and-set is on the version and the state the claim left."""
    flow = world.start("delay_charge", "approve")  # its first step is a durable timer: a claim not waited on
    assert world.begin_step(flow) == "held"  # the timer step will sleep until the charge's time
    assert world.lose_tail(1) == 1  # the claim
    record = world.record(flow)
    assert record is not None and record.state is FlowState.READY, world.describe(flow)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    assert world.finish_step(0) == "stale"
    world.settle()
    world.check_settled()
