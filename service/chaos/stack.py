"""What ``durapay chaos`` runs and breaks: Valkey, the simulator, the receiver, workers and a scheduler.

Valkey (its own, AOF ``always`` or ``everysec``; or the configured Redis), the workers (``durapay
worker``) and the scheduler (``durapay scheduler``) are separate processes so that they can be
SIGKILLed like crashed machines; the simulator and the receiver (the API, to which the gateway's
notifications come) run in this process and are never killed: they stand for the outside world. On its
own ``everysec`` Valkey the processes are given ``DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF``: that Valkey
confirms ``WAITAOF`` before its fsync, and the run is there to show what such a server loses.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis

from durapay.config import SIMULATOR_API_KEY, Settings, load_settings
from durapay.config.embedded import EmbeddedValkey, free_port
from durapay.service.app import create_app
from durapay.service.chaos.aof import (
    Cut,
    FsyncRecorder,
    crash_model_valkey,
    current_incr,
    stop_and_cut,
    waitaof_waits_for_fsync,
)
from durapay.service.processes import Child, settings_env
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import new_key

#: The gateway client's timeout: a "hang" fault holds a request longer than this.
GATEWAY_TIMEOUT = 2.0
#: Short leases: a killed worker's step is taken over within seconds.
LEASE_SECONDS = 5.0
#: The latest a request acts here after it was sent: a latency fault holds it GATEWAY_TIMEOUT + 1 s before
#: it acts (``campaign.fault_rule``; a hang acts first, or never).
LATEST_ACT_SECONDS = GATEWAY_TIMEOUT + 1.0
#: The engine's late window (``DURAPAY_RETRY__LATE_SECONDS``): five times the latest act of this gateway, so
#: "never acted" is still believed only once the call can no longer arrive (were it shorter, a cancelled
#: flow's late payment would show as a finding). 120 s is for a real gateway's queues: a cancel that met a
#: lost answer held a run two minutes past its flows.
LATE_SECONDS = 5 * LATEST_ACT_SECONDS
#: Reads of what is still open after a deadline (``DURAPAY_RETRY__READ_PACE_SECONDS``), the first read of a
#: link adopted after a lost answer among them (its notifications cannot be verified): 300 s held a run
#: five minutes past its flows; here the simulator answers at once.
READ_PACE_SECONDS = 5.0
#: The scheduler's first look at a charge's flow (``DURAPAY_SCHEDULES__CHECK_SECONDS``; then doubling): a
#: short run's one occurrence fires near its end, and 30 s held the run that long past its flows.
CHECK_SECONDS = 2.0


class ChaosStack:
    """Start with :meth:`start`, stop with :meth:`stop` (it stops whatever was started)."""

    def __init__(
        self,
        base: Settings,
        folder: Path,
        *,
        seed: int,
        redis_url: str | None,
        lose_last_writes: bool,
        appendfsync: str = "always",
        overrides: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.base = base
        #: More settings per group (``bench/soak.py``: short retentions), for this process and the children.
        self.overrides = overrides or {}
        self.appendfsync = appendfsync
        self.folder = folder
        self.seed = seed
        self.configured_url = redis_url
        self.lose_last_writes = lose_last_writes
        self.log_dir = folder / "logs"
        self.valkey: EmbeddedValkey | None = None
        self.recorder: FsyncRecorder | None = None
        self.simulator: SimulatorServer | None = None
        self.runtime: Runtime | None = None
        self.api: ApiServer | None = None
        self.workers: list[Child] = []
        self.scheduler: Child | None = None
        self.deliveries: Child | None = None
        self.env: dict[str, str] = {}
        #: With the crash model: whether the server's WAITAOF waits for the fsync (None: not checked).
        self.waitaof_honest: bool | None = None
        self._names = 0

    @property
    def owns_redis(self) -> bool:
        return self.valkey is not None

    def start(self, say: Callable[[str], None]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.lose_last_writes:
            self.recorder = FsyncRecorder(self.folder / "crash-model").build()
        self.simulator = SimulatorServer(SimulatorConfig(port=free_port(), seed=self.seed, notify_max_attempts=20)).start()
        say(f"simulator at {self.simulator.base_url} (its pages paid by the simulated customer)")
        redis_url = self.configured_url or self._start_valkey()
        say(f"Valkey at {redis_url}" + (f" (own, AOF {self.appendfsync})" if self.valkey else " (configured)"))
        api_port = free_port()
        engine: dict[str, object] = {"lease_seconds": LEASE_SECONDS, "dispatch_interval": 0.1, "key_prefix": f"chaos{self.seed}"}
        if self.valkey is not None and self.appendfsync == "everysec":
            # The run shows what such a server loses (the bundled Valkey confirms WAITAOF before its fsync):
            # the processes it starts must run on it, so they are told to accept it.
            engine["accept_early_waitaof"] = True
        config: dict[str, Any] = {
            "redis_url": redis_url,
            "broker_url": redis_url,
            "data_dir": str(self.folder),
            "gateway": {
                "base_url": self.simulator.base_url,
                "api_key": SIMULATOR_API_KEY,
                "timeout": GATEWAY_TIMEOUT,
                "connect_timeout": 1.0,
            },
            "receiver": {"public_url": f"http://127.0.0.1:{api_port}{self.base.receiver.path}"},
            "api": {"host": "127.0.0.1", "port": api_port, "key": f"chaos-{self.seed}"},
            "engine": engine,
            "retry": {
                "base_seconds": 0.2,
                "cap_seconds": 2.0,
                "late_seconds": LATE_SECONDS,
                "read_pace_seconds": READ_PACE_SECONDS,
            },
            # The run checks the ledger itself at its end (service.chaos.reconcile); a daily run of its
            # scheduler would add marks and events of its own to what the run judges.
            "reconcile": {"daily": False},
            # Its own store, a key of its own for the run (card data is written to Redis only sealed).
            "card": {"keys": [key.get_secret_value() for key in self.base.card.keys] or [new_key("chaos")]},
        }
        own = {"schedules": {"check_seconds": CHECK_SECONDS}}
        extra = {group: {**own.get(group, {}), **self.overrides.get(group, {})} for group in [*own, *self.overrides]}
        for group, values in extra.items():
            config[group] = {**config.get(group, {}), **values}
        settings = load_settings(config)
        self.runtime = build_runtime(settings, redis_url=redis_url)
        self.env = settings_env(settings)  # every group, the overrides' included
        self.api = ApiServer(create_app(self.runtime), "127.0.0.1", api_port).start()
        say(f"receiver at {self.api.url}")
        self.scheduler = Child("scheduler", "scheduler", self.env, self.log_dir, []).start()
        # Webhook deliveries on a worker of their own (never killed: the campaign's faults are the steps').
        delivering = ["--webhooks", "--concurrency", "4", "--loglevel", "warning", "--hostname", "chaos-webhooks@%h"]
        self.deliveries = Child("worker", "chaos-webhooks", self.env, self.log_dir, delivering).start()
        for _ in range(2):
            self.add_worker()
        say(f"scheduler and {len(self.workers)} workers running (logs in {self.log_dir})")

    def _start_valkey(self) -> str:
        self.valkey = crash_model_valkey(self.folder / "valkey", self.recorder, self.appendfsync)
        self.valkey.start()
        if self.recorder:
            self.recorder.started(self.valkey.data_dir)
        if self.recorder and self.appendfsync == "everysec":  # the engine waits with WAITAOF only then
            probe = redis.Redis.from_url(self.valkey.url)
            try:
                self.waitaof_honest = waitaof_waits_for_fsync(probe, self.valkey.data_dir, self.recorder)
            finally:
                probe.close()
        return self.valkey.url

    def add_worker(self) -> Child:
        self._names += 1
        name = f"chaos-{self._names}"
        extra = ["--pool", "threads", "--concurrency", "4", "--loglevel", "warning", "--hostname", f"{name}@%h"]
        worker = Child("worker", name, self.env, self.log_dir, extra).start()
        self.workers.append(worker)
        return worker

    def kill_worker(self, index: int) -> str:
        """SIGKILL worker ``index`` (modulo the live ones) and start a new one in its place."""
        live = [w for w in self.workers if w.alive] or self.workers
        victim = live[index % len(live)]
        victim.kill()
        self.workers.remove(victim)
        self.add_worker()
        return victim.name

    def kill_scheduler(self, pause: float) -> None:
        assert self.scheduler is not None
        self.scheduler.kill()
        time.sleep(pause)
        self.scheduler.start()

    def restart_redis(self, draw: Callable[[int, int], int] | None) -> Cut | None:
        """SIGKILL Valkey and start it again from its AOF; with ``draw`` (and the crash model), cut the
        AOF's unsynced tail first (:mod:`service.chaos.aof`)."""
        assert self.valkey is not None
        cut = None
        if draw is not None and self.recorder is not None:
            # Under always, unsynced writes last the moment between a write and its fsync (none of them
            # acknowledged yet): the crash cuts wherever it finds the file.
            if self.appendfsync == "everysec":
                self._until_unsynced()
            cut = stop_and_cut(self.valkey, self.recorder, draw)
        else:
            self.valkey.kill()
        self.valkey.start(timeout=60)
        if self.recorder:
            self.recorder.started(self.valkey.data_dir)
        return cut

    def _until_unsynced(self, patience: float = 10.0) -> None:
        """Crash inside ``everysec``'s second: wait (briefly) for a moment when the AOF holds writes no
        fsync has covered yet; a moment with none would lose nothing and test nothing."""
        assert self.valkey is not None and self.recorder is not None
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            current = current_incr(self.valkey.data_dir)
            if current is not None and current.stat().st_size > (self.recorder.fsynced(current) or 0):
                return
            time.sleep(0.005)

    def ensure_running(self) -> None:
        """After the chaos: every process up again (a crashed one restarted)."""
        if self.scheduler is not None and not self.scheduler.alive:
            self.scheduler.start()
        for worker in list(self.workers):
            if not worker.alive:
                self.workers.remove(worker)
                self.add_worker()

    def stop(self) -> None:
        # The children stop at once, side by side: one after another, each a few seconds of Celery's
        # warm shutdown, they took 14 s of a short run.
        children = [*self.workers, *([self.scheduler] if self.scheduler else []), *([self.deliveries] if self.deliveries else [])]
        with ThreadPoolExecutor(max_workers=max(1, len(children)), thread_name_prefix="chaos-stop") as pool:
            for child in children:
                pool.submit(_quietly, child.stop)
        self.workers, self.scheduler, self.deliveries = [], None, None
        for part in (self.api, self.simulator):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()
        if self.runtime is not None:
            self.runtime.close()
        if self.valkey is not None:
            self.valkey.stop()

    def admin(self) -> Any:
        assert self.simulator is not None
        return self.simulator.admin

    def end_pending(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The end of the campaign for PENDING outcomes: forget the ``pend`` rules (the admin API can only
        add them; the simulator runs in this process), then settle every operation still held. Returns the
        rules as they were (with how often each fired) and the ids settled."""
        assert self.simulator is not None
        sim = self.simulator.simulator
        with sim.state.lock:  # no request takes a rule between the count and the clearing
            rules: list[dict[str, Any]] = sim.pending.describe()["rules"]
            sim.pending.clear()
        return rules, self.simulator.admin.settle_pending()


def _quietly(stop: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):
        stop()
