"""The console's sign-in: a signed session cookie, its role, and the CSRF token of every form.

Why a cookie of our own and not the API key in the browser: the key is typed once into
``/console/login`` and never stored in the browser. The cookie holds ``{role, key fingerprint, expiry,
nonce}`` signed with HMAC-SHA256 under a secret every API process derives alike from the configured
keys (``service.auth.Keyring.secret``): no shared state, and rotating the keys ends every session. It is
``HttpOnly`` (no script reads it) and ``SameSite=Strict`` (no other site's page sends it). A session
whose key was removed, or whose role changed, is refused at its next request.

CSRF: every form carries ``csrf`` = HMAC(secret, nonce) of the session; a POST without it is refused
(403) even though ``SameSite=Strict`` already keeps other sites' requests cookie-less. The sign-in
form, before any session, uses the same scheme on a short-lived ``durapay_login`` nonce cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from durapay.service.auth import OPERATOR, Keyring

COOKIE = "durapay_console"
LOGIN_COOKIE = "durapay_login"
PATH = "/console"


@dataclass(frozen=True)
class Session:
    role: str
    fingerprint: str
    expires: float
    nonce: str

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR


class Sessions:
    """Issues and reads session cookies for one keyring."""

    def __init__(self, keyring: Keyring, hours: float) -> None:
        self.keyring = keyring
        self.seconds = hours * 3600
        self._secret = keyring.secret()

    def _sign(self, data: bytes) -> str:
        return hmac.new(self._secret, data, hashlib.sha256).hexdigest()

    def sign_in(self, key: str, *, now: float | None = None) -> tuple[Session, str] | None:
        """The session and its cookie value for ``key``, or None when the key is not one of ours."""
        role = self.keyring.role_of(key)
        if role is None:
            return None
        now = time.time() if now is None else now
        session = Session(role, self.keyring.fingerprint(key), now + self.seconds, secrets.token_hex(16))
        body = json.dumps({"r": session.role, "k": session.fingerprint, "e": session.expires, "n": session.nonce})
        packed = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
        return session, f"{packed}.{self._sign(packed.encode())}"

    def read(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        """The session a cookie carries, or None (absent, forged, expired, or its key no longer valid)."""
        if not cookie or "." not in cookie or len(cookie) > 1000:
            return None
        packed, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature, self._sign(packed.encode())):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)))
            session = Session(str(data["r"]), str(data["k"]), float(data["e"]), str(data["n"]))
        except (ValueError, KeyError, TypeError):
            return None
        if session.expires < (time.time() if now is None else now):
            return None
        if self.keyring.role_of_fingerprint(session.fingerprint) != session.role:
            return None
        return session

    def csrf(self, nonce: str) -> str:
        return self._sign(b"csrf\x1f" + nonce.encode())

    def csrf_ok(self, nonce: str, token: str) -> bool:
        return bool(nonce) and hmac.compare_digest(self.csrf(nonce), token)
