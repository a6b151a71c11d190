"""Fairness on real parts (``workflows.engine.fairness``): a Celery worker in this process consuming the keys'
queues, a dispatcher, the simulator over HTTP. A capped key's backlog runs to its end, never more of its
steps at once than its cap (read from the flows' own logs: claim to end, on the server's clock), each
flow paid once; another key's flows run meanwhile."""

from __future__ import annotations

import random
from contextlib import ExitStack

from celery.contrib.testing.worker import start_worker

from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_exactly_once import payments
from tests.workflows.integration.test_flows import APPROVE, card, order

CAP = 2


def test_a_capped_keys_backlog_runs_to_its_end_within_its_cap(
    redis_url: str, key_prefix: str, simulator: SimulatorServer
) -> None:
    simulator.admin.clear_faults()
    fairness = {
        "enabled": True,
        "weights": {"default/bulk": 1, "default/shop": 1},
        "caps": {"default/bulk": CAP},
        "hold_seconds": 5,
    }
    settings = stack_settings(key_prefix, simulator.base_url, fairness=fairness)
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(3))
    engine = runtime.engine
    with ExitStack() as stack:
        stack.callback(runtime.close)
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=4, perform_ping_check=False))
        dispatcher = Dispatcher(engine, interval=0.05).start()
        stack.callback(dispatcher.stop)
        bulk = [engine.start("moto", {"order": order(), "card": card(APPROVE)}, tenant="bulk") for _ in range(12)]
        shop = [engine.start("moto", {"order": order(), "card": card(APPROVE)}, tenant="shop") for _ in range(3)]
        ids = [record.id for record in bulk + shop]
        wait_until(lambda: all(record.finished for record in engine.store.many(ids)), 90, "every flow's end")
    records = engine.store.many(ids)
    assert {record.state for record in records} == {FlowState.SUCCEEDED}, [record.summary() for record in records]
    assert len(payments(simulator, [record.order_id for record in records])) == len(ids), "each flow paid once"
    # The bulk key's steps: never more than CAP between a claim and its end at once.
    moments: list[tuple[float, int]] = []
    for record in bulk:
        log = engine.store.history(record.id)
        claimed = [float(entry["t"]) for entry in log if entry["to"] == "running"]
        ended = [float(entry["t"]) for entry in log if entry["from"] == "running"]
        moments += [(at, 1) for at in claimed] + [(at, -1) for at in ended]
    running = peak = 0
    for _, change in sorted(moments, key=lambda moment: (moment[0], moment[1])):  # an end before a claim at one time
        running += change
        peak = max(peak, running)
    assert 1 <= peak <= CAP, peak
    assert engine.caps.held("default/bulk") == 0


def test_a_weighted_key_gets_its_weights_turns(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> None:
    """Both keys backlogged before a worker starts: a key of weight 2 has two queues, served two turns for
    the other key's one (kombu's rotation over the worker's queues), so the first claims go 2 to 1."""
    simulator.admin.clear_faults()
    fairness = {"enabled": True, "weights": {"default/heavy": 2, "default/light": 1}}
    settings = stack_settings(key_prefix, simulator.base_url, fairness=fairness)
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(4))
    engine = runtime.engine
    with ExitStack() as stack:
        stack.callback(runtime.close)
        heavy = [engine.start("moto", {"order": order(), "card": card(APPROVE)}, tenant="heavy").id for _ in range(24)]
        light = [engine.start("moto", {"order": order(), "card": card(APPROVE)}, tenant="light").id for _ in range(24)]
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=1, perform_ping_check=False))
        wait_until(lambda: all(record.finished for record in engine.store.many(heavy + light)), 120, "every flow's end")
    claimed = sorted(
        (float(next(entry["t"] for entry in engine.store.history(flow_id) if entry["to"] == "running")), flow_id in heavy)
        for flow_id in heavy + light
    )
    first = [is_heavy for _, is_heavy in claimed[:30]]
    assert 17 <= sum(first) <= 23, first  # 20 of 30 in turn; a reserved message or two either way
