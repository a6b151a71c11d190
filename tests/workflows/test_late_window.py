"""The late window: a read that finds nothing is believed only once the last call that may have been sent
can no longer arrive (docs/durability.md, "Money in flight").

A money call whose answer was lost may still be queued at the gateway and act later, up to
``late_seconds`` after it was sent. A cancel of a flow with money in flight reads the gateway back and
ends the flow ``cancelled`` only when the read finds nothing *and* that window has passed, counted from
the last moment a call may have been sent. Every path that stops a flow for a person must record that
moment: the last try's own completion, and a claim that finds the step's worker lost (its lease end).
Each test here failed before that was recorded: the window was counted from the try before.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durapay.simulator import SimulatorServer
from durapay.workflows.engine.states import FlowState
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld

#: ``DURAPAY_RETRY__LATE_SECONDS`` as the model's world has it (the setting's default).
LATE = 120.0


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=915)
    assert built.engine.retry_policy.late_seconds == LATE
    yield built
    built.close()


def _cancel_reads_until_the_late_request_acts(world: FlowWorld, flow_id: str) -> None:
    """The merchant cancels; the cancel's read finds nothing yet; then the late request commits. The flow
    must not have ended cancelled meanwhile, and once read again it names the payment."""
    cancelled = world.engine.cancel(flow_id, "the merchant gives up")
    assert cancelled.cancel_requested or cancelled.state is not FlowState.CANCELLED
    while world.messages.chains:
        world.deliver(0)
    read = world.engine.get(flow_id)
    assert read.state is not FlowState.CANCELLED, (read.summary(), world.engine.history(flow_id))
    assert world.sim.admin.release_late(), "the late request was still held at the gateway"
    world.settle()
    done = world.engine.get(flow_id)
    assert done.state is FlowState.SUCCEEDED, (done.summary(), world.engine.history(flow_id))
    world.check_settled()


def test_a_cancel_after_the_last_attempts_answer_was_lost_counts_the_window_from_that_attempt(world: FlowWorld) -> None:
    """Every try of a MOTO is held by the gateway and answered 500 (a ``late`` request); the last one stops
    the flow for a person ("may have taken effect"). A cancel a little less than the window after that
    last try must not believe the read that finds nothing."""
    world.sim.admin.set_faults(mode="late", operation="create_moto_order", count=10)
    flow = world.start("moto", "approve")
    for _ in range(5):
        while world.messages.chains:
            world.deliver(0)
        record = world.record(flow)
        assert record is not None
        if record.state is not FlowState.RETRYING:
            break
        world.clock.advance(11)  # past the backoff (capped at 10 s); the held requests have not acted
        world.sim.admin.advance_clock(11)
        world.engine.dispatch_due()
    stopped = world.engine.get(flow.flow_id)
    assert stopped.state is FlowState.NEEDS_ATTENTION and stopped.unsettled, world.describe(flow)
    world.clock.advance(LATE - 5)  # more than the window after the try before the last, less after the last
    world.sim.admin.advance_clock(LATE - 5)
    _cancel_reads_until_the_late_request_acts(world, flow.flow_id)


def test_a_cancel_after_the_steps_worker_was_lost_counts_the_window_from_its_lease_end(world: FlowWorld) -> None:
    """Three workers in turn claim the MOTO's pay step, send the call (held by the gateway) and die; the
    next claim finds the worker lost too often and stops the flow for a person. The last worker may have
    sent its call up to the end of its lease: a cancel a little less than the window after that must not
    believe the read that finds nothing."""
    world.sim.admin.set_faults(mode="late", operation="create_moto_order", count=10)
    flow = world.start("moto", "approve")
    world.messages.chains.clear()  # the workers below take the step instead of the message
    lease = world.engine.lease
    for _ in range(world.engine.retry_policy.max_attempts):
        assert world.kill_mid_step(flow) == "killed", world.describe(flow)
        world.clock.advance(lease + 1)
        world.sim.admin.advance_clock(lease + 1)
    record = world.engine.get(flow.flow_id)
    assert world.engine.run_step(flow.flow_id, record.step) == FlowState.NEEDS_ATTENTION.value, world.describe(flow)
    stopped = world.engine.get(flow.flow_id)
    assert (stopped.error or {}).get("type") == "WorkerLost" and stopped.unsettled, stopped.summary()
    world.clock.advance(LATE - 5)  # more than the window after the second worker's lease, less after the third's
    world.sim.admin.advance_clock(LATE - 5)
    _cancel_reads_until_the_late_request_acts(world, flow.flow_id)
