"""The control API's gate, in front of every protected route: the key first, then the size, then parsing.

Why an ASGI middleware and not a FastAPI dependency: FastAPI reads and parses a route's body *before*
it runs the route's dependencies, so a key checked by a dependency came after a 200 MB body had been
read and parsed (and malformed JSON sent without a key was a 422, not a 401). Here, in order:

1. a client address or key prefix with too many failed authentications in its window: 429 with
   ``Retry-After`` before the key is compared (``service.throttle``); no key, or a wrong one (counted a
   failure): 401 at once, nothing of the body read; a read-only key asking anything but
   ``GET``/``HEAD``/``OPTIONS``: 403 at once (``service.auth``);
2. a declared ``Content-Length`` above the limit: 413 at once; a body without one (chunked) is read
   chunk by chunk and refused with 413 as soon as it passes the limit: never more than the limit in
   memory;
3. a body nested deeper than :data:`MAX_DEPTH` arrays and objects: 422 naming the field (``passThrough.deep``,
   or ``(body)``), before anything parses it;
4. the body, read whole, is handed to the app, which parses it.

Why a depth limit here, once: every reader behind it recurses, each with its own, different limit. Python's
JSON parser stops near 1,000 levels (FastAPI answered that 422), but pydantic's serializer stops near 255
(a ``passThrough`` 280 levels deep passed parsing and validation and failed at the flow's first write: 500,
"Maximum serialization depth exceeded"), and the masking of card numbers, Redis' cjson and the JSON of
history each recurse again. Checked here, on the bytes, by a scan that does not recurse, nothing deeper
than the limit reaches any of them.

The open paths (the notification receiver, which checks the gateway's token and keeps its own, smaller
limit; ``/healthz``; the OpenAPI document and ``/docs``; the console, which checks its own session)
need no key, but their bodies are held to the same limit: the console's sign-in form read a 30 MB body
whole before it answered.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import anyio
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durapay.service.auth import API_KEY_HEADER, READ, READ_METHODS, presented_key
from durapay.service.throttle import Throttle


def _refusal(status: int, error: str, reason: str, *, close: bool) -> JSONResponse:
    # A body left unread cannot be skipped on a kept-alive connection: close it.
    return JSONResponse(
        {"error": error, "reason": reason}, status_code=status, headers={"Connection": "close"} if close else None
    )


#: The deepest nesting of arrays and objects a body may have (the body itself is level 1). Merchant
#: input nests a few levels; 32 leaves room for any ``passThrough`` or ``customField`` while staying far
#: below the shallowest reader behind the gate (pydantic's serializer, near 255).
MAX_DEPTH = 32

# A string (skipped whole, a key when a colon follows), a bracket or a comma; nothing else matters to depth.
_TOKENS = re.compile(rb'"((?:[^"\\]|\\.)*)"(\s*:)?|[\[\]{},]', re.DOTALL)


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> str | None:
    """The field where ``body`` nests deeper than ``limit`` (``(body)`` for the body itself), or None.

    A scan over the bytes, not a parse: it never recurses, and a malformed body is left to the parser
    (whatever this says of it, the body is refused either way). The field is named by its keys, down to
    the first list in its path: ``passThrough.deep`` for ``{"passThrough": {"deep": [[[...]]]}}``."""
    path: list[str | int | None] = []  # per open level: its current key (object) or index (array)
    for token in _TOKENS.finditer(body):
        text = token.group(0)
        if text in (b"{", b"["):
            if len(path) >= limit:
                return _field(path)
            path.append(None if text == b"{" else 0)
        elif text in (b"}", b"]"):
            if path:
                path.pop()
        elif text == b",":
            if path and isinstance(path[-1], int):
                path[-1] += 1
        elif token.group(2) is not None and path and not isinstance(path[-1], int):
            path[-1] = token.group(1).decode("utf-8", "replace")
    return None


def _field(path: list[str | int | None]) -> str:
    named: list[str] = []
    for part in path:
        if not isinstance(part, str):
            break
        named.append(part)
    return ".".join(named[:3]) or "(body)"


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
    ) -> None:
        self.app = app
        self.key_ok = key_ok
        self.limit = limit
        self.is_open = is_open
        self.throttle = throttle

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
        field = None if role == "open" else too_deep(bytes(body))
        if field is not None:
            reason = f"nested deeper than {MAX_DEPTH} levels of arrays and objects"
            answer = JSONResponse({"error": "invalid_input", "reason": reason, "field": field}, status_code=422)
            await answer(scope, receive, send)
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
