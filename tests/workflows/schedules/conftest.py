"""Integration fixtures for schedules: one simulator and one receiver for the session, a full stack per test.

``stack`` is a :class:`~tests.workflows.schedules.harness.Stack` on the session's Valkey with its own key
prefix, a started worker and no dispatcher (tests start as many as they need, or stop them to play a
scheduler that is down). The simulator is reset before each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durapay.simulator import SimulatorConfig, SimulatorServer
from tests.workflows.schedules.harness import Receiver, Stack, running_receiver

SIMULATOR = SimulatorConfig(seed=5, notify_backoff_ms=20, notify_backoff_cap_ms=100, sweep_interval_seconds=0.05)


@pytest.fixture(scope="session")
def simulator_server() -> Iterator[SimulatorServer]:
    with SimulatorServer(SIMULATOR) as server:
        yield server


@pytest.fixture(scope="session")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


@pytest.fixture
def sim(simulator_server: SimulatorServer) -> SimulatorServer:
    simulator_server.admin.reset()
    return simulator_server


@pytest.fixture
def stack(redis_url: str, key_prefix: str, sim: SimulatorServer, receiver: Receiver) -> Iterator[Stack]:
    with Stack(redis_url, key_prefix, sim, receiver) as built:
        built.start_worker()
        yield built
