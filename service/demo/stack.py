"""The demo's running parts: Valkey, the simulator, the API, a scheduler, and workers in child processes.

Everything a production deployment has, on one machine, with nothing configured:

* an embedded Valkey of its own with AOF on, under ``<DURAPAY_DATA_DIR>/demo`` (never the configured
  ``DURAPAY_REDIS_URL`` nor the data folder's own store): the demo moves its clock months ahead, and
  its flows and events, dated by that clock, must not mix with real ones. Each run starts from an empty
  demo store (the previous run's is removed) and leaves its store there for a look afterwards
  (``DURAPAY_DATA_DIR=<data dir>/demo durapay flows ls``);
* the gateway simulator, its pages and links completing by themselves;
* the receiver and control API (uvicorn, one worker) and a scheduler (dispatcher + schedules ticker)
  in this process, on a clock shared through Redis (:mod:`service.demo.clock`);
* Celery workers as separate ``durapay worker`` processes, given the embedded server's URL, so that
  one can be killed mid-step like a crashed machine.

Ports: the documented defaults (8780 API, 8781 simulator) when free, else free ones.
"""

from __future__ import annotations

import secrets
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from durapay.config import SIMULATOR_API_KEY, Settings, load_settings
from durapay.config.embedded import free_port, running_embedded
from durapay.service.app import create_app
from durapay.service.demo.clock import SharedClock
from durapay.service.processes import Child, port_or_free, settings_env
from durapay.service.runtime import Runtime, build_runtime, resolve_redis
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import Dispatcher, kept_keys
from durapay.workflows.schedules import Schedules

API_PORT = 8780
SIMULATOR_PORT = 8781
#: Hosted pages, links and forms complete by themselves this long after they are created.
AUTO_COMPLETE_MS = 800
#: Short leases: a killed worker's step is taken over within seconds (the gateway timeout is below).
LEASE_SECONDS = 6.0
#: The demo's own folder under the data folder: its Valkey (``valkey/``) and the workers' logs.
DEMO_FOLDER = "demo"


def demo_folder(base: Settings) -> Path:
    """Where the demo keeps its store and logs: its own folder under the data folder."""
    return (Path(base.data_dir) / DEMO_FOLDER).resolve()


def fresh_store(folder: Path) -> None:
    """Remove the previous demo's store under ``folder`` so that this run starts empty (its clock at
    zero offset); refused while another demo serves it (``--keep``)."""
    store = folder / "valkey"
    url = running_embedded(store)
    if url is not None:
        raise RuntimeError(f"another demo is running on {store} ({url}); stop it first (Ctrl-C)")
    shutil.rmtree(store, ignore_errors=True)


class DemoStack:
    """Start with :meth:`start`, stop with :meth:`stop` (also on errors: it stops what it started)."""

    def __init__(self, base: Settings, run_id: str, *, api_port: int = API_PORT, simulator_port: int = SIMULATOR_PORT) -> None:
        self.base = base
        self.ports = (api_port, simulator_port)
        self.run_id = run_id
        self.data_dir = demo_folder(base)
        self.log_dir = self.data_dir
        self.api_key = base.api.key.get_secret_value() or secrets.token_urlsafe(18)
        self.simulator: SimulatorServer | None = None
        self.runtime: Runtime | None = None
        self.clock: SharedClock | None = None
        self.api: ApiServer | None = None
        self.dispatcher: Dispatcher | None = None
        self.workers: dict[str, Child] = {}
        #: The webhook deliveries' own worker (``durapay worker --webhooks``); it holds no step.
        self.deliveries: Child | None = None
        self._worker_count = 0
        self._env: dict[str, str] = {}

    @property
    def clock_key(self) -> str:
        return f"{self.base.engine.key_prefix}:demo:clock-offset"

    def start(self, say: Any) -> None:
        fresh_store(self.data_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        api_port, sim_port = (port_or_free(port) if port else free_port() for port in self.ports)
        say(f"simulator on port {sim_port} (pages and links complete by themselves)")
        self.simulator = SimulatorServer(SimulatorConfig(port=sim_port, auto_complete_ms=AUTO_COMPLETE_MS, seed=1)).start()
        overrides = self.overrides(api_port, self.simulator.base_url)
        settings = load_settings(overrides)
        redis_url, embedded = resolve_redis(settings)
        assert embedded is not None  # fresh_store made sure none was serving the folder
        say(f"Valkey at {redis_url} (the demo's own, AOF under {embedded.data_dir})")
        settings = load_settings({**overrides, "redis_url": redis_url})
        self.clock = SharedClock(redis_url, self.clock_key)
        # One "now" for the engine and the gateway (the demo's clock only moves forward, across runs too).
        self.simulator.admin.set_clock(datetime.fromtimestamp(self.clock.now(), UTC))
        self.runtime = build_runtime(settings, redis_url=redis_url, clock=self.clock)
        self.runtime.embedded = embedded
        self._env = settings_env(settings)
        self.api = ApiServer(create_app(self.runtime), "127.0.0.1", api_port).start()
        say(f"API and receiver on {self.api.url}")
        schedules = Schedules(self.runtime.engine)
        tickers = [schedules.tick, self.runtime.webhooks.tick]
        self.dispatcher = Dispatcher(self.runtime.engine, tickers=tickers, interval=0.1, name="demo-scheduler").start()
        say("scheduler running")
        for _ in range(2):
            self.add_worker()
        extra = ["--webhooks", "--concurrency", "4", "--loglevel", "warning", "--hostname", "demo-webhooks@%h"]
        extra += ["--clock-key", self.clock_key]
        self.deliveries = Child("worker", "demo-webhooks", self._env, self.log_dir, extra).start()
        self.wait_ready()
        say(f"workers running: {', '.join(self.workers)} (separate processes; logs in {self.log_dir})")

    def overrides(self, api_port: int, simulator_url: str) -> dict[str, Any]:
        """The demo's settings over the configured ones. The daily reconciliation is off: the demo's clock
        runs months ahead of the simulator's day, and its scheduler runs no such ticker (production's
        default is on: docs/configuration.md)."""
        return {
            "gateway": {
                "base_url": simulator_url,
                "api_key": SIMULATOR_API_KEY,
                "timeout": 3.5,
                "connect_timeout": 2.0,
            },
            "receiver": {"public_url": f"http://127.0.0.1:{api_port}{self.base.receiver.path}"},
            "api": {"host": "127.0.0.1", "port": api_port, "key": self.api_key},
            "engine": {"lease_seconds": LEASE_SECONDS, "dispatch_interval": 0.1},
            "retry": {"base_seconds": 0.2, "cap_seconds": 2.0},
            "data_dir": str(self.data_dir),
            "reconcile": {"daily": False},
            # Card data is sealed with a key of the demo's own, kept in its folder (workflows.engine.cards).
            "card": {"keys": [key.get_secret_value() for key in self.base.card.keys] or kept_keys(self.log_dir, make=True)},
            "redis_url": "",  # its own store, whatever is configured
            "broker_url": "",
            "redis_cluster": False,
        }

    def add_worker(self) -> Child:
        self._worker_count += 1
        name = f"demo-{self._worker_count}"
        extra = ["--pool", "threads", "--concurrency", "4", "--loglevel", "warning", "--hostname", f"{name}@%h"]
        worker = Child("worker", name, self._env, self.log_dir, [*extra, "--clock-key", self.clock_key]).start()
        self.workers[name] = worker
        return worker

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until ``/readyz`` says Redis, a worker, the deliveries worker and the scheduler are alive."""
        assert self.api is not None
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.api.url, headers={"X-Api-Key": self.api_key}, timeout=5) as http:
            while True:
                if http.get("/readyz").status_code == 200:
                    return
                dead = [w.name for w in [*self.workers.values(), *([self.deliveries] if self.deliveries else [])] if not w.alive]
                if dead:
                    raise RuntimeError(f"worker {dead[0]} exited; see {self.log_dir / (dead[0] + '.log')}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the workers did not come up within {timeout:g}s; see {self.log_dir}")
                time.sleep(0.2)

    def kill_worker_of(self, lease_owner: str) -> Child | None:
        for name, worker in list(self.workers.items()):
            if worker.owns(lease_owner):
                worker.kill()
                del self.workers[name]
                return worker
        return None

    def stop(self) -> None:
        for worker in [*self.workers.values(), *([self.deliveries] if self.deliveries else [])]:
            worker.stop()
        self.workers = {}
        self.deliveries = None
        if self.dispatcher is not None:
            self.dispatcher.stop()
        if self.api is not None:
            self.api.stop()
        if self.simulator is not None:
            self.simulator.stop()
        if self.clock is not None:
            self.clock.close()
        if self.runtime is not None:
            self.runtime.close()
