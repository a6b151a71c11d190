"""Serving the app on uvicorn: in the foreground (``durapay api``) or in a thread (tests, the demo).

One uvicorn worker per process (more workers added ~44 ms per keep-alive request: docs/architecture.md);
scale out with more processes behind a load balancer. Access logs are off: every notification would
log a line; the receiver logs what matters itself.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType

import uvicorn
from fastapi import FastAPI

START_TIMEOUT_SECONDS = 15.0


def uvicorn_config(app: FastAPI, host: str, port: int, *, log_level: str = "warning") -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        workers=1,
        lifespan="off",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=5,
    )


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def serve_forever(app: FastAPI, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, then exit with status 0.

    uvicorn shuts down gracefully on either signal and then raises it again once its own handlers are
    gone; the handlers installed here turn that into a clean exit instead of death by signal.
    """
    previous = signal.signal(signal.SIGTERM, _exit_quietly)
    try:
        uvicorn.Server(uvicorn_config(app, host, port, log_level="info")).run()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


class ApiServer:
    """``with ApiServer(app) as server: server.url`` - the app on a free port in a background thread."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServer:
        server = uvicorn.Server(uvicorn_config(self.app, self.host, self.port))
        thread = threading.Thread(target=server.run, name="durapay-api", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError(f"the API did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = int(server.servers[0].sockets[0].getsockname()[1])
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
