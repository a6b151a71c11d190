"""Each fault mode, as the real gateway client sees it, and what the simulator recorded behind it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from durapay.config import GatewaySettings
from durapay.gateway import (
    Catalogue,
    ConnectionDropped,
    GatewayClient,
    GatewayError,
    GatewayTimeout,
    NotFound,
    RateLimited,
    ServerError,
)
from durapay.simulator import SimulatorAdminError, SimulatorServer
from tests.simulator.scenario import Scenario
from tests.simulator.support import card, order
from tests.waiting import wait_until


@pytest.fixture
def impatient(sim: SimulatorServer) -> Iterator[GatewayClient]:
    """A client that gives up after 0.3 s, for hangs."""
    with GatewayClient(GatewaySettings(base_url=sim.base_url, timeout=0.3)) as gateway:
        yield gateway


def _moto(client: GatewayClient, order_id: str) -> str:
    request = {"order": order(order_id), "card": card()}
    return client.call(Catalogue.create_moto_order, request=request).operation.operationId


def _idle(sim: SimulatorServer) -> bool:
    return bool(sim.admin.health()["inFlight"] == 0)


@pytest.mark.parametrize("status", [500, 503])
def test_error_answers_a_5xx_without_acting(client: GatewayClient, sim: SimulatorServer, status: int) -> None:
    sim.admin.set_faults(mode="error", status=status)
    with pytest.raises(ServerError) as failed:
        _moto(client, "o-1")
    assert failed.value.status_code == status and failed.value.codes == ("PS0000",)
    assert sim.admin.operations() == []


def test_error_429_carries_retry_after(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(mode="error", status=429, retry_after=7)
    with pytest.raises(RateLimited) as limited:
        client.call(Catalogue.list_payment_methods)
    assert limited.value.retry_after == 7.0


def test_a_rule_scoped_to_an_operation_and_a_count_hits_exactly_those_requests(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.set_faults(mode="error", status=500, operation="create_moto_order", count=2)
    client.call(Catalogue.list_payment_methods)  # another operation: untouched
    for order_id in ("o-1", "o-2"):
        with pytest.raises(ServerError):
            _moto(client, order_id)
    _moto(client, "o-3")
    [rule] = sim.admin.faults()["rules"]
    assert (rule["fired"], rule["remaining"]) == (2, 0)
    assert [op["orderId"] for op in sim.admin.operations()] == ["o-3"]


def test_error_rates_are_reproducible_with_a_seed(client: GatewayClient, sim: SimulatorServer) -> None:
    def pattern() -> list[bool]:
        sim.admin.reset()
        sim.admin.set_faults(seed=11, mode="error", status=503, rate=0.5)
        outcomes = []
        for _ in range(24):
            try:
                client.call(Catalogue.list_payment_methods)
                outcomes.append(True)
            except ServerError:
                outcomes.append(False)
        return outcomes

    first = pattern()
    assert first == pattern()
    assert True in first and False in first


def test_drop_closes_the_connection_without_acting(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(mode="drop", operation="create_moto_order", count=1)
    with pytest.raises(ConnectionDropped):
        _moto(client, "o-1")
    assert sim.admin.operations() == []


def test_commit_then_fail_500_records_the_operation_and_a_keyed_resend_replays_it(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    contract_id = Scenario(client, sim).contract()
    sim.admin.set_faults(mode="commit_then_fail", operation="create_mit_order", count=1)
    request = {"order": order("mit-1"), "contractId": contract_id}
    with pytest.raises(ServerError):
        client.call(Catalogue.create_mit_order, request=request, idempotency_key="k-1")
    [charge] = sim.admin.operations(idempotency_key="k-1")
    resent = client.call(Catalogue.create_mit_order, request=request, idempotency_key="k-1")
    assert resent.operation.operationId == charge["operationId"]
    assert len(sim.admin.operations(order_id="mit-1")) == 1


def test_commit_then_fail_with_drop_raises_connection_dropped_and_the_order_is_readable(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.set_faults(mode="commit_then_fail", drop=True, operation="create_moto_order", count=1)
    with pytest.raises(ConnectionDropped) as dropped:
        _moto(client, "o-1")
    assert dropped.value.ambiguous
    reconciled = client.call(Catalogue.get_order, "o-1")
    assert [op.operationResult for op in reconciled.operations] == ["EXECUTED"]


def test_commit_then_fail_scoped_to_one_step_of_three_steps(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(mode="commit_then_fail", operation="three_steps_payment", count=1)
    init = client.call(Catalogue.three_steps_init, request={"order": order("o-3s"), "card": card()})
    payment = {"operationId": init.operation.operationId, "order": order("o-3s"), "card": card()}
    with pytest.raises(ServerError):
        client.call(Catalogue.three_steps_payment, request=payment)
    assert client.call(Catalogue.get_operation, init.operation.operationId).operationResult == "EXECUTED"
    with pytest.raises(GatewayError):  # a blind resend is refused: the payment already happened
        client.call(Catalogue.three_steps_payment, request=payment)


def test_late_answers_500_acts_only_when_released_and_a_later_duplicate_is_refused(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.set_faults(mode="late", operation="create_moto_order", count=1)
    with pytest.raises(ServerError) as failed:
        _moto(client, "o-late")
    assert failed.value.ambiguous
    with pytest.raises(NotFound):  # read back now: nothing yet
        client.call(Catalogue.get_order, "o-late")
    assert sim.admin.faults()["late"] == 1
    assert sim.admin.release_late() == [200]
    [charge] = sim.admin.operations(order_id="o-late")
    assert charge["operationResult"] == "EXECUTED"
    assert sim.admin.release_late() == [], "a held request acts once"


def test_late_after_a_resend_is_refused_as_a_duplicate_order(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(mode="late", drop=True, operation="create_moto_order", count=1)
    with pytest.raises(ConnectionDropped):
        _moto(client, "o-late-2")
    first = _moto(client, "o-late-2")  # the client read nothing back and sent again: this one acts
    [status] = sim.admin.release_late()
    assert status == 400, "the late copy of the same order is refused (orderId already used)"
    assert [op["operationId"] for op in sim.admin.operations(order_id="o-late-2")] == [first]


def test_a_late_keyed_request_replays_the_answer_of_a_retry_that_came_first(client: GatewayClient, sim: SimulatorServer) -> None:
    contract_id = Scenario(client, sim).contract()
    sim.admin.set_faults(mode="late", operation="create_mit_order", count=1)
    request = {"order": order("mit-late"), "contractId": contract_id}
    with pytest.raises(ServerError):
        client.call(Catalogue.create_mit_order, request=request, idempotency_key="k-late")
    retried = client.call(Catalogue.create_mit_order, request=request, idempotency_key="k-late")
    assert sim.admin.release_late() == [200]
    [charge] = sim.admin.operations(order_id="mit-late")
    assert charge["operationId"] == retried.operation.operationId


def test_hang_without_commit_times_the_client_out_and_records_nothing(
    impatient: GatewayClient, client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.set_faults(mode="hang", seconds=0.6, operation="create_moto_order", count=1)
    with pytest.raises(GatewayTimeout) as timed_out:
        _moto(impatient, "o-1")
    assert timed_out.value.ambiguous
    wait_until(lambda: _idle(sim), what="the hanging request to end")
    assert sim.admin.operations() == []
    with pytest.raises(NotFound):  # read by a patient client: 0.3 s is too short for a loaded machine
        client.call(Catalogue.get_order, "o-1")


def test_hang_with_commit_times_the_client_out_after_recording(impatient: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(mode="hang", commit=True, seconds=0.6, operation="create_moto_order", count=1)
    with pytest.raises(GatewayTimeout):
        _moto(impatient, "o-1")
    assert [op["orderId"] for op in sim.admin.operations()] == ["o-1"]
    wait_until(lambda: _idle(sim), what="the hanging request to end")


def test_fixed_latency_delays_and_concurrent_requests_overlap(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(latency_ms=200)
    started = time.monotonic()
    client.call(Catalogue.list_payment_methods)
    assert time.monotonic() - started >= 0.2
    sim.admin.set_faults(latency_ms=3000)
    threads = [threading.Thread(target=client.call, args=(Catalogue.list_payment_methods,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    # The simulator holds all eight at once (a serializing server would hold one): seen, not timed.
    wait_until(lambda: sim.admin.health()["inFlight"] == 8, what="eight requests in flight together")
    for thread in threads:
        thread.join(timeout=30)


def test_a_latency_rule_delays_only_its_operation_and_leaves_the_global_latency(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.set_faults(mode="latency", operation="list_payment_methods", latency_ms=300, count=1)
    assert sim.admin.faults()["latency_ms"] == 0, "a rule's latency_ms is the rule's, not every request's"
    client.call(Catalogue.get_exchange_rates)
    [rule] = sim.admin.faults()["rules"]
    assert (rule["remaining"], rule["fired"]) == (1, 0), "another operation does not take the rule"
    started = time.monotonic()
    client.call(Catalogue.list_payment_methods)
    assert time.monotonic() - started >= 0.3
    [rule] = sim.admin.faults()["rules"]
    assert (rule["remaining"], rule["fired"]) == (0, 1), "its operation took it, once"
    client.call(Catalogue.list_payment_methods)
    [rule] = sim.admin.faults()["rules"]
    assert (rule["remaining"], rule["fired"]) == (0, 1), "a spent rule delays nothing more"


def test_random_latency_is_at_least_the_fixed_part(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(latency_ms=50, latency_jitter_ms=100, seed=3)
    assert (sim.admin.faults()["latency_ms"], sim.admin.faults()["latency_jitter_ms"]) == (50, 100)
    for _ in range(5):
        started = time.monotonic()
        client.call(Catalogue.list_payment_methods)
        assert time.monotonic() - started >= 0.05  # (no upper bound: the machine may be slow)


def test_clearing_faults_restores_the_start_up_settings(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(mode="error", status=500, latency_ms=80)
    sim.admin.clear_faults()
    assert sim.admin.faults() == {"latency_ms": 0, "latency_jitter_ms": 0, "seed": 7, "rules": [], "late": 0}
    client.call(Catalogue.list_payment_methods)


@pytest.mark.parametrize(
    "rule",
    [
        {"mode": "explode"},
        {"mode": "error", "status": 200},
        {"mode": "error", "operation": "no_such_operation"},
        {"mode": "error", "typo": 1},
    ],
)
def test_an_invalid_fault_rule_is_refused_with_the_reason(sim: SimulatorServer, rule: dict[str, object]) -> None:
    with pytest.raises(SimulatorAdminError) as refused:
        sim.admin.set_faults(**rule)
    assert refused.value.status == 400 and "rule 0" in str(refused.value)
    assert sim.admin.faults()["rules"] == []


def test_throttle_answers_429_beyond_its_rate_and_counts_them(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_faults(mode="throttle", per_second=1, burst=3, retry_after=2)
    answers = []
    for _ in range(6):
        try:
            client.call(Catalogue.list_payment_methods)
            answers.append("ok")
        except RateLimited as limited:
            answers.append(f"429 after {limited.retry_after}")
    assert answers[:3] == ["ok"] * 3  # the burst
    assert answers[3:] == ["429 after 2.0"] * 3  # within a second, beyond the rate
    assert sim.admin.faults()["rules"][0]["fired"] == 3


def test_a_request_held_by_a_fault_shows_as_served_by_its_operation_before_it_acts(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    """``/_sim/health``'s ``serving``: a test can act between a call's arrival and its effect."""
    sim.admin.set_faults(mode="latency", operation="create_moto_order", latency_ms=1500, count=1)
    thread = threading.Thread(target=_moto, args=(client, "o-served"))
    thread.start()
    wait_until(lambda: sim.admin.serving("create_moto_order") == 1, what="the payment to arrive")
    assert sim.admin.health()["serving"] == {"create_moto_order": 1}
    assert not sim.admin.operations(orderId="o-served"), "arrived, not acted yet"
    thread.join(timeout=30)
    assert sim.admin.operations(orderId="o-served") and sim.admin.health()["serving"] == {}
