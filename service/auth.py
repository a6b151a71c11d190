"""The control API's key check: ``X-Api-Key`` (or ``Authorization: Bearer``), compared in constant time.

Why both headers: merchants' backends send ``X-Api-Key``; Prometheus can only send a bearer token when
it scrapes ``/metrics``. Either carries the same key, ``DURAPAY_API__KEY``.

The check runs in ``service.guard.ControlGate``, before a body is read; the two schemes below only
declare it in the OpenAPI document (the "Authorize" button of ``/docs``, typed generated clients).

Roles: ``DURAPAY_API__KEY`` is an operator key; ``DURAPAY_API__KEYS`` (a JSON object, key -> ``read`` or
``operator``) adds more. A ``read`` key may look (``GET``) but not act: any other method is a 403 from
the gate, whatever the route, so that no new route can forget the rule. The console signs in with the
same keys (``service.console.session``) and applies the same roles.

An empty key is not "no authentication" by accident: :func:`require_key` refuses to build the check
unless the caller explicitly asked for an open API (``durapay api --insecure``, local development).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

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


READ = "read"
OPERATOR = "operator"
#: Methods a read-only key may use.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Keyring:
    """The keys and their roles. ``role_of(key)``: ``operator``, ``read``, or None (no such key).

    Every configured key is compared (constant time each), so the time taken does not say which key
    nearly matched. An open keyring (``insecure``, no key at all) gives every request the operator role.
    """

    def __init__(self, operator_key: str, keys: Mapping[str, str] | None = None, *, insecure: bool = False) -> None:
        self._keys: list[tuple[str, str]] = [(operator_key, OPERATOR)] if operator_key else []
        self._keys += [(key, role) for key, role in (keys or {}).items() if key]
        if not self._keys and not insecure:
            raise MissingApiKey(
                "DURAPAY_API__KEY is empty: set it to the key clients must send as X-Api-Key, "
                "or pass --insecure to run the control API without a key (local development only)"
            )

    @property
    def open(self) -> bool:
        return not self._keys

    def role_of(self, presented: str) -> str | None:
        if self.open:
            return OPERATOR
        found: str | None = None
        for key, role in self._keys:
            if key_matches(presented, key) and found is None:
                found = role
        return found

    def entries(self) -> list[tuple[str, str]]:
        """The configured ``(key, role)`` pairs (a console session checks that its key is still one)."""
        return list(self._keys)

    def __call__(self, headers: Mapping[str, str]) -> str | None:
        """The role of the key a request's headers carry, or None."""
        return self.role_of(presented_key(headers))


def require_key(expected: str, *, insecure: bool = False, keys: Mapping[str, str] | None = None) -> Keyring:
    """The check of a request's headers: the role of the key they carry (truthy), or None.

    With no key at all: raise MissingApiKey, unless ``insecure`` (then every request passes).
    """
    return Keyring(expected, keys, insecure=insecure)
