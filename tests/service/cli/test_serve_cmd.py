"""``durapay api``, ``durapay worker`` (steps, and ``--webhooks``: deliveries) and ``durapay scheduler`` as
real processes, working together.

The three are started as an operator would (same ``DURAPAY_*`` variables), against the simulator; the
test waits on conditions (a port answering, ``/readyz``), never on a bare sleep. Then flows started
with ``durapay start --wait`` run through them, one of them resumed by the gateway's notification
arriving at the API process's receiver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.config.embedded import free_port
from durapay.simulator import SimulatorConfig, SimulatorServer
from tests.service.cli.conftest import API_KEY, DURAPAY, invoke
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def answers(url: str, status: int, **kwargs: Any) -> bool:
    try:
        return httpx.get(url, timeout=2, **kwargs).status_code == status
    except httpx.TransportError:
        return False


class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        process = subprocess.Popen([*DURAPAY, *args], env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
        self.running[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text()

    def stop(self, name: str) -> int:
        process = self.running.pop(name)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return -9

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop_all()


def test_api_refuses_to_start_without_a_key(cli_env: dict[str, str]) -> None:
    env = {**os.environ, "DURAPAY_API__KEY": ""}
    done = subprocess.run([*DURAPAY, "api", "--port", "0"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("durapay: DURAPAY_API__KEY is empty")
    assert "Traceback" not in done.stderr


def test_api_worker_and_scheduler_run_flows_together(
    cli_env: dict[str, str], processes: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    key = {"X-Api-Key": API_KEY}
    with (
        SimulatorServer(SimulatorConfig(seed=5, auto_complete_ms=300, notify_backoff_ms=50)) as sim,
        WebhookReceiver() as receiver,
    ):
        monkeypatch.setenv("DURAPAY_WEBHOOKS__ALLOW_PRIVATE", "true")
        monkeypatch.setenv("DURAPAY_GATEWAY__BASE_URL", sim.base_url)
        monkeypatch.setenv("DURAPAY_RECEIVER__PUBLIC_URL", f"{api}/notifications")
        monkeypatch.setenv("DURAPAY_ENGINE__LEASE_SECONDS", "10")
        monkeypatch.setenv("DURAPAY_GATEWAY__TIMEOUT", "5")  # the lease must exceed one gateway call

        processes.start("api", "api", "--port", str(port))
        wait_until(lambda: answers(f"{api}/healthz", 200), 30, "durapay api to listen")
        not_ready = httpx.get(f"{api}/readyz", headers=key).json()
        assert not_ready["checks"] == {"redis": True, "worker": False, "webhooks": False, "scheduler": False}
        added = httpx.post(f"{api}/webhooks", headers=key, json={"url": receiver.url}).json()
        receiver.secrets = [added["secret"]]

        processes.start("worker", "worker", "--concurrency", "2", "--loglevel", "warning")  # prefork, the default
        processes.start("webhooks", "worker", "--webhooks", "--concurrency", "2", "--loglevel", "warning")
        processes.start("scheduler", "scheduler", "--interval", "0.1")
        wait_until(lambda: answers(f"{api}/readyz", 200, headers=key), 60, "the workers' and a scheduler's heartbeats")
        assert invoke("alive", "webhooks").exit_code == 0, "the deliveries worker's own heartbeat"

        card = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}
        paid = invoke(
            "start", "moto", "--wait", "30", "--json",
            stdin=json.dumps({"order": {"orderId": "serve-moto-1", "amount": "700", "currency": "EUR"}, "card": card}),
        )  # fmt: skip
        assert paid.exit_code == 0, paid.output
        assert json.loads(paid.stdout)["state"] == "succeeded"

        session = {"actionType": "PAY", "amount": "900", "language": "eng", "resultUrl": "https://shop.example/ok"}
        hpp = {"order": {"orderId": "serve-hpp-1", "amount": "900", "currency": "EUR"}, "paymentSession": session}
        page = invoke("start", "hpp", "--wait", "30", "--json", stdin=json.dumps(hpp))
        assert page.exit_code == 0, page.output
        flow = json.loads(page.stdout)
        assert flow["state"] == "succeeded"
        announced = json.loads(page.stderr.splitlines()[0])  # while it waited, for the customer to pay
        assert announced["id"] == flow["id"] and announced["customer_url"] == flow["customer_url"]
        history = httpx.get(f"{api}/flows/{flow['id']}/history", headers=key).json()["history"]
        assert any(entry["by"] == "notification" for entry in history), "resumed by the notification"

        timed = 'durapay_step_duration_seconds_count{kind="moto",step="pay"} 1'  # added once a second

        def timed_metrics() -> str | None:
            text = httpx.get(f"{api}/metrics", headers=key).text
            return text if timed in text else None

        metrics = wait_until(timed_metrics, 30, "the step timed in a prefork child")
        assert 'durapay_notifications_total{outcome="accepted"} 1' in metrics

        # The deliveries worker sent the flows' events (the steps' worker consumes no delivery).
        wait_until(lambda: {"flow.succeeded"} <= {body["type"] for body in receiver.applied.values()}, 30, "events delivered")
        assert receiver.refused == 0
        assert processes.stop("webhooks") == 0
        assert processes.stop("scheduler") == 0
        assert "durapay scheduler: stopped" in processes.log("scheduler")
        assert processes.stop("worker") == 0
        assert processes.stop("api") == 0


def test_a_worker_with_fairness_on_consumes_every_keys_queues(
    cli_env: dict[str, str], processes: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, item 2: with fairness on, steps go to their key's queues (``workflows.engine.fairness``), and
    ``durapay worker`` consumes them all: a flow of a named tenant and one of a shared bucket both run."""
    with SimulatorServer(SimulatorConfig(seed=6)) as sim:
        monkeypatch.setenv("DURAPAY_GATEWAY__BASE_URL", sim.base_url)
        monkeypatch.setenv("DURAPAY_FAIRNESS__ENABLED", "true")
        monkeypatch.setenv("DURAPAY_FAIRNESS__WEIGHTS", '{"default/acme": 2}')
        monkeypatch.setenv("DURAPAY_FAIRNESS__SHARED_QUEUES", "4")
        processes.start("worker", "worker", "--concurrency", "2", "--loglevel", "warning")
        card = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}
        for order_id, tenant in (
            ("fair-moto-1", ["--tenant", "acme"]),
            ("fair-moto-2", ["--tenant", "other"]),
            ("fair-moto-3", []),
        ):
            body = {"order": {"orderId": order_id, "amount": "700", "currency": "EUR"}, "card": card}
            paid = invoke("start", "moto", *tenant, "--wait", "60", "--json", stdin=json.dumps(body))
            assert paid.exit_code == 0, (order_id, paid.output)
            assert json.loads(paid.stdout)["state"] == "succeeded"
        assert processes.stop("worker") == 0


def test_alive_reports_the_heartbeat_for_health_checks(cli_env: dict[str, str], redis_url: str, key_prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        assert invoke("alive", "scheduler").exit_code == 1
        client.set(f"{key_prefix}:alive:scheduler", "1", ex=10)
        assert invoke("alive", "scheduler").exit_code == 0
        assert invoke("alive", "worker", "--name", "celery@box-1").exit_code == 1
        client.set(f"{key_prefix}:alive:worker:celery@box-1", "1", ex=10)
        result = invoke("alive", "worker", "--name", "celery@box-1")
        assert (result.exit_code, result.stdout.strip()) == (0, "worker: alive")
    finally:
        client.close()


def redis_is_answering(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@pytest.mark.chaos
def test_worker_rides_out_redis_down_then_runs_flows(
    cli_env: dict[str, str], processes: Processes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``durapay worker`` (prefork, the default) with steps in flight when its Redis (broker and flow
    records) is killed, down for the time of three reconnect attempts (about 12 s), then back: the worker
    is still running, finishes the flows it had and runs a new one; every order is charged once."""
    import random

    from durapay.config import load_settings
    from durapay.config.embedded import EmbeddedValkey
    from durapay.service.runtime import build_runtime
    from durapay.workflows.engine.dispatcher import Dispatcher
    from durapay.workflows.engine.states import FlowState
    from tests.workflows.integration.test_durability import charges

    card = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}
    valkey = EmbeddedValkey(tmp_path / "valkey", appendfsync="always")
    valkey.start()
    with SimulatorServer(SimulatorConfig(seed=11)) as sim:
        sim.admin.set_faults(rules=[{"mode": "latency", "operation": "create_moto_order", "latency_ms": 1500}])
        monkeypatch.setenv("DURAPAY_REDIS_URL", valkey.url)
        monkeypatch.setenv("DURAPAY_BROKER_URL", valkey.url)
        monkeypatch.setenv("DURAPAY_GATEWAY__BASE_URL", sim.base_url)
        monkeypatch.setenv("DURAPAY_ENGINE__LEASE_SECONDS", "8")
        monkeypatch.setenv("DURAPAY_GATEWAY__TIMEOUT", "4")
        monkeypatch.setenv("DURAPAY_GATEWAY__CONNECT_TIMEOUT", "1")
        monkeypatch.setenv("DURAPAY_RETRY__CAP_SECONDS", "2")
        engine_side = build_runtime(load_settings(), redis_url=valkey.url, rng=random.Random(12))
        dispatcher = Dispatcher(engine_side.engine, interval=0.1).start()
        worker = processes.start("worker", "worker", "--concurrency", "2", "--loglevel", "info")
        try:
            engine = engine_side.engine
            heartbeat = engine.keys.heartbeat("worker")
            wait_until(lambda: engine.redis.exists(heartbeat), 60, "the worker's heartbeat")
            before = [
                engine.start("moto", {"order": {"orderId": f"outage-{n}", "amount": "500", "currency": "EUR"}, "card": card}).id
                for n in range(4)
            ]
            wait_until(lambda: any(engine.get(i).state is FlowState.RUNNING for i in before), 30, "a step in flight")

            valkey.kill()
            wait_until(lambda: processes.log("worker").count("Cannot connect to") >= 3, 60, "three reconnect attempts")
            assert worker.poll() is None, processes.log("worker")
            valkey.start()
            wait_until(lambda: redis_is_answering(valkey.url), 30, "Valkey back")

            order = {"orderId": "outage-after", "amount": "700", "currency": "EUR"}
            after = engine.start("moto", {"order": order, "card": card}).id
            records = [engine.wait(flow_id, 120) for flow_id in [*before, after]]
            assert [r.summary() for r in records if r.state is not FlowState.SUCCEEDED] == []
            for record in records:
                assert len(charges(sim, record.order_id)) == 1, record.summary()
            assert worker.poll() is None
            log = processes.log("worker")
            assert "Unrecoverable error" not in log and "AttributeError" not in log, log
            assert processes.stop("worker") == 0
        finally:
            dispatcher.stop()
            engine_side.close()
            valkey.stop()


def test_a_fatal_worker_error_exits_non_zero(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A worker that stops on an error Celery cannot recover from exits non-zero, so that a supervisor
    restarting on failure brings it back (Celery's ``worker_main`` dropped the status: exit 0). The
    fatal error is forced in the worker's heartbeat bootstep, one of the steps a worker starts."""
    forced = (
        "import sys\n"
        "import durapay.service.heartbeat\n"
        "def broken(self):\n"
        "    raise RuntimeError('forced fatal error')\n"
        "durapay.service.heartbeat.Heartbeat.start = broken\n"
        "from durapay.service.cli import main\n"
        "sys.argv = ['durapay', 'worker', '--pool', 'solo', '--loglevel', 'warning']\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", forced], env=dict(os.environ), capture_output=True, text=True, timeout=120, check=False
    )
    assert "forced fatal error" in done.stderr
    assert done.returncode != 0, done.stderr
    assert "durapay: the worker stopped with exit status 1" in done.stderr


def test_scheduler_says_redis_was_lost_and_back_in_two_lines(cli_env: dict[str, str], tmp_path: Path) -> None:
    """``durapay scheduler`` started while its Redis is down (it printed a warning per tick and a traceback
    per ticker per tick): one line when Redis is found unreachable, one when it answers again, naming
    how many attempts failed meanwhile; no traceback."""
    import re

    from durapay.config.embedded import EmbeddedValkey

    valkey = EmbeddedValkey(tmp_path / "valkey")
    env = {**os.environ, "DURAPAY_REDIS_URL": valkey.url, "DURAPAY_BROKER_URL": valkey.url}
    log_path = tmp_path / "scheduler.log"
    with log_path.open("wb") as log:
        scheduler = subprocess.Popen([*DURAPAY, "scheduler", "--interval", "0.05"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "Redis unreachable" in log_path.read_text(), 60, "the scheduler to notice Redis is down")
        valkey.start()
        back = wait_until(lambda: re.search(r"Redis is back after .*\((\d+) attempts failed\)", log_path.read_text()), 60, "back")
        scheduler.send_signal(signal.SIGTERM)
        assert scheduler.wait(timeout=30) == 0
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
        valkey.stop()
    output = log_path.read_text()
    assert int(back.group(1)) >= 1, output  # the attempt that found it down, at least
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 4, output  # started, unreachable, back, stopped
