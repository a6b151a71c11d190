"""The real parts for the engine's integration tests: Valkey, the simulator over HTTP, a Celery worker.

``stack`` builds a runtime exactly as ``durapay worker`` does (``service.runtime.build_runtime``), with
short leases and backoffs so that failures heal within seconds, runs a Celery worker (threads pool) in
this process and a dispatcher thread; each test gets its own key prefix. Tests that kill workers start
``durapay worker`` as a separate process instead (see ``processes.py``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from durapay.config import Settings, load_settings
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import OffsetClock
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord


@pytest.fixture(scope="session")
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=7)) as sim:
        yield sim


def stack_settings(key_prefix: str, base_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "gateway": {"base_url": base_url, "timeout": 2.0, "connect_timeout": 1.0},
        "engine": {"key_prefix": key_prefix, "lease_seconds": 4.0, "dispatch_interval": 0.05, "partitions": 2},
        "retry": {"base_seconds": 0.05, "cap_seconds": 0.5, "max_attempts": 6, "reconcile_attempts": 6},
        "receiver": {"public_url": "http://127.0.0.1:9/notifications"},
    }
    for group, value in overrides.items():
        values[group] = {**values.get(group, {}), **value} if isinstance(value, dict) else value
    return load_settings(values)


@dataclass
class Stack:
    runtime: Runtime
    simulator: SimulatorServer
    dispatcher: Dispatcher
    #: The engine's clock when the test moves it (``clocked_stack``); the server's clock otherwise.
    clock: OffsetClock | None = None

    def pass_deadline(self, flow_id: str) -> FlowRecord:
        """Move the engine's clock past the waiting flow's deadline (the dispatcher then runs its step):
        a test acts before a deadline however slow the machine, and need not wait for it either."""
        assert self.clock is not None, "only a clocked_stack's clock can be moved"
        record = self.engine.get(flow_id)
        assert record.state is FlowState.WAITING and record.wait is not None, record.summary()
        self.clock.offset += float(record.wait["deadline"]) - self.clock.now() + 5.0
        return record

    @property
    def engine(self) -> Engine:
        return self.runtime.engine

    def run(self, kind: str, data: dict[str, Any], timeout: float = 30.0, **start: Any) -> FlowRecord:
        record = self.engine.start(kind, data, **start)
        return self.engine.wait(record.id, timeout)


@pytest.fixture
def stack(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Stack]:
    yield from _stack(redis_url, key_prefix, simulator, None)


@pytest.fixture
def clocked_stack(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Stack]:
    """The same parts, the engine on a clock the test moves (``Stack.pass_deadline``)."""
    yield from _stack(redis_url, key_prefix, simulator, OffsetClock())


def _stack(redis_url: str, key_prefix: str, simulator: SimulatorServer, clock: OffsetClock | None) -> Iterator[Stack]:
    simulator.admin.clear_faults()
    settings = stack_settings(key_prefix, simulator.base_url)
    runtime = build_runtime(settings, redis_url=redis_url, clock=clock, rng=random.Random(11))
    dispatcher = Dispatcher(runtime.engine, interval=0.05)
    with ExitStack() as stack:
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=4, perform_ping_check=False))
        dispatcher.start()
        stack.callback(dispatcher.stop)
        yield Stack(runtime, simulator, dispatcher, clock)
    simulator.admin.clear_faults()
    runtime.close()
