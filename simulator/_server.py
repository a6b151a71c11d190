"""Serving the simulator: in a background thread for tests and the demo, or in the foreground for the CLI.

One uvicorn worker (more workers cost ~44 ms per keep-alive request: docs/architecture.md), the pure-Python
h11 protocol (its connection object is what the dropped-connection fault closes), no access log, and a
one-second graceful shutdown so that a hanging request never holds ``stop()`` up.

::

    with SimulatorServer(SimulatorConfig(seed=1)) as sim:
        client = GatewayClient(GatewaySettings(base_url=sim.base_url))
        ...
        sim.admin.set_faults(mode="commit_then_fail", operation="three_steps_payment", count=1)
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType

import uvicorn

from durapay.simulator._admin import SimulatorAdmin
from durapay.simulator._app import build_app
from durapay.simulator._config import SimulatorConfig
from durapay.simulator._core import Simulator
from durapay.simulator._state import SimulatorState

START_TIMEOUT_SECONDS = 10.0


def uvicorn_config(sim: Simulator) -> uvicorn.Config:
    return uvicorn.Config(
        build_app(sim),
        host=sim.config.host,
        port=sim.config.port,
        workers=1,
        http="h11",
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=1,
    )


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def serve_forever(config: SimulatorConfig) -> None:
    """Serve in the foreground until SIGINT or SIGTERM (``durapay simulator``), then save the state file.

    uvicorn shuts down gracefully on the signal and then raises it again; the handler installed here
    turns that into a clean exit, so the state is saved instead of the process dying mid-way.
    """
    sim = Simulator(config)
    sim.start()
    previous = signal.signal(signal.SIGTERM, _exit_quietly)
    try:
        uvicorn.Server(uvicorn_config(sim)).run()
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
        signal.signal(signal.SIGTERM, previous)


class SimulatorServer:
    """The simulator on uvicorn in a background thread. ``port=0`` in the config picks a free port."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self.simulator = Simulator(self.config)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._admin: SimulatorAdmin | None = None
        self._port = 0

    def start(self) -> SimulatorServer:
        if self._server is not None:
            return self
        self.simulator.start()
        server = uvicorn.Server(uvicorn_config(self.simulator))
        thread = threading.Thread(target=server.run, name="simulator-uvicorn", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                self.simulator.stop()
                raise RuntimeError(f"simulator did not start on {self.config.host}:{self.config.port}")
            time.sleep(0.01)
        self._port = server.servers[0].sockets[0].getsockname()[1]
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None
        self.simulator.stop()

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the simulator is not running: call start() first")
        return self._port

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:PORT``: where the simulator's pages and ``/_sim/`` live."""
        wildcard = self.config.host in ("0.0.0.0", "::", "")  # noqa: S104 - reading the bind address, not binding
        host = "127.0.0.1" if wildcard else self.config.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The gateway base URL (root + the gateway's path prefix), for ``GatewaySettings(base_url=...)``."""
        return self.root_url + self.config.path_prefix

    @property
    def admin(self) -> SimulatorAdmin:
        if self._admin is None:
            self._admin = SimulatorAdmin(self.root_url)
        return self._admin

    @property
    def state(self) -> SimulatorState:
        return self.simulator.state
