"""How the CLI shows a flow's error: one line, each fact once (issue 27: a 401 read
``Unauthorized: create_moto_order: HTTP 401: Unauthorized; operation create_moto_order; status 401``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from durapay.config import GatewaySettings
from durapay.gateway import Catalogue, GatewayClient, GatewayError, Unauthorized
from durapay.service.cli._output import describe_error
from durapay.service.runtime import Runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.tasks.retry import RetryPolicy
from durapay.workflows.engine import Claim
from tests.service.cli.conftest import invoke
from tests.service.cli.test_flows_cmd import moto


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=27)) as server:
        yield server


def refused_key(simulator: SimulatorServer) -> GatewayError:
    """The simulator's own 401 for a wrong API key, as the gateway client raises it."""
    settings = GatewaySettings(base_url=simulator.base_url, api_key="not-the-key", timeout=5.0)
    with GatewayClient(settings) as client, pytest.raises(Unauthorized) as refused:
        client.call(Catalogue.get_order, "o-401")
    return refused.value


def test_a_refused_key_is_said_once(engine_side: Runtime, simulator: SimulatorServer) -> None:
    error = refused_key(simulator)
    record = engine_side.engine.start("moto", moto("o-401"))
    claim = engine_side.engine.claim(record.id, record.step)
    assert isinstance(claim, Claim)
    outcome = RetryPolicy(rng=random.Random(27)).on_error(error, Catalogue.create_moto_order, 1, resend=False)
    engine_side.engine.complete(claim, outcome)

    shown = invoke("flows", "show", record.id)
    assert shown.exit_code == 0, shown.output
    line = next(text for text in shown.stdout.splitlines() if text.startswith("error"))
    assert line.count("401") == 1, line
    assert line.count("Unauthorized") == 1, line
    assert line.count("get_order") == 1, line


def test_extras_not_in_the_message_are_kept() -> None:
    described = describe_error({"type": "ForeignOperation", "message": "order o-1 holds a payment", "operationId": "8001"})
    assert described == "ForeignOperation: order o-1 holds a payment; operationId 8001"


def test_a_number_inside_another_is_not_taken_as_said() -> None:
    described = describe_error({"type": "ServerError", "message": "refund_operation: HTTP 5003: x", "status": 500})
    assert described.endswith("; status 500")
