"""The gate at the ASGI level, where what was *read* can be counted: no key, nothing read; too large,
never more than the limit read; otherwise the body reaches the app whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from durapay.service.auth import require_key
from durapay.service.guard import ControlGate

LIMIT = 1000


class Client:
    """Sends a body in chunks and counts how many the server pulled."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0

    async def receive(self) -> Message:
        if self.pulled < len(self.chunks):
            self.pulled += 1
            return {"type": "http.request", "body": self.chunks[self.pulled - 1], "more_body": self.pulled < len(self.chunks)}
        return {"type": "http.disconnect"}


def call(headers: Mapping[str, str], chunks: list[bytes], path: str = "/flows/moto") -> tuple[int, dict[str, Any], Client, bytes]:
    seen: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        seen.append(message["body"])
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = ControlGate(app, key_ok=require_key("k"), limit=LIMIT, is_open=lambda p: p == "/notifications")
    client = Client(chunks)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(gate(scope, client.receive, send))
    status = sent[0]["status"]
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]) or b"{}")
    return status, body, client, b"".join(seen)


def test_without_the_key_nothing_of_the_body_is_read() -> None:
    status, body, client, _ = call({"content-length": str(200 * 1024 * 1024)}, [b"x" * 100] * 50)
    assert (status, body["error"], client.pulled) == (401, "unauthorized", 0)


def test_a_declared_length_above_the_limit_is_refused_before_reading() -> None:
    status, body, client, _ = call({"x-api-key": "k", "content-length": str(LIMIT + 1)}, [b"x" * (LIMIT + 1)])
    assert (status, body["error"], client.pulled) == (413, "too_large", 0)


def test_a_streamed_body_is_refused_as_soon_as_it_passes_the_limit() -> None:
    status, _, client, _ = call({"x-api-key": "k", "transfer-encoding": "chunked"}, [b"x" * 300] * 100)
    assert status == 413
    assert client.pulled == 4, "300 bytes a chunk: the fourth passes 1000"


def test_a_body_within_the_limit_reaches_the_app_whole() -> None:
    status, _, _, seen = call({"authorization": "Bearer k"}, [b"a" * 400, b"b" * 400])
    assert status == 201
    assert seen == b"a" * 400 + b"b" * 400


def test_open_paths_need_no_key_but_keep_the_size_limit() -> None:
    """The console's sign-in form (an open path: it checks its own session) read a 30 MB body whole."""
    status, _, client, seen = call({}, [b"x" * 500, b"y" * 400], path="/notifications")
    assert status == 201 and client.pulled == 2 and seen == b"x" * 500 + b"y" * 400
    status, body, client, _ = call({"transfer-encoding": "chunked"}, [b"x" * 300] * 100, path="/notifications")
    assert (status, body["error"], client.pulled) == (413, "too_large", 4)
    status, _, client, _ = call({"content-length": str(30 * 1024 * 1024)}, [b"x" * 100] * 5, path="/notifications")
    assert (status, client.pulled) == (413, 0)
