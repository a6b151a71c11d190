"""Session flows (pages the customer uses) where the answer of the create was lost.

The engine runs the real flow step by step on a manual clock against the simulator over HTTP, so the
reads that replace a lost answer can be driven without waiting in real time.
"""

from __future__ import annotations

import pytest
import redis

from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.session_engine import engine, link_input, session_engine, step_until

__all__ = ["engine"]


def test_an_adopted_link_is_read_until_paid_because_its_notifications_cannot_be_verified(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, sim = engine
    sim.admin.set_faults(mode="commit_then_fail", operation="create_paybylink_v3", count=1)
    started = flows.start("paybylink", link_input("adopt-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    created = waiting.outputs["create"]
    assert created["adopted"] is True and created["securityToken"] is None
    first_read = flows.retry_policy.read_pace_seconds
    assert waiting.due == pytest.approx(flows.clock.now() + first_read, abs=1), "read soon, not at expiry"
    assert flows.tokens_for_order(waiting.order_id) == []

    flows.clock.advance(first_read + 1)
    flows.run_step(started.id, "payment")
    still = flows.get(started.id)
    assert still.state is FlowState.WAITING, "an unpaid, open link is read again later, not failed"
    assert still.due is not None and still.due > flows.clock.now()

    paid = sim.admin.complete_link(created["paymentLink"]["linkId"])
    done = step_until(flows, started.id, {FlowState.SUCCEEDED, FlowState.FAILED})
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]
    assert len(sim.admin.operations(order_id=waiting.order_id)) == 1, "one link, one payment"


def test_an_adopted_link_is_first_read_after_the_read_pace_setting(redis_client: redis.Redis, key_prefix: str) -> None:
    """DURAPAY_RETRY__READ_PACE_SECONDS (5 minutes) sets that first read: it was a constant, and a chaos
    run whose link was adopted waited 284 s for it after its flows had otherwise finished."""
    with session_engine(redis_client, key_prefix, retry={"read_pace_seconds": 20}) as (flows, sim):
        sim.admin.set_faults(mode="commit_then_fail", operation="create_paybylink_v3", count=1)
        started = flows.start("paybylink", link_input("adopt-pace"))
        waiting = step_until(flows, started.id, {FlowState.WAITING})
        assert waiting.outputs["create"]["adopted"] is True
        assert waiting.due == pytest.approx(flows.clock.now() + 20, abs=1)
