"""The gateway's health shared by every worker (``workflows.engine.gate``), end to end: real Valkey, a real Celery
worker, the simulator over HTTP with its faults.

* An outage of about 15 s (every call 503, then every call hanging past the client's timeout) among
  100 flows started before and during it: none fails, none needs a person, none is charged twice,
  every one finishes by itself once the gateway is back, with few attempts each; the breaker's opening
  and closing are in the merchant events and in ``/metrics``. Without the breaker the same retry
  settings (4 attempts within about a second) would end them all in ``needs_attention``.
* An outage longer than ``outage_seconds``: a flow whose money call may have reached the gateway ends
  in ``needs_attention``, one whose call never left ends ``failed``, both with the reason.

* On a Redis Cluster the gate opens and closes, its events written in its own slot.

The full acceptance run (500 flows, 150 s) is ``bench/outage.py``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from redis.cluster import RedisCluster

from durapay.gateway import ServerError
from durapay.service.metrics import render
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.clock import OffsetClock
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.events import EventFeed
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.states import STOPPED, FlowState
from tests.waiting import wait_until
from tests.workflows.engine.test_gate import Time, make_gate
from tests.workflows.integration.conftest import Stack, stack_settings
from tests.workflows.integration.test_flows import APPROVE, card, order
from tests.workflows.integration.topology import ValkeyCluster

pytestmark = pytest.mark.integration

HEALTH = {"failures": 3, "window_seconds": 30, "open_seconds": 2, "rate_per_second": 40, "burst": 20}


def health_stack(redis_url: str, key_prefix: str, simulator: SimulatorServer, **health: Any) -> Iterator[Stack]:
    simulator.admin.clear_faults()
    settings = stack_settings(
        key_prefix,
        simulator.base_url,
        gateway={"timeout": 1.0, "connect_timeout": 0.5},
        retry={"max_attempts": 4, "reconcile_attempts": 4},
        gateway_health={**HEALTH, **health},
    )
    clock = OffsetClock()
    runtime = build_runtime(settings, redis_url=redis_url, clock=clock, rng=random.Random(28))
    dispatcher = Dispatcher(runtime.engine, interval=0.05)
    with ExitStack() as stack:
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=8, perform_ping_check=False))
        dispatcher.start()
        stack.callback(dispatcher.stop)
        yield Stack(runtime, simulator, dispatcher, clock)
    simulator.admin.clear_faults()
    runtime.close()


@pytest.fixture
def healthy(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Stack]:
    yield from health_stack(redis_url, key_prefix, simulator)


@pytest.fixture
def bounded(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Stack]:
    yield from health_stack(redis_url, key_prefix, simulator, failures=1, open_seconds=120, outage_seconds=10)


def start(stack: Stack, number: int) -> str:
    kind = ("moto", "card_verification", "wallet")[number % 3]
    if kind == "moto":
        data: dict[str, Any] = {"order": order(), "card": card()}
    elif kind == "card_verification":
        data = {"order": order(0), "card": card()}
    else:
        data = {"order": order(), "walletPaymentData": {"pan": APPROVE}}
    return stack.engine.start(kind, data).id


def test_an_outage_among_100_flows_fails_none_and_every_flow_finishes_after_it(healthy: Stack) -> None:
    engine, admin = healthy.engine, healthy.simulator.admin
    before = [start(healthy, n) for n in range(40)]
    admin.set_faults(mode="error", status=503)
    began = time.monotonic()
    during = [start(healthy, n) for n in range(40, 70)]
    wait_until(lambda: engine.gate.status().state != "closed", timeout=20, what="the breaker to open")
    time.sleep(7)  # the outage goes on: 503s (a bounded pause of the test's own making, not a wait on a condition)
    admin.clear_faults()
    admin.set_faults(mode="hang", seconds=3)
    during += [start(healthy, n) for n in range(70, 100)]
    time.sleep(7)
    admin.clear_faults()
    outage = time.monotonic() - began
    flows = before + during
    finished = wait_until(
        lambda: all(engine.get(f).state in STOPPED for f in flows) or None, timeout=120, what="every flow to finish"
    )
    assert finished
    assert outage >= 14
    records = [engine.get(f) for f in flows]
    states = Counter(r.state for r in records)
    assert states == {FlowState.SUCCEEDED: 100}, {s: n for s, n in states.items()}
    retried = [sum("will be retried" in (e.get("what") or "") for e in engine.history(r.id)) for r in records]
    deferred = [sum("gateway unavailable" in (e.get("what") or "") for e in engine.history(r.id)) for r in records]
    assert max(retried) <= 4, retried  # attempts used: only the calls that failed before the breaker opened
    assert sum(deferred) > 0
    assert max(deferred) <= 40, deferred  # a flow looks again about every open_seconds, never in a hot loop
    # The simulator serves the whole test process: count this test's orders only (another test's
    # reservation order holds its payment and its charges, EXECUTED each).
    ours = {r.order_id for r in records}
    executed = Counter(
        op["orderId"]
        for op in admin.operations()
        if op.get("orderId") in ours and op.get("operationResult") == "EXECUTED" and op.get("operationType") != "REFUND"
    )
    assert len(executed) >= 60, executed  # moto and wallet payments (a card verification takes no money)
    assert all(count == 1 for count in executed.values()), [o for o, n in executed.items() if n > 1]
    kinds = [event.type for event, _ in engine.events(types=["gateway.unavailable", "gateway.recovered"])]
    assert kinds and kinds[0] == "gateway.unavailable" and kinds[-1] == "gateway.recovered", kinds
    metrics = render(engine)
    assert 'durapay_gateway_breaker{terminal="default",state="closed"} 1' in metrics
    opened = next(line for line in metrics.splitlines() if line.startswith("durapay_gateway_breaker_opened_total{"))
    assert int(opened.rsplit(" ", 1)[1]) >= 1


def test_an_outage_longer_than_the_bound_ends_flows_failed_or_with_a_person(bounded: Stack) -> None:
    engine, admin = bounded.engine, bounded.simulator.admin
    admin.set_faults(mode="error", status=503)
    sent = start(bounded, 0)  # its money call gets a 503: it may have acted
    wait_until(lambda: engine.gate.status().state == "open", timeout=20, what="the breaker to open")
    never = start(bounded, 3)  # started while the breaker is open: its call never leaves
    for flow in (sent, never):
        wait_until(lambda f=flow: engine.get(f).fields.get("gateway_since"), timeout=20, what="the flow to meet the breaker")
    waiting = engine.get(never)
    assert waiting.state is FlowState.RETRYING and waiting.error is not None
    assert waiting.error["reason"] == "gateway unavailable"
    assert waiting.attempt == 0 and not waiting.fields.get("runs")  # the claim's attempt and run given back
    assert bounded.clock is not None
    # Past outage_seconds and past their dues (the breaker's end plus jitter, 120 to 151 s), yet within a
    # lease and a breaker period of them (one unbroken outage, protocol._outage_since); the breaker itself
    # stays open by Redis's clock.
    bounded.clock.offset += 200
    ended = {f: engine.wait(f, 30) for f in (sent, never)}
    assert ended[sent].state is FlowState.NEEDS_ATTENTION, ended[sent].summary()
    assert ended[never].state is FlowState.FAILED, ended[never].summary()
    for record in ended.values():
        assert "gateway unavailable for more than 10s" in (record.outcome or {}).get("reason", "") + str(
            engine.history(record.id)[-1].get("what")
        )


def test_the_gate_opens_and_closes_on_a_redis_cluster(tmp_path: Path, key_prefix: str) -> None:
    """The gate's keys and its partition's event stream share one hash slot: the script that opens and
    closes the breaker writes its events on a cluster too (a cross-slot script would be refused)."""
    with ValkeyCluster(tmp_path / "cluster", 3) as cluster:
        client = RedisCluster.from_url(cluster.url)
        time_now = Time()
        gate = make_gate(client, key_prefix, time_now, failures=2)
        for _ in range(2):
            gate.failed(ServerError("create_moto_order: HTTP 503", status_code=503))
        assert gate.take().verdict == "open"
        time_now.t += 20
        assert gate.take().verdict == "go"  # the probe
        gate.succeeded()
        assert gate.status().state == "closed"
        kinds = [event.type for event in EventFeed(client, Keys(prefix=key_prefix, partitions=3)).read(None)[0]]
        assert kinds == ["gateway.unavailable", "gateway.recovered"]
        client.close()
