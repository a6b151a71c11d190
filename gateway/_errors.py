"""The gateway error tree. Every error says whether to retry, and whether the gateway may have acted.

::

    GatewayError                      .retryable  .ambiguous
    ├── RequestInvalid                   no          no     refused before sending (which field, why)
    ├── TransportError                   yes         ...    no HTTP answer
    │   ├── GatewayUnreachable           yes         no     connection never made: nothing was sent
    │   ├── GatewayTimeout               yes         yes*   no answer in time (*no if the connect timed out)
    │   └── ConnectionDropped            yes         yes    the connection broke after sending
    ├── HTTPStatusError                                      an answer with an error status
    │   ├── BadRequest (400)             no          no     ``errors`` = [{code, description}];
    │   │                                                    ``.already_done``: a duplicate (see below)
    │   ├── Unauthorized (401)           no          no
    │   ├── NotFound (404)               no          no
    │   ├── RateLimited (429)            yes         no     ``retry_after`` seconds when the gateway says
    │   ├── ServerError (5xx)            yes         yes    the gateway may have committed before failing
    │   └── UnexpectedStatus             no          yes
    ├── InvalidResponse                  yes         yes    a 2xx whose body does not parse
    └── NotificationError                no          no
        └── InvalidSecurityToken         no          no     the token does not match any kept for the order

``ambiguous`` means "the request may have taken effect at the gateway": the engine then reads the
gateway (the operation's ``reconcile``) before any resend of an operation that is not ``retry_safe``.
Retries themselves belong to the engine; the client never retries on its own.

A 400 that says the thing *already exists* (``orderId already used``, ``operation already completed``,
``contract ... already exists``) is not a refusal of the request but news that it was made before: a
resend after a lost answer, or after a lost write of durapay's own. ``BadRequest.already_done`` is the
one place that recognises it; the engine then reads the gateway and adopts what it holds, if it is
this flow's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class ErrorDetail:
    """One item of the gateway's ``errors`` list."""

    code: str
    description: str

    def __str__(self) -> str:
        return f"{self.code}: {self.description}" if self.code else self.description


class GatewayError(Exception):
    """Base of every error the gateway client raises."""

    retryable: bool = False
    ambiguous: bool = False

    def __init__(
        self,
        message: str,
        *,
        operation: str = "",
        correlation_id: str = "",
        status_code: int | None = None,
        errors: Sequence[ErrorDetail] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.operation = operation
        self.correlation_id = correlation_id
        self.status_code = status_code
        self.errors: tuple[ErrorDetail, ...] = tuple(errors)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(error.code for error in self.errors)

    def to_dict(self) -> dict[str, Any]:
        """What the flow record keeps of this error."""
        return {
            "type": type(self).__name__,
            "message": self.message,
            "operation": self.operation,
            "status": self.status_code,
            "errors": [{"code": e.code, "description": e.description} for e in self.errors],
            "retryable": self.retryable,
            "ambiguous": self.ambiguous,
            "correlation_id": self.correlation_id,
        }


class RequestInvalid(GatewayError):
    """The request was refused before sending: a field is missing or malformed (``field``, ``reason``)."""

    def __init__(self, message: str, *, field: str = "", reason: str = "", operation: str = "") -> None:
        super().__init__(message, operation=operation)
        self.field = field
        self.reason = reason


class TransportError(GatewayError):
    retryable = True


class GatewayUnreachable(TransportError):
    """The connection could not be made; nothing reached the gateway."""


class GatewayTimeout(TransportError):
    """No answer in time. After the request was sent the outcome is unknown (``ambiguous``)."""

    def __init__(self, message: str, *, sent: bool, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.ambiguous = sent


class ConnectionDropped(TransportError):
    """The connection broke after the request went out: the gateway may have acted."""

    ambiguous = True


class HTTPStatusError(GatewayError):
    """The gateway answered with an error status."""


#: What the gateway says, in a 400's descriptions, when what a request would create already exists.
ALREADY_DONE_PHRASES = ("already used", "already completed", "already exists")


class BadRequest(HTTPStatusError):
    """400: the gateway refused the request ("Invalid request data" / "Request rejected")."""

    @property
    def already_done(self) -> bool:
        """The request (or one with the same order, operation or contract) was made before."""
        return any(phrase in error.description.lower() for error in self.errors for phrase in ALREADY_DONE_PHRASES)


class Unauthorized(HTTPStatusError):
    """401: the API key was refused."""


class NotFound(HTTPStatusError):
    """404: no such resource."""


class RateLimited(HTTPStatusError):
    """429: too many requests; ``retry_after`` is the gateway's hint in seconds, if it gave one."""

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(HTTPStatusError):
    """5xx: the gateway failed; it may have committed the request first (commit-then-fail)."""

    retryable = True
    ambiguous = True


class UnexpectedStatus(HTTPStatusError):
    """A status the gateway is not known to use."""

    ambiguous = True


class InvalidResponse(GatewayError):
    """A success status whose body does not fit the operation's response model."""

    retryable = True
    ambiguous = True


class NotificationError(GatewayError):
    """A notification body that cannot be accepted."""


class InvalidSecurityToken(NotificationError):
    """The notification's security token matches no token kept for its order."""


def _error_details(response: httpx.Response) -> list[ErrorDetail]:
    try:
        body = response.json()
    except ValueError:
        return []
    items = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return []
    return [
        ErrorDetail(code=str(item.get("code") or ""), description=str(item.get("description") or ""))
        for item in items
        if isinstance(item, dict)
    ]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_from_response(response: httpx.Response, *, operation: str = "", correlation_id: str = "") -> GatewayError:
    """The one mapping from an error answer to the error tree."""
    status = response.status_code
    details = _error_details(response)
    summary = "; ".join(str(d) for d in details) or response.reason_phrase or "no body"
    kwargs: dict[str, Any] = {
        "operation": operation,
        "correlation_id": correlation_id,
        "status_code": status,
        "errors": details,
    }
    message = f"{operation or 'gateway'}: HTTP {status}: {summary}"
    if status == 400:
        return BadRequest(message, **kwargs)
    if status == 401:
        return Unauthorized(message, **kwargs)
    if status == 404:
        return NotFound(message, **kwargs)
    if status == 429:
        return RateLimited(message, retry_after=_retry_after(response), **kwargs)
    if status >= 500:
        return ServerError(message, **kwargs)
    return UnexpectedStatus(message, **kwargs)


def error_from_transport(exc: httpx.TransportError, *, operation: str = "", correlation_id: str = "") -> GatewayError:
    """Map an httpx transport failure, deciding whether the request may have reached the gateway."""
    kwargs: dict[str, Any] = {"operation": operation, "correlation_id": correlation_id}
    text = f"{operation or 'gateway'}: {type(exc).__name__}: {exc or 'no detail'}"
    if isinstance(exc, httpx.ConnectTimeout):
        return GatewayTimeout(text, sent=False, **kwargs)
    if isinstance(exc, httpx.TimeoutException):
        # Read, write and pool timeouts: a write timeout may have sent part or all of the request.
        return GatewayTimeout(text, sent=not isinstance(exc, httpx.PoolTimeout), **kwargs)
    if isinstance(exc, httpx.ConnectError):
        return GatewayUnreachable(text, **kwargs)
    return ConnectionDropped(text, **kwargs)
