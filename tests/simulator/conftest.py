"""Fixtures: one simulator for the session (reset before each test), a gateway client, a receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durapay.config import GatewaySettings
from durapay.gateway import GatewayClient
from durapay.simulator import SimulatorConfig, SimulatorServer
from tests.simulator.support import Receiver

#: Fast notification retries so that retry tests take milliseconds, not minutes.
TEST_CONFIG = SimulatorConfig(seed=7, notify_backoff_ms=20, notify_backoff_cap_ms=100, sweep_interval_seconds=0.05)


@pytest.fixture(scope="session")
def simulator_server() -> Iterator[SimulatorServer]:
    with SimulatorServer(TEST_CONFIG) as server:
        yield server


@pytest.fixture
def sim(simulator_server: SimulatorServer) -> SimulatorServer:
    simulator_server.admin.reset()
    return simulator_server


@pytest.fixture
def client(sim: SimulatorServer) -> Iterator[GatewayClient]:
    with GatewayClient(GatewaySettings(base_url=sim.base_url, timeout=5.0)) as gateway:
        yield gateway


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()
