"""The real API for the HTTP client's tests (``tests/test_client.py``, ``test_client_async.py``).

``client_stack``: one whole stack per test module (the session's Valkey under a prefix of its own, a
Celery worker, a dispatcher, the simulator over HTTP, the API served by uvicorn): the client talks to
what a merchant's backend talks to. Module-scoped to keep the suite quick; tests that count flows or
events read from a position taken before they act, never assume an empty store.

``FlakyProxy``: a TCP proxy in front of the API that fails its first connections for real (closed
unread, or the request passed on and the answer swallowed), so that retries are tested against
transport failures the operating system produces, not a mock.

``idle_api``: the API alone (no worker), holding a start's answer for its configured wait.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import pytest
from celery.contrib.testing.worker import start_worker

from durapay.service.app import create_app
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.dispatcher import Dispatcher
from tests.workflows.integration.conftest import stack_settings

API_KEY = "client-test-key-0123456789"
Fault = Literal["drop", "swallow"]


@dataclass
class ClientStack:
    runtime: Runtime
    simulator: SimulatorServer
    server: ApiServer

    @property
    def engine(self) -> Engine:
        return self.runtime.engine

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def client_stack(redis_url: str) -> Iterator[ClientStack]:
    with SimulatorServer(SimulatorConfig(seed=31)) as simulator:
        settings = stack_settings(
            "t" + uuid.uuid4().hex[:10],
            simulator.base_url,
            api={"key": API_KEY, "start_wait_seconds": 0.0},
            webhooks={"allow_private": True},
        )
        runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(13))
        dispatcher = Dispatcher(runtime.engine, interval=0.05)
        with ExitStack() as stack:
            stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=2, perform_ping_check=False))
            dispatcher.start()
            stack.callback(dispatcher.stop)
            server = stack.enter_context(ApiServer(create_app(runtime)))
            yield ClientStack(runtime, simulator, server)
        runtime.close()


@pytest.fixture
def idle_api(redis_url: str) -> Iterator[tuple[ApiServer, Runtime]]:
    """The real API with no worker (a busy or slow one looks the same to it), set to wait 3 s for a
    customer URL (``DURAPAY_API__START_WAIT_SECONDS``): a start holds its answer that long."""
    settings = stack_settings(
        "t" + uuid.uuid4().hex[:10], "http://127.0.0.1:9/api", api={"key": API_KEY, "start_wait_seconds": 3.0}
    )
    runtime = build_runtime(settings, redis_url=redis_url)
    with ApiServer(create_app(runtime)) as server:
        yield server, runtime
    runtime.close()


class Recording(httpx.HTTPTransport):
    """A real transport that notes each request's method and path (which routes a client sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path))
        return super().handle_request(request)


class AsyncRecording(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.method, request.url.path))
        return await super().handle_async_request(request)


@dataclass
class FlakyProxy:
    """``with FlakyProxy(api_url, ["drop"]) as proxy: proxy.url`` - connections to ``proxy.url`` reach the
    API, but the first ones fail as ``faults`` says: ``drop`` closes the connection without reading it;
    ``swallow`` passes the request on and, once the API answers, closes the connection without passing
    the answer (the API acted; the client hears nothing). ``connections`` counts what came in."""

    target: str
    faults: list[Fault]
    connections: int = 0
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._listener is not None
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> FlakyProxy:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._listener is not None
        _close(self._listener)  # shut down, not only closed: that is what wakes the accepting thread
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                accepted, _ = self._listener.accept()
            except OSError:  # closed: the proxy stops
                return
            with self._lock:
                self.connections += 1
                fault = self.faults.pop(0) if self.faults else None
            self._spawn(self._serve, accepted, fault)

    def _serve(self, downstream: socket.socket, fault: Fault | None) -> None:
        if fault == "drop":
            downstream.close()
            return
        host, port = self.target.removeprefix("http://").split(":")
        upstream = socket.create_connection((host, int(port)), timeout=30)
        self._spawn(_pump, downstream, upstream)
        if fault == "swallow":
            with contextlib.suppress(OSError):
                upstream.recv(65536)  # the API's answer begins: it acted
            _close(downstream, upstream)
            return
        _pump(upstream, downstream)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes one way until either side closes, then close both."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    _close(source, sink)


def _close(*sockets: socket.socket) -> None:
    for each in sockets:
        with contextlib.suppress(OSError):
            each.shutdown(socket.SHUT_RDWR)
        each.close()
