"""Session flows (pages the customer uses) where the answer of the create was lost.

The engine runs the real flow step by step on a manual clock against the simulator over HTTP, so the
reads that replace a lost answer can be driven without waiting in real time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from config import load_settings
from simulator import SimulatorConfig, SimulatorServer
from workflows.clock import ManualClock
from workflows.engine import Engine
from workflows.flows import REGISTRY
from workflows.flows.sessions import ADOPTED_READ_SECONDS
from workflows.states import FlowState


@pytest.fixture
def engine(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with SimulatorServer(SimulatorConfig(seed=3)) as sim:
        settings = load_settings(
            {
                "gateway": {"base_url": sim.base_url, "timeout": 3.0, "connect_timeout": 1.0},
                "engine": {"key_prefix": key_prefix, "partitions": 2},
                "receiver": {"public_url": "http://127.0.0.1:9/notifications"},
            }
        )
        yield Engine(settings, redis_client, REGISTRY, clock=ManualClock(sim.admin.now().timestamp())), sim


def step_until(engine: Engine, flow_id: str, states: set[FlowState], limit: int = 10) -> Any:
    """Run the flow's due steps on the manual clock until it reaches one of ``states``."""
    assert isinstance(engine.clock, ManualClock)
    for _ in range(limit):
        record = engine.get(flow_id)
        if record.state in states:
            return record
        if record.due is not None and record.due > engine.clock.now():
            engine.clock.advance(record.due - engine.clock.now() + 0.001)
        engine.run_step(flow_id, record.step)
    raise AssertionError(f"flow {flow_id} did not reach {states}: {engine.get(flow_id).summary()}")


def link_input(order_id: str) -> dict[str, Any]:
    expires = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
    return {
        "order": {"orderId": order_id, "amount": "2500", "currency": "EUR"},
        "paymentSession": {"actionType": "PAY", "amount": "2500", "language": "eng", "resultUrl": "https://shop.example/r"},
        "expirationDate": expires,
    }


def test_an_adopted_link_is_read_until_paid_because_its_notifications_cannot_be_verified(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, sim = engine
    sim.admin.set_faults(mode="commit_then_fail", operation="create_paybylink_v3", count=1)
    started = flows.start("paybylink", link_input("adopt-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    created = waiting.outputs["create"]
    assert created["adopted"] is True and created["securityToken"] is None
    assert waiting.due == pytest.approx(flows.clock.now() + ADOPTED_READ_SECONDS, abs=1), "read soon, not at expiry"
    assert flows.tokens_for_order(waiting.order_id) == []

    flows.clock.advance(ADOPTED_READ_SECONDS + 1)
    flows.run_step(started.id, "payment")
    still = flows.get(started.id)
    assert still.state is FlowState.WAITING, "an unpaid, open link is read again later, not failed"
    assert still.due is not None and still.due > flows.clock.now()

    paid = sim.admin.complete_link(created["paymentLink"]["linkId"])
    done = step_until(flows, started.id, {FlowState.SUCCEEDED, FlowState.FAILED})
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]
    assert len(sim.admin.operations(order_id=waiting.order_id)) == 1, "one link, one payment"
