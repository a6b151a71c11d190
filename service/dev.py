"""``durapay dev``: everything a developer needs running, from one command, with consistent settings.

The parts, each its own process (:class:`~service.processes.Child`) in a session of its own, so that
a Ctrl-C reaches only ``durapay dev``, which stops them in order (the services, then Valkey):

* an embedded Valkey under ``<data dir>/valkey`` (AOF ``always``), or the configured
  ``DURAPAY_REDIS_URL``;
* the gateway simulator (``durapay simulator``; its state kept in ``<data dir>/dev/simulator.json``,
  so that the gateway still knows the orders of flows kept in Valkey after a restart);
* the API with the console (``durapay api``), a worker (``durapay worker``), a webhook deliveries worker
  (``durapay worker --webhooks``) and a scheduler (``durapay scheduler``), all given the same Redis,
  gateway, receiver and key.

**Valkey is owned by none of the services.** ``durapay dev`` owns it: when it dies, dev starts it again
on the same port with the same data, and the services, which never started it, reconnect to it as they
do to any Redis (``durapay api`` answers 503 meanwhile; the worker and the scheduler wait and say so).
The same watch starts again a service that exited. Restarts are bounded (:data:`RESTARTS` within
:data:`RESTART_WINDOW` seconds per part): past that, dev stops everything and exits 1.

The operator key is ``DURAPAY_API__KEY`` when set, else one generated once and kept in
``<data dir>/dev/operator-key`` (readable by its owner only), so that a script keeps working across runs.
The card key likewise: ``DURAPAY_CARD__KEYS`` when set, else one kept in ``<data dir>/dev/card-keys``
(card data is written to Redis only sealed with it, ``workflows.engine.cards``).
Ports: 8780 (API) and 8781 (simulator) when free, else free ones.

**dev tells the other commands of its folder its settings.** The ``DURAPAY_*`` variables it gives its
services (its Redis, the simulator as the gateway, the API's key, and whatever its own environment set,
``DURAPAY_WEBHOOKS__ALLOW_PRIVATE=true`` say) are kept in ``<data dir>/dev/settings.env`` (its owner
only) while it runs, the first line naming dev's process. A command run with no ``DURAPAY_REDIS_URL`` in
the same data folder reads them under its own environment (:func:`shared_settings`; its own variables
win), so ``durapay webhooks add http://127.0.0.1:8000/hooks`` is checked by the rule dev's workers
deliver by, and ``durapay schedules add --customer`` looks the contract up at dev's simulator, without the
variables exported again. The file goes when dev stops; one whose process is gone is not read.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from durapay.config import ENV_NESTED_DELIMITER, ENV_PREFIX, SIMULATOR_API_KEY, Settings
from durapay.config.embedded import EmbeddedValkey, free_port, running_embedded
from durapay.config.settings import TOOL_PREFIX, TOOL_VARIABLES
from durapay.service.processes import Child, Sink, port_or_free
from durapay.service.runtime import embedded_folder, restart_embedded, start_embedded, stop_embedded
from durapay.simulator import SimulatorConfig
from durapay.workflows.engine import kept_keys

#: Where dev keeps its logs, the simulator's state and the generated operator key, under the data folder.
DEV_FOLDER = "dev"
#: The settings dev shares with the commands of its folder (module docstring), in dotenv form.
SHARED_SETTINGS = "settings.env"
_SHARED_HEAD = "# durapay dev "
SIMULATOR_PORT = 8781
#: At most this many restarts of one part within :data:`RESTART_WINDOW` seconds.
RESTARTS = 5
RESTART_WINDOW = 60.0
#: How often the watch looks at the parts.
WATCH_SECONDS = 0.25
#: How long the parts have to become ready (``/readyz``: Redis, the workers and a scheduler alive).
READY_SECONDS = 120.0

Say = Callable[[str], None]


@dataclass(frozen=True)
class Places:
    """Where everything is, for the banner."""

    api_url: str
    console_url: str
    key: str
    simulator_url: str
    redis_url: str
    data_dir: Path
    log_dir: Path


def _env_name(group: str, name: str) -> str:
    return f"{ENV_PREFIX}{group.upper()}{ENV_NESTED_DELIMITER}{name.upper()}"


def publish_settings(folder: Path, env: Mapping[str, str]) -> Path:
    """Write the ``DURAPAY_*`` settings of ``env`` (no test or tool knob) to ``folder/settings.env``, its
    owner only, under a first line naming this process: what :func:`shared_settings` reads."""
    lines = [f"{_SHARED_HEAD}{os.getpid()}: the settings of its services (docs/cli.md, durapay dev)"]
    for name, value in sorted(env.items()):
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in TOOL_VARIABLES and not upper.startswith(TOOL_PREFIX):
            quoted = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            lines.append(f'{name}="{quoted}"')
    path = folder / SHARED_SETTINGS
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def shared_settings(data_dir: Path) -> Path | None:
    """The settings file of the ``durapay dev`` running on ``data_dir``, or None (no dev, or one that died:
    the process its first line names is gone)."""
    path = Path(data_dir).resolve() / DEV_FOLDER / SHARED_SETTINGS
    try:
        with path.open() as handle:
            head = handle.readline()
    except OSError:
        return None
    pid = head.removeprefix(_SHARED_HEAD).partition(":")[0]
    if not head.startswith(_SHARED_HEAD) or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's process: alive
    return path


def operator_key(settings: Settings, folder: Path) -> str:
    """``DURAPAY_API__KEY`` when set; else the key kept in ``folder``, generated the first time."""
    configured = settings.api.key.get_secret_value()
    if configured:
        return configured
    path = folder / "operator-key"
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    key = secrets.token_urlsafe(24)
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key + "\n")
    return key


class ValkeyPart:
    """dev's own Valkey as a part the watch can look at and start again (same port, same data)."""

    name = "valkey"

    def __init__(self, server: EmbeddedValkey) -> None:
        self.server = server

    @property
    def alive(self) -> bool:
        return self.server.process is not None and self.server.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.server.process is None else self.server.process.poll()

    def start(self) -> ValkeyPart:
        restart_embedded(self.server)
        return self

    def stop(self) -> None:
        stop_embedded(self.server)


Part = Child | ValkeyPart


class DevStack:
    """Start with :meth:`start`; :meth:`watch` until stopped; :meth:`stop` (it stops what was started)."""

    def __init__(self, settings: Settings, sink: Sink, *, api_port: int, simulator_port: int) -> None:
        self.settings = settings
        self.sink = sink
        self.ports = (api_port, simulator_port)
        self.data_dir = Path(settings.data_dir).resolve()
        self.log_dir = self.data_dir / DEV_FOLDER
        self.valkey: ValkeyPart | None = None
        self.services: list[Child] = []
        self.places: Places | None = None
        #: Set when dev must stop: Ctrl-C, or a part that keeps dying (then :attr:`failure` says which).
        self.stopping = threading.Event()
        self.failure: str | None = None
        self._restarts: dict[str, deque[float]] = {}

    def say(self, text: str) -> None:
        self.sink("dev", text)

    def start(self) -> Places:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        redis_url = self.settings.redis_url or self._start_valkey()
        api_port, sim_port = (port_or_free(port) if port else free_port() for port in self.ports)
        api_url = f"http://127.0.0.1:{api_port}"
        simulator_root = f"http://127.0.0.1:{sim_port}"
        key = operator_key(self.settings, self.log_dir)
        # Card data is written to Redis only sealed: the configured keys, else one kept in the dev folder.
        card_keys = [entry.get_secret_value() for entry in self.settings.card.keys] or kept_keys(self.log_dir, make=True)
        env = dict(os.environ)
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                f"{ENV_PREFIX}REDIS_URL": redis_url,
                f"{ENV_PREFIX}DATA_DIR": str(self.data_dir),
                _env_name("gateway", "base_url"): simulator_root + SimulatorConfig().path_prefix,
                _env_name("gateway", "api_key"): SIMULATOR_API_KEY,
                _env_name("receiver", "public_url"): api_url + self.settings.receiver.path,
                _env_name("api", "host"): "127.0.0.1",
                _env_name("api", "port"): str(api_port),
                _env_name("api", "key"): key,
                _env_name("card", "keys"): json.dumps(card_keys),
            }
        )
        publish_settings(self.log_dir, env)
        state = ["--state-file", str(self.log_dir / "simulator.json")]
        roles = [
            ("simulator", ["--port", str(sim_port), *state]),
            ("api", []),
            ("worker", ["--pool", "threads", "--concurrency", "4", "--loglevel", "warning", "--hostname", "dev@%h", "--quiet"]),
            # Webhook deliveries on a worker of their own (a slow endpoint never holds a step's thread).
            (
                "webhooks",
                ["--webhooks", "--concurrency", "4", "--loglevel", "warning", "--hostname", "dev-webhooks@%h", "--quiet"],
            ),
            ("scheduler", []),
        ]
        for name, extra in roles:
            role = "worker" if name == "webhooks" else name
            child = Child(role, name, env, self.log_dir, extra, sink=self.sink, own_session=True)
            self.services.append(child.start())
        self.places = Places(api_url, f"{api_url}/console", key, simulator_root, redis_url, self.data_dir, self.log_dir)
        self._wait_ready(api_url, key)
        return self.places

    def _start_valkey(self) -> str:
        folder = embedded_folder(self.settings)
        running = running_embedded(folder)
        if running is not None:
            raise RuntimeError(
                f"a Valkey already serves {folder} ({running}), started by another durapay process: "
                "stop that process, or give durapay dev another --data-dir"
            )
        url, server = start_embedded(folder, own_session=True)
        if server is None:  # another process started one between the check and the start
            raise RuntimeError(f"a Valkey already serves {folder} ({url}), started by another durapay process")
        self.valkey = ValkeyPart(server)
        self.say(f"valkey on {url} (AOF under {folder})")
        return url

    def _wait_ready(self, api_url: str, key: str) -> None:
        deadline = time.monotonic() + READY_SECONDS
        with httpx.Client(base_url=api_url, headers={"X-Api-Key": key}, timeout=5) as http:
            while True:
                try:
                    if http.get("/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # the API is still starting
                dead = [child for child in self.services if not child.alive]
                if dead:
                    raise RuntimeError(f"{dead[0].name} exited with status {dead[0].returncode}; see {dead[0].log_path}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready within {READY_SECONDS:g}s (GET {api_url}/readyz); see {self.log_dir}")
                time.sleep(0.2)

    @property
    def parts(self) -> list[Part]:
        return [*([self.valkey] if self.valkey else []), *self.services]

    def watch(self) -> None:
        """Until :attr:`stopping` is set: start again any part that died (Valkey first, on its port and
        data), at most :data:`RESTARTS` times within :data:`RESTART_WINDOW` seconds each."""
        while not self.stopping.wait(WATCH_SECONDS):
            for part in self.parts:
                if part.alive or self.stopping.is_set():
                    continue
                if not self._may_restart(part.name):
                    self.failure = f"{part.name} exited {RESTARTS} times within {RESTART_WINDOW:g}s (see {self.log_dir})"
                    self.stopping.set()
                    return
                what = "on the same port, with its data" if part is self.valkey else "again"
                self.say(f"{part.name} exited (status {part.returncode}); starting it {what}")
                try:
                    part.start()
                except (OSError, RuntimeError, TimeoutError) as exc:
                    self.say(f"{part.name} did not start: {exc}")

    def _may_restart(self, name: str) -> bool:
        now = time.monotonic()
        recent = self._restarts.setdefault(name, deque(maxlen=RESTARTS))
        if len(recent) == RESTARTS and now - recent[0] < RESTART_WINDOW:
            return False
        recent.append(now)
        return True

    def stop(self) -> None:
        """The services (SIGTERM, bounded), then Valkey (its AOF flushed); the shared settings go first."""
        self.stopping.set()
        (self.log_dir / SHARED_SETTINGS).unlink(missing_ok=True)
        for child in reversed(self.services):
            child.stop()
        self.services = []
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None
