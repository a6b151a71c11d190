"""The control API's gate, in front of every protected route: the key first, then the size, then parsing.

Why an ASGI middleware and not a FastAPI dependency: FastAPI reads and parses a route's body *before*
it runs the route's dependencies, so a key checked by a dependency came after a 200 MB body had been
read and parsed (and malformed JSON sent without a key was a 422, not a 401). Here, in order:

1. no key, or a wrong one: 401 at once, nothing of the body read;
2. a declared ``Content-Length`` above the limit: 413 at once; a body without one (chunked) is read
   chunk by chunk and refused with 413 as soon as it passes the limit: never more than the limit in
   memory;
3. the body, read whole, is handed to the app, which parses it.

The open paths (the notification receiver, which has its own limit and checks the gateway's token;
``/healthz``; the OpenAPI document and ``/docs``) pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import API_KEY_HEADER


def _refusal(status: int, error: str, reason: str, *, close: bool) -> JSONResponse:
    # A body left unread cannot be skipped on a kept-alive connection: close it.
    return JSONResponse(
        {"error": error, "reason": reason}, status_code=status, headers={"Connection": "close"} if close else None
    )


class ControlGate:
    """``ControlGate(app, key_ok=..., limit=..., is_open=...)``: wraps the whole ASGI app."""

    def __init__(self, app: ASGIApp, *, key_ok: Callable[[Headers], bool], limit: int, is_open: Callable[[str], bool]) -> None:
        self.app = app
        self.key_ok = key_ok
        self.limit = limit
        self.is_open = is_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        pending = (declared is not None and declared != "0") or "transfer-encoding" in headers
        if not self.key_ok(headers):
            await _refusal(401, "unauthorized", f"missing or wrong {API_KEY_HEADER}", close=pending)(scope, receive, send)
            return
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
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
