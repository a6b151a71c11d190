"""The control API's key check: ``X-Api-Key`` (or ``Authorization: Bearer``), compared in constant time.

Why both headers: merchants' backends send ``X-Api-Key``; Prometheus can only send a bearer token when
it scrapes ``/metrics``. Either carries the same key, ``DURAPAY_API__KEY``.

The check runs in ``service.guard.ControlGate``, before a body is read; the two schemes below only
declare it in the OpenAPI document (the "Authorize" button of ``/docs``, typed generated clients).

An empty key is not "no authentication" by accident: :func:`require_key` refuses to build the check
unless the caller explicitly asked for an open API (``durapay api --insecure``, local development).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from fastapi.security import APIKeyHeader, HTTPBearer

API_KEY_HEADER = "X-Api-Key"

#: Declared for OpenAPI only (the check itself is ``require_key``'s, in the gate).
api_key_scheme = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, description="DURAPAY_API__KEY")
bearer_scheme = HTTPBearer(auto_error=False, description="DURAPAY_API__KEY as a bearer token (Prometheus)")


class MissingApiKey(Exception):
    """``DURAPAY_API__KEY`` is empty and the open mode was not asked for."""


def presented_key(headers: Mapping[str, str]) -> str:
    key = headers.get(API_KEY_HEADER.lower()) or headers.get(API_KEY_HEADER)
    if key:
        return key
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def key_matches(presented: str, expected: str) -> bool:
    """Constant time in the presented key's content (``hmac.compare_digest`` on bytes)."""
    return hmac.compare_digest(presented.encode(), expected.encode())


def require_key(expected: str, *, insecure: bool = False) -> Callable[[Mapping[str, str]], bool]:
    """The check of a request's headers: True when they carry the key.

    With an empty ``expected`` key: raise MissingApiKey, unless ``insecure`` (then every request passes).
    """
    if not expected and not insecure:
        raise MissingApiKey(
            "DURAPAY_API__KEY is empty: set it to the key clients must send as X-Api-Key, "
            "or pass --insecure to run the control API without a key (local development only)"
        )

    def check(headers: Mapping[str, str]) -> bool:
        return not expected or key_matches(presented_key(headers), expected)

    return check
