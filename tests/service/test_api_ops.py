"""``/healthz``, ``/readyz`` (Redis, worker and scheduler heartbeats) and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from durapay.service.app import create_app
from durapay.service.heartbeat import Heartbeat
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from tests.service.conftest import API_KEY, NOTIFIED, Served, notification, service_settings
from tests.service.test_receiver import NOWHERE, hosted_page, pay
from tests.waiting import wait_until

KEY = {"X-Api-Key": API_KEY}


def _with(answer: Any, line: str) -> Any:
    """``answer`` when its text has ``line``, else None."""
    return answer if line in answer.text.splitlines() else None


SAMPLE = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)+\})? -?[0-9.e+]+$')


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorServer]:
    """The gateway of this module's ``live``: the receiver reads a notified operation back from it."""
    with SimulatorServer(SimulatorConfig(seed=43)) as server:
        server.admin.set_faults(mode="notify_drop")  # its notifications are posted by the test
        yield server


@pytest.fixture
def live(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Served]:
    """conftest's ``live`` (the app over HTTP, a real Celery worker), its gateway the simulator."""
    from celery.contrib.testing.worker import start_worker

    settings = service_settings(key_prefix, gateway={"base_url": simulator.base_url}, receiver={"public_url": NOWHERE})
    built = build_runtime(settings, redis_url=redis_url, flows={"notified": NOTIFIED})
    with (
        start_worker(built.celery, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10),
        ApiServer(create_app(built)) as server,
        httpx.Client(base_url=server.url, timeout=10.0, headers={"X-Api-Key": API_KEY}) as http,
    ):
        yield Served(built, server, http)
    built.engine.gateway().close()
    built.close()


def test_readyz_needs_a_worker_a_deliveries_worker_and_a_scheduler_heartbeat(served: Served) -> None:
    assert served.http.get("/healthz").status_code == 200
    answer = served.http.get("/readyz", headers=KEY)
    assert answer.status_code == 503
    checks = {"redis": True, "worker": False, "webhooks": False, "scheduler": False}
    assert answer.json() == {"ready": False, "checks": checks}

    Dispatcher(served.engine).tick()  # writes the scheduler heartbeat
    beat = Heartbeat(served.runtime.redis_url, served.engine.keys, "worker", "test-worker", interval=0.05).start()
    try:
        deadline = time.monotonic() + 5
        while not served.engine.redis.exists(served.engine.keys.heartbeat("worker")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # Steps run, but without a deliveries worker no webhook is ever sent: not ready.
        assert served.http.get("/readyz", headers=KEY).json()["checks"] == checks | {"worker": True, "scheduler": True}
        hooks = Heartbeat(served.runtime.redis_url, served.engine.keys, "webhooks", "test-hooks", interval=0.05).start()
        try:
            while not served.engine.redis.exists(served.engine.keys.heartbeat("webhooks")):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            ready = served.http.get("/readyz", headers=KEY)
            assert ready.status_code == 200
            assert ready.json() == {"ready": True, "checks": dict.fromkeys(checks, True)}
        finally:
            hooks.stop()
    finally:
        beat.stop()


def test_a_running_celery_worker_keeps_its_heartbeat(live: Served) -> None:
    deadline = time.monotonic() + 10
    while not live.engine.redis.exists(live.engine.keys.heartbeat("worker")):
        assert time.monotonic() < deadline, "the worker bootstep writes the heartbeat"
        time.sleep(0.05)


def test_metrics_report_flows_steps_and_refused_notifications(live: Served, simulator: SimulatorServer) -> None:
    token = hosted_page(live.engine, "ord-metrics")  # a real page at the gateway, its token kept by the flow
    started = live.http.post("/flows/notified", json={"orderId": "ord-metrics", "token": token}).json()
    live.engine.wait(started["id"], 10, states=frozenset({FlowState.WAITING}))
    refused = live.http.post("/notifications", json=notification("ord-metrics", "b" * 32))
    assert refused.status_code == 401

    # A worker adds its step timings to Redis once a second (service.metrics.FLUSH_SECONDS).
    step_count = 'durapay_step_duration_seconds_count{kind="notified",step="create"} 1'
    answer = wait_until(lambda: _with(live.http.get("/metrics"), step_count), 15, "the worker's step timings")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = answer.text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all(SAMPLE.match(line) for line in samples), [line for line in samples if not SAMPLE.match(line)]
    assert 'durapay_flows{kind="notified",state="waiting"} 1' in samples
    assert 'durapay_flows{kind="moto",state="succeeded"} 0' in samples
    assert 'durapay_step_duration_seconds_count{kind="notified",step="create"} 1' in samples
    assert 'durapay_step_duration_seconds_bucket{kind="notified",step="create",le="+Inf"} 1' in samples
    assert 'durapay_step_retries_total{kind="notified",step="payment"} 0' in samples
    assert "durapay_notifications_rejected_total 1" in samples
    assert 'durapay_notifications_total{outcome="rejected"} 1' in samples
    assert 'durapay_notifications_total{outcome="unverified"} 0' in samples
    assert "# TYPE durapay_step_duration_seconds histogram" in text

    assert live.http.post("/notifications", json=pay(simulator, "ord-metrics")).status_code == 200
    live.engine.wait(started["id"], 10)
    after = live.http.get("/metrics").text
    assert 'durapay_notifications_total{outcome="accepted"} 1' in after
    assert 'durapay_flows{kind="notified",state="succeeded"} 1' in after
    assert 'durapay_flows{kind="notified",state="waiting"} 0' in after


def test_the_worker_heartbeat_stops_with_the_worker(runtime: Runtime) -> None:
    from celery.contrib.testing.worker import start_worker

    def beating() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name == "worker-heartbeat"}

    earlier = beating()  # another test's worker, if any, is not this one's to judge
    with start_worker(runtime.celery, pool="threads", concurrency=1, perform_ping_check=False):
        mine = beating() - earlier
        assert mine
    wait_until(lambda: not any(thread.is_alive() for thread in mine), 30, "the worker's heartbeat to stop")
