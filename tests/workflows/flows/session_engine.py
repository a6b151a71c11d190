"""The session flows' test engine: the real flows, step by step on a manual clock, against the simulator
over HTTP (so reads that replace a lost answer, and deadlines, are driven without waiting)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.tasks.runner import StepContext
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows import REGISTRY


@contextmanager
def session_engine(
    redis_client: redis.Redis,
    key_prefix: str,
    *,
    retry: dict[str, Any] | None = None,
    gateway_health: dict[str, Any] | None = None,
    **engine: Any,
) -> Iterator[tuple[Engine, SimulatorServer]]:
    """The engine of every flow kind on a manual clock at the simulator's time, with ``engine`` (and
    ``retry``, ``gateway_health``) settings."""
    with SimulatorServer(SimulatorConfig(seed=3)) as sim:
        settings = load_settings(
            {
                "gateway": {"base_url": sim.base_url, "timeout": 3.0, "connect_timeout": 1.0},
                "engine": {"key_prefix": key_prefix, "partitions": 2, **engine},
                "receiver": {"public_url": "http://127.0.0.1:9/notifications"},
                "retry": retry or {},
                "gateway_health": gateway_health or {},
            }
        )
        yield Engine(settings, redis_client, REGISTRY, clock=ManualClock(sim.admin.now().timestamp())), sim


@pytest.fixture
def engine(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with session_engine(redis_client, key_prefix) as made:
        yield made


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


def context_at(*, now: float, created: float) -> StepContext:
    """A step context with no gateway behind it, for the rules that judge what a read found."""
    return StepContext(
        flow_id="f", kind="paybylink", step="payment", input=None, outputs={}, attempt=0, now=now,
        idempotency_key="k", order_id="o", client=None, created=created,  # type: ignore[arg-type]
    )  # fmt: skip
