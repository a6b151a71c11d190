"""Serving: free ports, start/stop without a context, a state file that survives a restart, throughput."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from durapay.config import GatewaySettings
from durapay.gateway import Catalogue, GatewayClient, GatewayError
from durapay.simulator import SimulatorConfig, SimulatorServer
from tests.simulator.support import card, order, session
from tests.waiting import wait_until


def test_two_simulators_run_side_by_side_on_free_ports() -> None:
    first = SimulatorServer(SimulatorConfig(seed=1)).start()
    second = SimulatorServer(SimulatorConfig(seed=1, api_key="other")).start()
    try:
        assert first.port != second.port
        assert first.base_url == f"http://127.0.0.1:{first.port}/api/phoenix-0.0/psp/api/v1"
        with GatewayClient(GatewaySettings(base_url=second.base_url, api_key="other")) as client:
            client.call(Catalogue.create_moto_order, request={"order": order("o-1"), "card": card()})
        assert second.state.find_operations(order_id="o-1") and not first.state.find_operations()
    finally:
        first.stop()
        second.stop()
    with pytest.raises(RuntimeError, match="not running"):
        _ = first.root_url


def test_the_state_file_keeps_orders_and_idempotency_keys_across_a_restart(tmp_path: Path) -> None:
    state_file = tmp_path / "sim-state.json"
    config = SimulatorConfig(state_file=state_file)
    with SimulatorServer(config) as sim, GatewayClient(GatewaySettings(base_url=sim.base_url)) as client:
        payment = client.call(Catalogue.create_moto_order, request={"order": order("o-1"), "card": card()}).operation
        refund = client.call(Catalogue.refund_operation, payment.operationId, request={"amount": "100"}, idempotency_key="r-1")
        first = client.call(Catalogue.create_hpp_order, request={"order": order("o-h"), "paymentSession": session()})
    assert state_file.exists()
    with SimulatorServer(config) as sim, GatewayClient(GatewaySettings(base_url=sim.base_url)) as client:
        assert client.call(Catalogue.get_order, "o-1").orderStatus.capturedAmount == 1400
        again = client.call(Catalogue.refund_operation, payment.operationId, request={"amount": "100"}, idempotency_key="r-1")
        assert again == refund
        fresh = client.call(Catalogue.create_moto_order, request={"order": order("o-2"), "card": card()}).operation
        assert fresh.operationId not in (payment.operationId, refund.operationId)
        second = client.call(Catalogue.create_hpp_order, request={"order": order("o-3"), "paymentSession": session()})
        assert second.securityToken != first.securityToken  # random ids and tokens continue, never repeat


def test_injected_latency_overlaps_across_concurrent_workers() -> None:
    """The engine benchmark's shape: several workers, 20 ms per request, hundreds of requests."""
    with SimulatorServer(SimulatorConfig(latency_ms=20)) as sim:
        settings = GatewaySettings(base_url=sim.base_url)
        per_worker, workers = 50, 4
        errors: list[GatewayError] = []

        def worker(number: int) -> None:
            with GatewayClient(settings) as client:
                for n in range(per_worker):
                    try:
                        client.call(Catalogue.create_moto_order, request={"order": order(f"w{number}-{n}"), "card": card()})
                    except GatewayError as exc:  # collected and asserted below
                        errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(workers)]
        most_in_flight = 0

        def overlap_seen_or_all_done() -> bool:
            nonlocal most_in_flight
            most_in_flight = max(most_in_flight, sim.admin.health()["inFlight"])
            return most_in_flight >= 2 or not any(thread.is_alive() for thread in threads)

        for thread in threads:
            thread.start()
        # Each worker spends most of every request in the simulator's 20 ms of latency; a server that
        # served one request at a time would never hold two. Seen through its in-flight count, not timed.
        wait_until(overlap_seen_or_all_done, timeout=120, what="two requests in flight together, or the workers done")
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert len(sim.state.find_operations()) == per_worker * workers
        assert most_in_flight >= 2, "the injected latency of concurrent requests overlaps"
