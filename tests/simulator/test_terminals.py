"""Terminals on the simulator (``SimulatorConfig.terminal_keys``): each key is one terminal, sees its own
orders and operations only, lists its own, and every order is recorded with the terminal whose key made it;
a fault rule may name one terminal."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durapay.config import GatewaySettings
from durapay.gateway import Catalogue, GatewayClient, NotFound, ServerError, Unauthorized
from durapay.simulator import Clock, SimulatorConfig, SimulatorServer, SimulatorState
from tests.simulator.support import APPROVE, card, order

IT_KEY = "sim-key-terminal-it"


@pytest.fixture(scope="module")
def two_terminals() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=3, terminal_keys={IT_KEY: "it"})) as server:
        yield server


def client_of(sim: SimulatorServer, key: str) -> GatewayClient:
    return GatewayClient(GatewaySettings(base_url=sim.base_url, api_key=key, timeout=5.0))  # type: ignore[arg-type]


def test_each_key_is_its_terminal_and_sees_only_its_own_orders(two_terminals: SimulatorServer) -> None:
    sim = two_terminals
    sim.admin.reset()
    with client_of(sim, sim.config.api_key) as default, client_of(sim, IT_KEY) as it, client_of(sim, "no-such-key") as stranger:
        paid_it = it.call(Catalogue.create_moto_order, request={"order": order("term-it-1"), "card": card(APPROVE)}).operation
        paid_default = default.call(
            Catalogue.create_moto_order, request={"order": order("term-df-1"), "card": card(APPROVE)}
        ).operation
        assert it.call(Catalogue.get_operation, paid_it.operationId).operationId == paid_it.operationId
        with pytest.raises(NotFound):  # another terminal's operation: not found for this key
            default.call(Catalogue.get_operation, paid_it.operationId)
        with pytest.raises(NotFound):
            it.call(Catalogue.get_order, "term-df-1")
        with pytest.raises(NotFound):  # nor can it refund it
            it.call(
                Catalogue.refund_operation,
                paid_default.operationId,
                request={"amount": "100", "currency": "EUR"},
                idempotency_key="term-r1",
            )
        with pytest.raises(Unauthorized):
            stranger.call(Catalogue.get_operation, paid_it.operationId)
        listed_it = {op.operationId for op in it.call(Catalogue.list_operations, request={}).operations}
        listed_default = {op.operationId for op in default.call(Catalogue.list_operations, request={}).operations}
    assert paid_it.operationId in listed_it and paid_default.operationId not in listed_it
    assert paid_default.operationId in listed_default and paid_it.operationId not in listed_default
    terminals = {op["orderId"]: op["terminal"] for op in sim.admin.operations()}
    assert terminals == {"term-it-1": "it", "term-df-1": "default"}
    assert sim.simulator.state.terminal_refusals == 3


def test_a_fault_rule_naming_a_terminal_fails_only_that_terminals_calls(two_terminals: SimulatorServer) -> None:
    sim = two_terminals
    sim.admin.reset()
    sim.admin.clear_faults()
    sim.admin.set_faults(mode="error", status=503, terminal="it")
    try:
        with client_of(sim, sim.config.api_key) as default, client_of(sim, IT_KEY) as it:
            with pytest.raises(ServerError):
                it.call(Catalogue.create_moto_order, request={"order": order("term-it-2"), "card": card(APPROVE)})
            paid = default.call(Catalogue.create_moto_order, request={"order": order("term-df-2"), "card": card(APPROVE)})
            assert paid.operation.operationResult == "EXECUTED"
    finally:
        sim.admin.clear_faults()


def test_terminal_keys_may_not_take_the_default_terminal() -> None:
    with pytest.raises(ValueError, match="terminal_keys"):
        SimulatorConfig(terminal_keys={"k-1234": "default"})
    with pytest.raises(ValueError, match="terminal_keys"):
        SimulatorConfig(api_key="same-key", terminal_keys={"same-key": "it"})


def test_without_terminal_keys_every_order_is_defaults(sim: SimulatorServer, client: GatewayClient) -> None:
    client.call(Catalogue.create_moto_order, request={"order": order("term-none-1"), "card": card(APPROVE)})
    assert all("terminal" not in op for op in sim.admin.operations())  # nothing recorded, nothing shown


def test_the_terminal_of_each_order_is_kept_in_the_state_snapshot(two_terminals: SimulatorServer) -> None:
    """A simulator restarted from its state file (``--state-file``) still knows whose each order is."""
    sim = two_terminals
    sim.admin.reset()
    with client_of(sim, IT_KEY) as it:
        it.call(Catalogue.create_moto_order, request={"order": order("term-it-snap"), "card": card(APPROVE)})
    restored = SimulatorState(Clock())
    restored.restore(sim.admin.snapshot())
    assert restored.terminal_of_order("term-it-snap") == "it"
    assert restored.terminal_of_order("term-unknown") == "default"
