"""The console's sign-in: server-side sessions in Redis, their role, and the CSRF token of every form.

Why server-side and not a signed cookie: a signed cookie cannot be taken back. One copied before
``POST /console/logout`` kept working until it expired (an independent test paused a schedule with it),
and it carried a fingerprint of the key. Here the cookie is a random 256-bit id and nothing else;
Redis holds ``{role, a salted hash of the key, expiry, CSRF token}`` under the SHA-256 of that id (so a
reader of Redis cannot use what it sees as a cookie), with the session's lifetime as its TTL. Every API
process reads the same records, so:

* signing out deletes the record: a copied cookie gets the sign-in page;
* a session whose key was removed from ``DURAPAY_API__KEY``/``__KEYS``, rotated, or given another role
  is refused (and deleted) at its next request: its salted hash matches no configured key of its role.

The key is typed once into ``/console/login`` and never stored in the browser. The cookie is
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it), and ``Secure``
when the request came over HTTPS (see docs/security.md for a TLS-terminating proxy).

CSRF: every form carries the session's random ``csrf`` token; a POST without it is refused (403).
The sign-in form, before any session, carries one too, bound to a ``durapay_login`` nonce cookie (its
issue time and a random part, the token an HMAC of it under a random secret kept in Redis): it is
valid for ``LOGIN_SECONDS`` and once (a used nonce is remembered until it would have expired; each
attempt, right or wrong, needs a fresh form), so one form cannot serve a run of guesses; showing the
form writes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from durapay.service.auth import OPERATOR, Keyring

COOKIE = "durapay_console"
LOGIN_COOKIE = "durapay_login"
PATH = "/console"
#: How long a sign-in form (its nonce and token) may be used, once.
LOGIN_SECONDS = 600
#: A cookie value longer than this is not one of ours (ids are 43 characters).
MAX_COOKIE = 200


@dataclass(frozen=True)
class Session:
    id: str
    role: str
    expires: float
    csrf: str
    #: Who signed in, as they wrote it on the sign-in form: the console's actions are recorded as theirs.
    name: str = ""

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR

    @property
    def by(self) -> str:
        """``by`` of every action taken in this session (``console:<name>``), the history's and the audit's."""
        return f"console:{self.name}" if self.name else "console"


#: A name as the sign-in form takes it: what a person calls themselves, never markup or a line break.
NAME_LIMIT = 60


def clean_name(value: str) -> str | None:
    """The sign-in form's name with its spaces tidied; None when empty, too long or not a plain name
    (letters, digits, spaces and ``. _ @ ' -``)."""
    name = " ".join(value.split())
    if not name or len(name) > NAME_LIMIT or not all(ch.isalnum() or ch in " ._@'-" for ch in name):
        return None
    return name


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _key_hash(salt: str, key: str) -> str:
    return hmac.new(salt.encode(), b"durapay-console-key\x1f" + key.encode(), hashlib.sha256).hexdigest()


class Sessions:
    """Issues, reads and ends console sessions for one keyring, kept in ``redis`` under ``prefix``."""

    def __init__(self, keyring: Keyring, hours: float, redis: Any, prefix: str) -> None:
        self.keyring = keyring
        self.seconds = hours * 3600
        self.redis = redis
        self.prefix = prefix
        self._secret: bytes | None = None

    def _record(self, cookie: str) -> str:
        return f"{self.prefix}:console:session:{_digest(cookie)}"

    def _login(self, nonce: str) -> str:
        return f"{self.prefix}:console:login:{_digest(nonce)}"

    def sign_in(self, key: str, *, name: str = "", now: float | None = None) -> tuple[Session, str] | None:
        """The session and its cookie value for ``key``, or None when the key is not one of ours. ``name``:
        who signs in (the sign-in form asks for it), whose name the session's actions are recorded under."""
        role = self.keyring.role_of(key)
        if role is None:
            return None
        now = time.time() if now is None else now
        cookie = secrets.token_urlsafe(32)
        session = Session(_digest(cookie), role, now + self.seconds, secrets.token_urlsafe(32), name)
        salt = secrets.token_hex(16)
        record = {"r": role, "s": salt, "k": _key_hash(salt, key), "e": session.expires, "c": session.csrf, "n": name}
        self.redis.set(self._record(cookie), json.dumps(record), px=max(1, int(self.seconds * 1000)))
        return session, cookie

    def read(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        """The session a cookie names, or None (absent, unknown, signed out, expired, or its key no longer
        configured with its role: then the record is deleted too)."""
        if not cookie or len(cookie) > MAX_COOKIE:
            return None
        raw = self.redis.get(self._record(cookie))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            session = Session(_digest(cookie), str(data["r"]), float(data["e"]), str(data["c"]), str(data.get("n") or ""))
            salt, hashed = str(data["s"]), str(data["k"])
        except (ValueError, KeyError, TypeError):
            return None
        if session.expires < (time.time() if now is None else now) or not self._key_still_has_role(salt, hashed, session.role):
            self.redis.delete(self._record(cookie))
            return None
        return session

    def _key_still_has_role(self, salt: str, hashed: str, role: str) -> bool:
        if self.keyring.open:
            return role == OPERATOR
        found = False
        for key, key_role in self.keyring.entries():
            if hmac.compare_digest(_key_hash(salt, key), hashed) and key_role == role:
                found = True
        return found

    def sign_out(self, cookie: str | None) -> None:
        """End the session ``cookie`` names (a copy of the cookie is refused from now on)."""
        if cookie and len(cookie) <= MAX_COOKIE:
            self.redis.delete(self._record(cookie))

    @staticmethod
    def csrf_ok(session: Session | None, token: str) -> bool:
        return session is not None and bool(token) and hmac.compare_digest(session.csrf.encode(), token.encode())

    def _login_secret(self) -> bytes:
        """A random secret shared by every API process (made once, kept in Redis): it signs sign-in
        forms, so that showing one writes nothing (the sign-in page is open to anyone)."""
        if self._secret is None:
            name = f"{self.prefix}:console:login-secret"
            self.redis.set(name, secrets.token_hex(32), nx=True)
            self._secret = bytes(self.redis.get(name))
        return self._secret

    def _login_token(self, nonce: str) -> str:
        return hmac.new(self._login_secret(), b"login\x1f" + nonce.encode(), hashlib.sha256).hexdigest()

    def login_form(self, *, now: float | None = None) -> tuple[str, str]:
        """A fresh sign-in form's ``(nonce, csrf)``: the nonce (its issue time and a random part) goes in
        the ``durapay_login`` cookie, the token in the form; valid for ``LOGIN_SECONDS``, once."""
        issued = int(time.time() if now is None else now)
        nonce = f"{issued}.{secrets.token_urlsafe(18)}"
        return nonce, self._login_token(nonce)

    def login_ok(self, nonce: str, token: str, *, now: float | None = None) -> bool:
        """Whether ``token`` is the one issued with ``nonce``, unexpired and not used before; a right
        pair is used up by this check, whatever the key typed with it."""
        issued, _, _ = nonce.partition(".")
        if not token or len(nonce) > MAX_COOKIE or not (issued.isascii() and issued.isdigit()):
            return False
        age = (time.time() if now is None else now) - int(issued)
        if not 0 <= age <= LOGIN_SECONDS or not hmac.compare_digest(self._login_token(nonce).encode(), token.encode()):
            return False
        return bool(self.redis.set(self._login(nonce), 1, nx=True, ex=LOGIN_SECONDS + 1))
