"""The control API's key check: ``X-Api-Key`` (or ``Authorization: Bearer``), compared in constant time.

Why both headers: merchants' backends send ``X-Api-Key``; Prometheus can only send a bearer token when
it scrapes ``/metrics``. Either carries the same key, ``DURAPAY_API__KEY``.

An empty key is not "no authentication" by accident: :func:`require_key` refuses to build the check
unless the caller explicitly asked for an open API (``durapay api --insecure``, local development).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Request
from fastapi.security import APIKeyHeader

from service.errors import ApiError

API_KEY_HEADER = "X-Api-Key"

#: Declared for OpenAPI, so ``/docs`` offers an "Authorize" button; the check itself is ours.
api_key_scheme = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, description="DURAPAY_API__KEY")


class MissingApiKey(Exception):
    """``DURAPAY_API__KEY`` is empty and the open mode was not asked for."""


def presented_key(request: Request) -> str:
    key = request.headers.get(API_KEY_HEADER)
    if key:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def key_matches(presented: str, expected: str) -> bool:
    """Constant time in the presented key's content (``hmac.compare_digest`` on bytes)."""
    return hmac.compare_digest(presented.encode(), expected.encode())


def require_key(expected: str, *, insecure: bool = False) -> Callable[[Request], None]:
    """A FastAPI dependency that refuses a request without the right key with 401.

    With an empty ``expected`` key: raise MissingApiKey, unless ``insecure`` (then every request passes).
    """
    if not expected and not insecure:
        raise MissingApiKey(
            "DURAPAY_API__KEY is empty: set it to the key clients must send as X-Api-Key, "
            "or pass --insecure to run the control API without a key (local development only)"
        )

    def check(request: Request) -> None:
        if not expected:
            return
        if not key_matches(presented_key(request), expected):
            raise ApiError(401, "unauthorized", f"missing or wrong {API_KEY_HEADER}")

    return check
