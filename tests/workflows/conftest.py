"""Fixtures of the engine's tests: a manual clock, and an engine on the session's Valkey with a test prefix."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from config import load_settings
from tests.workflows.engine_support import T0, Sent
from workflows.clock import ManualClock
from workflows.engine import Engine
from workflows.steps import FlowDefinition


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def make_engine(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Iterator[Callable[..., tuple[Engine, Sent]]]:
    def make(definition: FlowDefinition, **options: Any) -> tuple[Engine, Sent]:
        settings = load_settings(
            {
                "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
                "retry": {"base_seconds": 1, "cap_seconds": 10, "max_attempts": 3, "reconcile_attempts": 3},
            }
        )
        sent = Sent()
        engine = Engine(
            settings, redis_client, {definition.kind: definition}, sender=sent, clock=options.pop("clock", clock), **options
        )
        return engine, sent

    yield make
