"""A Celery worker in a separate process, so that tests can kill it with SIGKILL mid-step.

The child builds its runtime exactly as ``durapay worker`` does, from ``DURAPAY_*`` variables, and
consumes with a threads pool: killing the one process kills every step it was running. Its retry
jitter is seeded (``SEED_BASE`` and the worker's name), so a rerun of a test draws the same delays.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import zlib
from pathlib import Path

from durapay.config import Settings
from durapay.service import processes

ROOT = Path(__file__).resolve().parents[3]
#: Every child's random.Random seed is derived from this and its name: fixed across runs, distinct per worker.
SEED_BASE = 20261122


def child_seed(name: str) -> int:
    return SEED_BASE + zlib.crc32(name.encode())


def settings_env(settings: Settings, redis_url: str) -> dict[str, str]:
    """The environment that makes a child process load the same settings (``service.processes``' rule)."""
    return processes.settings_env(settings, redis_url=redis_url) | {"PYTHONPATH": str(ROOT)}


CHILD = """
import random
import sys
from durapay.config import load_settings
from durapay.service.runtime import build_runtime
settings = load_settings()
runtime = build_runtime(settings, redis_url=settings.redis_url, rng=random.Random(int(sys.argv[2])))
runtime.celery.worker_main(["worker", "-P", "threads", "-c", "4", "-Q", "durapay", "-l", "warning",
                            "--without-mingle", "--without-gossip", "--without-heartbeat", "-n", sys.argv[1]])
"""


class WorkerProcess:
    def __init__(self, settings: Settings, redis_url: str, name: str, log_dir: Path) -> None:
        self.env = settings_env(settings, redis_url)
        self.name = name
        self.seed = child_seed(name)
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, f"{self.name}@%h", str(self.seed)], env=self.env, cwd=ROOT, stdout=log, stderr=log
        )
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, no acks, exactly what a crashed machine looks like."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
