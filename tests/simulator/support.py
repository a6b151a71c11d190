"""Helpers of the simulator tests: request builders, a deadline poller, a notification receiver.

The receiver is a real HTTP server (Starlette on uvicorn in a thread), so notifications travel exactly as
they would to durapay's receiver; it can be told to fail its next N deliveries.
"""

from __future__ import annotations

import json
import threading
from typing import Any, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.waiting import wait_until

T = TypeVar("T")

APPROVE = "4349940199004549"
CHALLENGE = "5186151650005008"
DECLINE = "4349940199997007"
THREEDS_FAIL = "5533893874304465"


def order(order_id: str, amount: int = 1500, currency: str = "EUR", **extra: Any) -> dict[str, Any]:
    return {"orderId": order_id, "amount": str(amount), "currency": currency, **extra}


def card(pan: str = APPROVE) -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def session(amount: int = 1500, **extra: Any) -> dict[str, Any]:
    return {"actionType": "PAY", "amount": str(amount), "language": "eng", **extra}


class Receiver:
    """A merchant's notification endpoint that answers 503 to its next ``fail_next`` deliveries."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.fail_next = 0
        self.attempts = 0
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/notify", self._notify, methods=["POST"])])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    async def _notify(self, request: Request) -> Response:
        body = json.loads(await request.body())
        with self._lock:
            self.attempts += 1
            if self.fail_next > 0:
                self.fail_next -= 1
                return Response(status_code=503)
            self.received.append(body)
        return Response('{"outcome":"OK"}', media_type="application/json")

    def start(self) -> Receiver:
        self._thread.start()
        wait_until(lambda: self._server.started, timeout=10, what="the receiver to start")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/notify"

    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.received)
