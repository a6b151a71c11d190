"""Console sessions: signed, expiring, bound to a key that is still configured, never carrying the key."""

from __future__ import annotations

import base64

from durapay.service.auth import Keyring
from durapay.service.console.session import Sessions

OPERATOR = "operator-key-0123456789"
READER = "reader-key-0123456789"


def sessions(keys: dict[str, str] | None = None) -> Sessions:
    return Sessions(Keyring(OPERATOR, keys if keys is not None else {READER: "read"}), hours=1)


def test_a_key_signs_in_with_its_role_and_the_cookie_does_not_hold_the_key() -> None:
    made = sessions().sign_in(READER, now=1000.0)
    assert made is not None
    session, cookie = made
    assert session.role == "read" and not session.operator
    assert READER not in cookie and READER not in base64.urlsafe_b64decode(cookie.split(".")[0] + "==").decode()
    read = sessions().read(cookie, now=1001.0)
    assert read == session
    assert sessions().sign_in("wrong", now=1000.0) is None


def test_forged_expired_and_revoked_sessions_are_refused() -> None:
    made = sessions().sign_in(OPERATOR, now=1000.0)
    assert made is not None
    _, cookie = made
    packed, _, signature = cookie.rpartition(".")
    assert sessions().read(f"{packed}.{'0' * len(signature)}", now=1001.0) is None
    assert sessions().read(cookie, now=1000.0 + 3601) is None
    made = sessions().sign_in(READER, now=1000.0)
    assert made is not None
    assert sessions({}).read(made[1], now=1001.0) is None, "the key was removed: its sessions end"
    assert sessions({READER: "operator"}).read(made[1], now=1001.0) is None, "its role changed"
    for junk in (None, "", "abc", "a.b.c", "x" * 2000):
        assert sessions().read(junk) is None


def test_csrf_tokens_are_per_session() -> None:
    keeper = sessions()
    token = keeper.csrf("nonce-a")
    assert keeper.csrf_ok("nonce-a", token)
    assert not keeper.csrf_ok("nonce-b", token)
    assert not keeper.csrf_ok("", keeper.csrf(""))
    assert not keeper.csrf_ok("nonce-a", "")
