"""Fixtures of the engine's tests: a manual clock, and an engine on the session's Valkey with a test prefix."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.steps import FlowDefinition
from tests.workflows.aof_tail import AofTail
from tests.workflows.engine_support import T0, Sent
from tests.workflows.flow_model import simulator_config


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def make_engine(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Iterator[Callable[..., tuple[Engine, Sent]]]:
    def make(definition: FlowDefinition, **options: Any) -> tuple[Engine, Sent]:
        settings = load_settings(
            {
                "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3, **options.pop("engine", {})},
                "retry": {"base_seconds": 1, "cap_seconds": 10, "max_attempts": 3, "reconcile_attempts": 3},
                "gateway": options.pop("gateway", {}),
                "terminals": options.pop("terminals", {}),
            }
        )
        sent = Sent()
        engine = Engine(
            settings, redis_client, {definition.kind: definition}, sender=sent, clock=options.pop("clock", clock), **options
        )
        return engine, sent

    yield make


@pytest.fixture(scope="module")
def model_parts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimulatorServer, AofTail]]:
    """The flow model's own Valkey (its AOF is cut) and simulator (``flow_model.py``)."""
    tail = AofTail(tmp_path_factory.mktemp("model-valkey"))
    tail.start()
    with SimulatorServer(simulator_config()) as sim:
        yield sim, tail
    tail.stop()
