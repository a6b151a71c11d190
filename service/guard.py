"""The control API's gate, in front of every protected route: the key first, then the size, then parsing.

Why an ASGI middleware and not a FastAPI dependency: FastAPI reads and parses a route's body *before*
it runs the route's dependencies, so a key checked by a dependency came after a 200 MB body had been
read and parsed (and malformed JSON sent without a key was a 422, not a 401). Here, in order:

1. no key, or a wrong one: 401 at once, nothing of the body read; a read-only key asking anything but
   ``GET``/``HEAD``/``OPTIONS``: 403 at once (``service.auth``);
2. a declared ``Content-Length`` above the limit: 413 at once; a body without one (chunked) is read
   chunk by chunk and refused with 413 as soon as it passes the limit: never more than the limit in
   memory;
3. the body, read whole, is handed to the app, which parses it.

The open paths (the notification receiver, which checks the gateway's token and keeps its own, smaller
limit; ``/healthz``; the OpenAPI document and ``/docs``; the console, which checks its own session)
need no key, but their bodies are held to the same limit: the console's sign-in form read a 30 MB body
whole before it answered.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durapay.service.auth import API_KEY_HEADER, READ, READ_METHODS


def _refusal(status: int, error: str, reason: str, *, close: bool) -> JSONResponse:
    # A body left unread cannot be skipped on a kept-alive connection: close it.
    return JSONResponse(
        {"error": error, "reason": reason}, status_code=status, headers={"Connection": "close"} if close else None
    )


class ControlGate:
    """``ControlGate(app, key_ok=..., limit=..., is_open=...)``: wraps the whole ASGI app."""

    def __init__(
        self, app: ASGIApp, *, key_ok: Callable[[Headers], str | bool | None], limit: int, is_open: Callable[[str], bool]
    ) -> None:
        self.app = app
        self.key_ok = key_ok
        self.limit = limit
        self.is_open = is_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        pending = (declared is not None and declared != "0") or "transfer-encoding" in headers
        if self.is_open(scope["path"]):
            role: str | bool | None = "open"
        else:
            role = self.key_ok(headers)
        if not role:
            await _refusal(401, "unauthorized", f"missing or wrong {API_KEY_HEADER}", close=pending)(scope, receive, send)
            return
        if role == READ and scope["method"] not in READ_METHODS:
            reason = "this key is read-only (DURAPAY_API__KEYS): it may look, not act; use an operator key"
            await _refusal(403, "forbidden", reason, close=pending)(scope, receive, send)
            return
        if declared is not None and (declared.isascii() and declared.isdigit()) and int(declared) > self.limit:
            await self._too_large(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left: nothing to answer
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
            if len(body) > self.limit:
                await self._too_large(scope, receive, send)
                return
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _refusal(413, "too_large", f"body larger than {self.limit} bytes", close=True)(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body read already, then whatever the client sends next."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
