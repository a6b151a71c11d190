"""The control API's gate, in front of every protected route: the key first, then the size, then parsing.

Why an ASGI middleware and not a FastAPI dependency: FastAPI reads and parses a route's body *before*
it runs the route's dependencies, so a key checked by a dependency came after a 200 MB body had been
read and parsed (and malformed JSON sent without a key was a 422, not a 401). Here, in order:

1. a client address or key prefix with too many failed authentications in its window: 429 with
   ``Retry-After`` before the key is compared (``service.throttle``); no key, or a wrong one (counted a
   failure): 401 at once, nothing of the body read; a read-only key asking anything but
   ``GET``/``HEAD``/``OPTIONS``: 403 at once (``service.auth``);
2. the path, the query and the headers the application reads, as ``service.inbound`` reads them (UTF-8,
   no control character; 422 naming the field);
3. a declared ``Content-Length`` above the limit: 413 at once; a body without one (chunked) is read
   chunk by chunk and refused with 413 as soon as it passes the limit: never more than the limit in
   memory;
4. the body decoded by the one input boundary, ``service.inbound``: UTF-8 JSON only (415 naming the
   encoding otherwise: a byte order mark, UTF-16, UTF-32), nested at most :data:`MAX_DEPTH` levels on
   the *decoded* text, no lone surrogate, no control character where the field cannot hold one, no
   number out of range (422 naming the field); a console form alike;
5. the body, read whole, is handed to the app, which parses it (now only text the boundary took).

Why a depth limit here, once: every reader behind it recurses, each with its own, different limit. Python's
JSON parser stops near 1,000 levels (FastAPI answered that 422), but pydantic's serializer stops near 255
(a ``passThrough`` 280 levels deep passed parsing and validation and failed at the flow's first write: 500,
"Maximum serialization depth exceeded"), and the masking of card numbers, Redis' cjson and the JSON of
history each recurse again. It is counted on the decoded text: counted on the bytes as if they were ASCII,
a UTF-16 body whose strings held a character with a ``"`` byte hid its brackets (issue 37).

The open paths (``/healthz``; the OpenAPI document and ``/docs``; the console, which checks its own
session) need no key, but their bodies are held to the same limit and the same decoder: the console's
sign-in form read a 30 MB body whole before it answered. The notification receiver (``own_body``) reads
its own body within its own, smaller limit (``DURAPAY_RECEIVER__MAX_BODY_BYTES``, its 413 counted as
``oversized``) and decodes it with the same decoder: the gate reads nothing of it, so that an open path
never buffers the API's larger limit.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durapay.service.auth import API_KEY_HEADER, READ, READ_METHODS, presented_key
from durapay.service.errors import error_response
from durapay.service.inbound import MAX_DEPTH, Refusal, check_body, check_request
from durapay.service.throttle import Throttle

__all__ = ["MAX_DEPTH", "ControlGate"]


def _refusal(status: int, error: str, reason: str, *, close: bool, field: str | None = None) -> JSONResponse:
    # A body left unread cannot be skipped on a kept-alive connection: close it.
    return error_response(status, error, reason, field=field, headers={"Connection": "close"} if close else None)


class ControlGate:
    """``ControlGate(app, key_ok=..., limit=..., is_open=..., throttle=...)``: wraps the whole ASGI app."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        key_ok: Callable[[Headers], str | bool | None],
        limit: int,
        is_open: Callable[[str], bool],
        throttle: Throttle | None = None,
        own_body: Callable[[str], bool] = lambda path: False,
    ) -> None:
        self.app = app
        self.key_ok = key_ok
        self.limit = limit
        self.is_open = is_open
        self.throttle = throttle
        self.own_body = own_body

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
            address, key = (scope.get("client") or ("", 0))[0], presented_key(headers)
            if self.throttle is not None:
                wait = await anyio.to_thread.run_sync(self.throttle.blocked, address, key)
                if wait is not None:
                    reason = "too many failed authentications from this address or with this key; try again later"
                    answer = JSONResponse(
                        {"error": "too_many_attempts", "reason": reason},
                        status_code=429,
                        headers={"Retry-After": str(wait), **({"Connection": "close"} if pending else {})},
                    )
                    await answer(scope, receive, send)
                    return
            role = self.key_ok(headers)
            if not role and self.throttle is not None:
                await anyio.to_thread.run_sync(self.throttle.failed, address, key)
        if not role:
            await _refusal(401, "unauthorized", f"missing or wrong {API_KEY_HEADER}", close=pending)(scope, receive, send)
            return
        if role == READ and scope["method"] not in READ_METHODS:
            reason = "this key is read-only (DURAPAY_API__KEYS): it may look, not act; use an operator key"
            await _refusal(403, "forbidden", reason, close=pending)(scope, receive, send)
            return
        try:
            check_request(scope)
        except Refusal as refused:
            await self._refused(refused, close=pending)(scope, receive, send)
            return
        if self.own_body(scope["path"]):
            # The notification receiver reads its own body, within its own (smaller) limit, and decodes
            # it with the same decoder (NotificationReceiver.receive): nothing of it is read here.
            await self.app(scope, receive, send)
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
        try:
            check_body(bytes(body), headers.get("content-type"))
        except Refusal as refused:
            await self._refused(refused, close=False)(scope, receive, send)
            return
        await self.app(scope, _replay(bytes(body), receive), send)

    @staticmethod
    def _refused(refused: Refusal, *, close: bool) -> JSONResponse:
        return _refusal(refused.status, refused.error, refused.reason, field=refused.field, close=close)

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
