"""Issue 26, item 5, over real HTTP: repeated failed authentications are slowed, per client address and
per key prefix, at the API's gate and the console's sign-in; another address is not.

The client address is what uvicorn gives: it trusts ``X-Forwarded-For`` from 127.0.0.1 (its default
``--forwarded-allow-ips``), so one test process speaks as several addresses."""

from __future__ import annotations

import re

import httpx

from tests.service.conftest import API_KEY, Served

BOUND = 20  # DURAPAY_API__AUTH_FAILURES's default, which service_settings keeps


def as_address(address: str, key: str) -> dict[str, str]:
    return {"X-Forwarded-For": address, "X-Api-Key": key}


def metric(served: Served, name: str) -> int:
    page = served.http.get("/metrics", headers=as_address("198.51.100.250", API_KEY)).text
    found = re.search(rf"^{name} (\d+)$", page, re.MULTILINE)
    assert found, page[-2000:]
    return int(found.group(1))


def test_a_hundred_wrong_keys_then_the_right_one_is_slowed_and_another_address_is_not(served: Served) -> None:
    answers = [served.http.get("/flows", headers=as_address("203.0.113.7", f"guess-{n:03d}-wrong")) for n in range(100)]
    statuses = [answer.status_code for answer in answers]
    assert statuses == [401] * BOUND + [429] * (100 - BOUND)
    assert answers[-1].json()["error"] == "too_many_attempts"
    assert 1 <= int(answers[-1].headers["Retry-After"]) <= 300
    right = served.http.get("/flows", headers=as_address("203.0.113.7", API_KEY))
    assert right.status_code == 429, "the right key does not help inside a blocked window"
    elsewhere = served.http.get("/flows", headers=as_address("203.0.113.8", API_KEY))
    assert elsewhere.status_code == 200, elsewhere.text
    assert metric(served, "durapay_auth_failures_total") == BOUND
    assert metric(served, "durapay_auth_refusals_total") == 100 - BOUND + 1


def test_guesses_of_one_prefix_from_many_addresses_are_slowed(served: Served) -> None:
    """Spread over addresses, the guesses share their prefix (8 characters): its counter stops them."""
    statuses = [served.http.get("/flows", headers=as_address(f"192.0.2.{n}", f"sharedpx-{n}")).status_code for n in range(30)]
    assert statuses == [401] * BOUND + [429] * (30 - BOUND)
    assert served.http.get("/flows", headers=as_address("192.0.2.200", API_KEY)).status_code == 200


def test_no_key_is_not_a_guess(served: Served) -> None:
    for _ in range(BOUND + 5):
        assert served.http.get("/flows", headers={"X-Forwarded-For": "203.0.113.20"}).status_code == 401
    assert served.http.get("/flows", headers=as_address("203.0.113.20", API_KEY)).status_code == 200


def test_the_console_sign_in_is_slowed_too(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=10.0, headers={"X-Forwarded-For": "203.0.113.30"}) as client:

        def sign_in(key: str) -> httpx.Response:
            form = client.get("/console/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf, form.text[:300]
            return client.post("/console/login", data={"name": "Ada", "key": key, "csrf": csrf.group(1), "next": "/console"})

        statuses = [sign_in(f"console-guess-{n}").status_code for n in range(BOUND + 3)]
        assert statuses == [401] * BOUND + [429] * 3
        refused = sign_in(API_KEY)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert "Too many failed sign-ins" in refused.text
    # The API's gate and the console share the counters of an address.
    assert served.http.get("/flows", headers=as_address("203.0.113.30", API_KEY)).status_code == 429
    with httpx.Client(base_url=served.url, timeout=10.0, headers={"X-Forwarded-For": "203.0.113.31"}) as other:
        form = other.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf
        signed = other.post("/console/login", data={"name": "Ada", "key": API_KEY, "csrf": csrf.group(1), "next": "/console"})
        assert signed.status_code == 303, signed.text[:300]


def counters(served: Served, address: str) -> list[bytes]:
    return list(served.engine.redis.scan_iter(match=f"{served.engine.keys.prefix}:auth:fail:addr:{address}"))


def test_a_counter_never_lives_without_an_end(served: Served) -> None:
    """Issue 37, finding 8: ``SET NX`` then ``INCR`` was not atomic; a counter that expired between the
    two was made again by the ``INCR`` with no end: a lockout for ever. Counted in one script, and a
    counter found without an end (what the race left) is given the window's, failing or refused."""
    redis = served.engine.redis
    for address, count in (("203.0.113.40", 3), ("203.0.113.41", BOUND)):
        redis.set(f"{served.engine.keys.prefix}:auth:fail:addr:{address}", count)  # the race's leftover: no TTL
    window = served.runtime.settings.api.auth_window_seconds * 1000
    assert served.http.get("/flows", headers=as_address("203.0.113.40", "wrong-key-0001")).status_code == 401
    assert served.http.get("/flows", headers=as_address("203.0.113.41", "wrong-key-0002")).status_code == 429
    for address in ("203.0.113.40", "203.0.113.41"):
        (counter,) = counters(served, address)
        assert 0 < redis.pttl(counter) <= window, f"{address}: a counter with no end"
    fresh = served.http.get("/flows", headers=as_address("203.0.113.42", "wrong-key-0003"))
    assert fresh.status_code == 401
    (counter,) = counters(served, "203.0.113.42")
    assert int(redis.get(counter)) == 1 and 0 < redis.pttl(counter) <= window
