"""A merchant's webhook receiver on 127.0.0.1, for the webhook tests, the chaos run and the benchmark.

It checks every request with the independent ``standardwebhooks`` package (not durapay's own code), and
is idempotent as a receiver must be: it *applies* each event id once, however often it arrives, and
counts the repeats. ``answer`` decides each reply (to inject 500s, 429s with Retry-After, 410...);
``down()`` closes the port (connections refused) and ``up()`` opens it again on the same port.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

from durapay.config.embedded import free_port

Answer = Callable[[dict[str, Any]], tuple[int, dict[str, str]]]


@dataclass
class Received:
    id: str
    type: str
    body: dict[str, Any]
    status: int
    headers: dict[str, str] = field(repr=False, default_factory=dict)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-request (a worker SIGKILLed) is expected here, not worth a traceback."""


class WebhookReceiver:
    def __init__(self, port: int | None = None, answer: Answer | None = None) -> None:
        self.port = port or free_port()
        self.secrets: list[str] = []
        self.answer: Answer = answer or (lambda body: (200, {}))
        self.received: list[Received] = []
        self.applied: dict[str, dict[str, Any]] = {}
        self.repeats = 0
        self.refused = 0
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()

    @property
    def is_up(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def handle(self, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, str]]:
        body: dict[str, Any] | None = None
        for secret in self.secrets:
            try:
                body = Webhook(secret).verify(raw, headers)
                break
            except WebhookVerificationError:
                continue
        if body is None:
            with self.lock:
                self.refused += 1
            return 400, {}
        status, extra = self.answer(body)
        with self.lock:
            self.received.append(Received(str(body["id"]), str(body["type"]), body, status, headers))
            if 200 <= status < 300:
                if body["id"] in self.applied:
                    self.repeats += 1
                else:
                    self.applied[str(body["id"])] = body
        return status, extra

    def up(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a merchant's server would
            # The answer's headers and body go out in two writes: with Nagle's algorithm the body waited
            # for durapay's ACK of the headers, which its kernel delays by 40 ms, on every kept connection:
            # each delivery took 44 ms of a worker thread in the bench. Servers merchants run (uvicorn,
            # nginx, gunicorn) send at once.
            disable_nagle_algorithm = True

            def setup(self) -> None:
                super().setup()
                with receiver.lock:
                    receiver._open.add(self.connection)

            def finish(self) -> None:
                with receiver.lock:
                    receiver._open.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                status, extra = receiver.handle({k.lower(): v for k, v in self.headers.items()}, raw)
                payload = json.dumps({"status": status}).encode()
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        """Close the port and every open (kept-alive) connection: clients find nobody there."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:
            for connection in list(self._open):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> WebhookReceiver:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
