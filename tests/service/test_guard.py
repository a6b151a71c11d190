"""The gate at the ASGI level, where what was *read* can be counted: no key, nothing read; too large,
never more than the limit read; a path that reads its own body (the receiver), nothing read by the
gate; otherwise the body, decoded by the input boundary, reaches the app whole."""

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

    gate = ControlGate(
        app,
        key_ok=require_key("k"),
        limit=LIMIT,
        is_open=lambda p: p in ("/notifications", "/console/login"),
        own_body=lambda p: p == "/notifications",
    )
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
    text = json.dumps({"a": "a" * 400, "b": "b" * 400}).encode()
    status, _, _, seen = call({"authorization": "Bearer k"}, [text[:400], text[400:]])
    assert status == 201
    assert seen == text


def test_open_paths_need_no_key_but_keep_the_size_limit() -> None:
    """The console's sign-in form (an open path: it checks its own session) read a 30 MB body whole."""
    form = {"content-type": "application/x-www-form-urlencoded"}
    status, _, client, seen = call(form, [b"x=" + b"x" * 500, b"y" * 400], path="/console/login")
    assert status == 201 and client.pulled == 2 and seen == b"x=" + b"x" * 500 + b"y" * 400
    status, body, client, _ = call({**form, "transfer-encoding": "chunked"}, [b"x" * 300] * 100, path="/console/login")
    assert (status, body["error"], client.pulled) == (413, "too_large", 4)
    status, _, client, _ = call({**form, "content-length": str(30 * 1024 * 1024)}, [b"x" * 100] * 5, path="/console/login")
    assert (status, client.pulled) == (413, 0)


def test_a_path_that_reads_its_own_body_is_not_read_by_the_gate() -> None:
    """The receiver keeps its own, smaller limit (issue 37, finding 7): the gate leaves its body unread,
    however large it is declared, and the route reads it."""
    status, _, client, seen = call({"content-length": str(30 * 1024 * 1024)}, [b"x" * 100] * 5, path="/notifications")
    assert (status, client.pulled, seen) == (201, 1, b"x" * 100), "the app pulled the first chunk itself"


def test_a_body_the_boundary_refuses_never_reaches_the_app() -> None:
    status, body, _, seen = call({"x-api-key": "k"}, [b'{"a": "\\ud800"}'])
    assert (status, body["field"], seen) == (422, "a", b"")
    status, body, _, seen = call({"x-api-key": "k"}, ['{"a": 1}'.encode("utf-16")])
    assert (status, body["error"], seen) == (415, "unsupported_encoding", b"")
