"""Redis (Valkey with AOF) restarted in the middle of a batch of flows: none lost, none charged twice.

This test owns its Valkey (broker and flow records both live there), restarts it while flows are in
every stage, and checks at the gateway that each order was charged exactly once.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker

from durapay.config.embedded import EmbeddedValkey
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import STOPPED, FlowState
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_durability import charges, one_operation_per_key
from tests.workflows.integration.test_flows import APPROVE, card, order

FLOWS = 24


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[EmbeddedValkey]:
    with EmbeddedValkey(tmp_path / "valkey", appendfsync="always") as server:
        yield server


@pytest.mark.integration
@pytest.mark.chaos
@pytest.mark.parametrize("crash", [False, True], ids=["graceful-restart", "kill-9-restart"])
def test_redis_restart_mid_batch(own_valkey: EmbeddedValkey, simulator: SimulatorServer, key_prefix: str, crash: bool) -> None:
    simulator.admin.clear_faults()
    simulator.admin.set_faults(rules=[{"mode": "latency", "latency_ms": 150}])
    settings = stack_settings(key_prefix, simulator.base_url, engine={"lease_seconds": 5.0})
    runtime = build_runtime(settings, redis_url=own_valkey.url, rng=random.Random(3))
    engine = runtime.engine
    dispatcher = Dispatcher(engine, interval=0.05)
    try:
        with ExitStack() as stack:
            stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=6, perform_ping_check=False))
            dispatcher.start()
            stack.callback(dispatcher.stop)
            kinds = ["moto", "three_steps"]
            ids = [engine.start(kinds[i % 2], {"order": order(1000 + i), "card": card(APPROVE)}).id for i in range(FLOWS)]
            # Restart while some flows are done and others are still in flight.
            wait_until(lambda: sum(engine.get(i).state is FlowState.SUCCEEDED for i in ids) >= 3, what="a few flows to finish")
            unfinished = sum(engine.get(i).state not in STOPPED for i in ids)
            own_valkey.restart(crash=crash)
            records = [engine.wait(flow_id, 120) for flow_id in ids]
        assert unfinished > 0, "the restart must hit flows still in flight"
        assert all(record.state in STOPPED for record in records)
        assert [r.summary() for r in records if r.state is not FlowState.SUCCEEDED] == []
        for record in records:
            assert len(charges(simulator, record.order_id)) == 1, record.summary()
        one_operation_per_key(simulator)
    finally:
        simulator.admin.clear_faults()
        runtime.close()
