"""Shared parts of the benchmarks: a private Valkey, the simulator and Celery workers as processes.

Benchmarks measure durapay against a baseline *in the same run* on the same machine and print ratios;
they are never assertions in tests (machines are shared and noisy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from durapay.config import GATEWAY_PATH_PREFIX, Settings, load_settings
from durapay.config.embedded import EmbeddedValkey, free_port
from durapay.service.processes import settings_env
from durapay.workflows.engine import new_key

ROOT = Path(__file__).resolve().parents[1]


def wait_until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout}s")
        time.sleep(0.005)


class Processes:
    """Child processes started by a benchmark, stopped together."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []
        self.log_dir = Path(tempfile.mkdtemp(prefix="durapay-bench-"))

    def spawn(self, name: str, code: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("ab")
        child = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env, stdout=log, stderr=log)
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()


SIMULATOR = """
import json, sys
from durapay.simulator import SimulatorConfig, serve_forever
keys = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
serve_forever(SimulatorConfig(port=int(sys.argv[1]), latency_ms=int(sys.argv[2]), seed=1, terminal_keys=keys))
"""


def start_simulator(procs: Processes, latency_ms: int = 0, terminal_keys: dict[str, str] | None = None) -> str:
    """Start ``durapay``'s simulator in its own process; returns its root URL. ``terminal_keys``: the keys of
    terminals besides default, each with its terminal (``SimulatorConfig.terminal_keys``)."""
    port = free_port()
    args = [str(port), str(latency_ms)] + ([json.dumps(terminal_keys)] if terminal_keys else [])
    procs.spawn("simulator", SIMULATOR, dict(os.environ, PYTHONPATH=str(ROOT)), *args)
    root = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(root + "/_sim/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 30, "the simulator to answer")
    return root


def set_latency(root: str, latency_ms: int) -> None:
    httpx.post(root + "/_sim/faults", json={"latency_ms": latency_ms}, timeout=5).raise_for_status()


#: The benchmarks' card key (card data is written to Redis only sealed, ``workflows.engine.cards``).
BENCH_CARD_KEY = new_key("bench")


def bench_settings(sim_root: str, redis_url: str, prefix: str = "bench") -> Settings:
    return load_settings(
        {
            "card": {"keys": [BENCH_CARD_KEY]},
            "redis_url": redis_url,
            "gateway": {"base_url": sim_root + GATEWAY_PATH_PREFIX},
            "engine": {"key_prefix": prefix},
            "receiver": {"public_url": "http://127.0.0.1:9/notifications"},
        }
    )


def child_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child load ``settings`` (``service.processes``' rule)."""
    return settings_env(settings) | {"PYTHONPATH": str(ROOT)}


DURABLE_WORKER = """
import sys
from durapay.config import load_settings
from durapay.service.runtime import build_runtime
settings = load_settings()
runtime = build_runtime(settings, redis_url=settings.redis_url)
# The step queues as `durapay worker` takes them (with DURAPAY_FAIRNESS__ENABLED, every key's queue too).
queues = ",".join([*runtime.engine.fairness.step_queues(), "durapay.webhooks"])
runtime.celery.worker_main(["worker", "-P", sys.argv[1], "-c", sys.argv[2], "-Q", queues, "-l", "warning",
                            "--without-mingle", "--without-gossip", "-n", "durable@%h"])
"""

BARE_WORKER = """
import sys
from bench._bare import make_bare_app
from durapay.config import load_settings
app = make_bare_app(load_settings())
app.worker_main(["worker", "-P", sys.argv[1], "-c", sys.argv[2], "-Q", "bare", "-l", "warning",
                 "--without-mingle", "--without-gossip", "-n", "bare@%h"])
"""


def valkey(appendfsync: str = "always") -> EmbeddedValkey:
    """A private Valkey; ``always`` by default, as durapay's own Valkey runs (``everysec``: starts and
    money claims then wait for ``WAITAOF``)."""
    server = EmbeddedValkey(Path(tempfile.mkdtemp(prefix="durapay-bench-valkey-")), appendfsync=appendfsync)
    server.start()
    return server


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
