"""Console sessions: kept in Redis, ended at sign-out and when their key goes, a cookie that carries
nothing of the key, sign-in forms that expire and serve one attempt."""

from __future__ import annotations

import redis

from durapay.service.auth import Keyring
from durapay.service.console.session import LOGIN_SECONDS, Sessions

OPERATOR = "operator-key-0123456789"
READER = "reader-key-0123456789"


def sessions(client: redis.Redis, prefix: str, keys: dict[str, str] | None = None) -> Sessions:
    return Sessions(Keyring(OPERATOR, keys if keys is not None else {READER: "read"}), 1, client, prefix)


def test_a_key_signs_in_with_its_role_and_the_cookie_is_a_random_id(redis_client: redis.Redis, key_prefix: str) -> None:
    made = sessions(redis_client, key_prefix).sign_in(READER, now=1000.0)
    assert made is not None
    session, cookie = made
    assert session.role == "read" and not session.operator
    again = sessions(redis_client, key_prefix).sign_in(READER, now=1000.0)
    assert again is not None and again[1] != cookie, "nothing in the cookie depends on the key"
    assert READER not in cookie and len(cookie) < 60
    assert sessions(redis_client, key_prefix).read(cookie, now=1001.0) == session
    assert sessions(redis_client, key_prefix).sign_in("wrong", now=1000.0) is None
    stored = b"".join(redis_client.get(name) or b"" for name in redis_client.keys(f"{key_prefix}:console:session:*"))
    assert READER.encode() not in stored and cookie.encode() not in stored


def test_signed_out_expired_and_revoked_sessions_are_refused(redis_client: redis.Redis, key_prefix: str) -> None:
    keeper = sessions(redis_client, key_prefix)
    made = keeper.sign_in(OPERATOR, now=1000.0)
    assert made is not None
    _, cookie = made
    assert keeper.read(cookie, now=1000.0 + 3601) is None, "expired"
    made = keeper.sign_in(OPERATOR)
    assert made is not None
    keeper.sign_out(made[1])
    assert keeper.read(made[1]) is None, "signed out: a copy of the cookie is refused"
    made = keeper.sign_in(READER)
    assert made is not None
    assert sessions(redis_client, key_prefix, {READER: "operator"}).read(made[1]) is None, "its role changed"
    made = keeper.sign_in(READER)
    assert made is not None
    assert sessions(redis_client, key_prefix, {}).read(made[1]) is None, "the key was removed: its sessions end"
    assert keeper.read(made[1]) is None, "and stay ended when the key comes back"
    for junk in (None, "", "abc", "a.b.c", "x" * 2000):
        assert keeper.read(junk) is None


def test_csrf_tokens_are_per_session(redis_client: redis.Redis, key_prefix: str) -> None:
    keeper = sessions(redis_client, key_prefix)
    first, second = keeper.sign_in(OPERATOR), keeper.sign_in(OPERATOR)
    assert first is not None and second is not None
    assert keeper.csrf_ok(first[0], first[0].csrf)
    assert not keeper.csrf_ok(first[0], second[0].csrf)
    assert not keeper.csrf_ok(first[0], "")
    assert not keeper.csrf_ok(None, first[0].csrf)


def test_a_sign_in_form_serves_one_attempt_and_expires(redis_client: redis.Redis, key_prefix: str) -> None:
    keeper = sessions(redis_client, key_prefix)
    nonce, token = keeper.login_form(now=1000.0)
    assert not keeper.login_ok(nonce, "forged", now=1001.0)
    nonce, token = keeper.login_form()
    assert keeper.login_ok(nonce, token)
    assert not keeper.login_ok(nonce, token), "used once"
    nonce, token = keeper.login_form(now=1000.0)
    assert not keeper.login_ok(nonce, token, now=1000.0 + LOGIN_SECONDS + 1), "expired"
    other = sessions(redis_client, key_prefix)
    nonce, token = keeper.login_form()
    assert other.login_ok(nonce, token), "every API process checks every process's forms"
    for junk in ("", "x", "abc.def", "1.2" * 200):
        assert not keeper.login_ok(junk, token)
