"""Child ``durapay`` processes, as ``durapay demo``, ``durapay chaos`` and ``durapay dev`` run them.

One :class:`Child` is one ``durapay <role>`` process (worker, scheduler, api, simulator) that can be
started again, stopped (SIGTERM, then SIGKILL after a bound) or SIGKILLed like a crashed machine. Its
output goes to a log file; with a ``sink`` it is also handed over line by line (``durapay dev`` streams
it, each line named by its process). :func:`settings_env` gives a child exactly the parent's settings;
:func:`port_or_free` picks a documented port when it is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, SecretStr

from durapay.config import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings
from durapay.config.embedded import free_port

#: A line of a child's output longer than this is cut (a runaway line must not hold the reader).
LINE_LIMIT = 8192
#: How long a child has to stop after SIGTERM before it is SIGKILLed.
STOP_SECONDS = 20.0

#: Where a streamed line goes: the child's name and the line (without its newline).
Sink = Callable[[str, str], None]


def port_or_free(preferred: int, host: str = "127.0.0.1") -> int:
    """``preferred`` if it can be bound now, else a free port."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            probe.bind((host, preferred))
        except OSError:
            return free_port(host)
    return preferred


def settings_env(settings: Settings, *, redis_url: str | None = None) -> dict[str, str]:
    """The environment that makes a child ``durapay`` process load exactly ``settings``: every setting of
    every group (lists and maps as JSON), secrets as they are (a child needs the card keys, the gateway's
    key, the endpoints' secrets), the ``DURAPAY_*`` variables of this process left out. ``redis_url``
    replaces the settings' own (a test's or a benchmark's server).

    The one home of this rule: the copies it replaced each missed something (a group, or secrets in a
    list dumped as ``**********``, which a child then refused as a card key)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(ENV_PREFIX)}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, BaseModel):
            for field in type(value).model_fields:
                inner = getattr(value, field)
                if inner is not None:
                    env[f"{ENV_PREFIX}{name.upper()}{ENV_NESTED_DELIMITER}{field.upper()}"] = _env_text(inner)
        elif value is not None:
            env[f"{ENV_PREFIX}{name.upper()}"] = _env_text(value)
    if redis_url is not None:
        env[f"{ENV_PREFIX}REDIS_URL"] = redis_url
    return env


def _env_text(value: Any) -> str:
    """A setting's value as a variable holds it: a list or a map as JSON, anything else as text."""
    plain = _revealed(value)
    return json.dumps(plain) if isinstance(plain, list | dict) else str(plain)


def _revealed(value: Any) -> Any:
    """``value`` with every secret as its text, models as maps (what ``model_dump`` masks, kept)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return {name: _revealed(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Mapping):
        return {str(key): _revealed(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_revealed(inner) for inner in value]
    if isinstance(value, Path):
        return str(value)
    return value


class Child:
    """One ``durapay <role>`` process, named ``name``, logging to ``<log_dir>/<name>.log``.

    ``sink``: every line of its output is also handed to it. ``own_session``: the child runs in a
    session of its own, so that a Ctrl-C at the terminal reaches only the parent, which then stops the
    children in its own order (``durapay dev``: the services first, Valkey last).
    """

    def __init__(
        self,
        role: str,
        name: str,
        env: dict[str, str],
        log_dir: Path,
        extra: list[str],
        *,
        sink: Sink | None = None,
        own_session: bool = False,
    ) -> None:
        self.role, self.name, self.env, self.extra = role, name, env, extra
        self.log_path = log_dir / f"{name}.log"
        self.sink = sink
        self.own_session = own_session
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> Child:
        command = [sys.executable, "-c", "from durapay.service.cli import main; main()", self.role, *self.extra]
        with self.log_path.open("ab") as log:
            output: int | IO[bytes] = subprocess.PIPE if self.sink is not None else log
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and command
                command, env=self.env, stdout=output, stderr=subprocess.STDOUT, start_new_session=self.own_session
            )
        if self.sink is not None:
            self._reader = threading.Thread(target=self._stream, args=(self.process,), name=f"log-{self.name}", daemon=True)
            self._reader.start()
        return self

    def _stream(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None and self.sink is not None
        pipe = process.stdout
        with self.log_path.open("ab") as log:
            for raw in iter(lambda: pipe.readline(LINE_LIMIT), b""):
                log.write(raw)
                log.flush()
                self.sink(self.name, raw.decode("utf-8", "replace").rstrip("\r\n"))

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def owns(self, lease_owner: str) -> bool:
        """Whether a lease's owner (``<hostname>@<host>``) is this worker (started with ``--hostname name@%h``)."""
        return lease_owner.startswith(f"{self.name}@")

    def kill(self) -> None:
        """SIGKILL: no cleanup, no acknowledgement, as when a machine dies."""
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self._drain()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not stopped within :data:`STOP_SECONDS`."""
        if self.alive:
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.kill()
        self._drain()

    def _drain(self) -> None:
        """Let the reader pass on the last lines of a stopped child (bounded: a grandchild may hold the pipe)."""
        if self._reader is not None:
            self._reader.join(timeout=2)
            self._reader = None
