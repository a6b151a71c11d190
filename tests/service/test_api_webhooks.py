"""``/webhooks`` and ``/events`` over real HTTP: endpoints with their secret shown once, strict inputs,
test sends to a real receiver, attempts, the pull feed with cursors and long-polling, replay."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.service.app import create_app
from durapay.service.runtime import build_runtime
from durapay.service.server import ApiServer
from tests.service.conftest import API_KEY, NOTIFIED, service_settings

KEY = {"X-Api-Key": API_KEY}


@pytest.fixture
def api(redis_url: str, key_prefix: str) -> Iterator[tuple[httpx.Client, Any]]:
    built = build_runtime(
        service_settings(key_prefix, webhooks={"allow_private": True}), redis_url=redis_url, flows={"notified": NOTIFIED}
    )
    built.engine.sender = None
    built.webhooks.send = None  # no worker here: a test delivers what is due itself
    with ApiServer(create_app(built)) as server, httpx.Client(base_url=server.url, timeout=30.0, headers=KEY) as http:
        yield http, built
    built.close()


def start(built: Any, n: int) -> None:
    for number in range(n):
        # A fresh order id each time: an object's id() comes round again, and an order id is one flow's.
        built.engine.start("notified", {"orderId": f"o{number}n{uuid.uuid4().hex[:12]}", "token": "t"})


def test_endpoints_are_managed_and_the_secret_is_shown_once(api: tuple[httpx.Client, Any]) -> None:
    http, _ = api
    assert httpx.post(str(http.base_url) + "/webhooks", json={"url": "https://a.example/h"}).status_code == 401
    with WebhookReceiver() as receiver:
        made = http.post("/webhooks", json={"url": receiver.url, "events": ["flow.created"], "description": "shop"})
        assert made.status_code == 201, made.text
        endpoint = made.json()
        assert endpoint["secret"].startswith("whsec_") and endpoint["events"] == ["flow.created"]
        receiver.secrets = [endpoint["secret"]]
        listed = http.get("/webhooks").json()
        assert [e["id"] for e in listed["endpoints"]] == [endpoint["id"]] and "secret" not in str(listed)
        assert http.get(f"/webhooks/{endpoint['id']}").json().get("secret") is None
        tested = http.post(f"/webhooks/{endpoint['id']}/test").json()
        assert tested["ok"] and tested["status"] == 200 and receiver.received[0].type == "webhook.test"
        attempts = http.get(f"/webhooks/{endpoint['id']}/attempts").json()["attempts"]
        assert attempts[0]["event"] == tested["event"] and attempts[0]["latencyMs"] >= 0
        rotated = http.post(f"/webhooks/{endpoint['id']}/rotate").json()
        assert rotated["secret"] != endpoint["secret"] and rotated["rotating"]
        assert http.delete(f"/webhooks/{endpoint['id']}").status_code == 200
        assert http.get(f"/webhooks/{endpoint['id']}").status_code == 404
        assert http.post("/webhooks/we_nope/test").status_code == 404


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"url": "https://a.example/h", "events": ["flow.succeded"]}, "events", "flow.succeeded"),
        ({"url": "https://a.example/h", "evnts": []}, "evnts", "events"),
        ({"url": "ftp://a.example/h"}, "url", ""),
    ],
)
def test_endpoint_input_is_strict(api: tuple[httpx.Client, Any], body: dict[str, Any], field: str, reason: str) -> None:
    http, _ = api
    answer = http.post("/webhooks", json=body)
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["field"] and reason in answer.json()["reason"]


def test_private_urls_are_refused_unless_allowed(redis_url: str, key_prefix: str) -> None:
    built = build_runtime(service_settings(key_prefix), redis_url=redis_url)
    with ApiServer(create_app(built)) as server, httpx.Client(base_url=server.url, headers=KEY) as http:
        answer = http.post("/webhooks", json={"url": "https://192.168.1.10/hooks"})
        assert answer.status_code == 422 and answer.json()["field"] == "url" and "ALLOW_PRIVATE" in answer.json()["reason"]
        assert http.post("/webhooks", json={"url": "http://hooks.example/x"}).status_code == 422
    built.close()


def test_the_feed_pages_resumes_and_long_polls(api: tuple[httpx.Client, Any]) -> None:
    http, built = api
    start(built, 5)
    first = http.get("/events", params={"limit": 3}).json()
    assert len(first["events"]) == 3
    rest = http.get("/events", params={"after": first["next"]}).json()
    everything = [e["id"] for e in http.get("/events").json()["events"]]
    assert [e["id"] for e in first["events"] + rest["events"]] == everything and len(everything) == 5
    middle = first["events"][1]["cursor"]
    assert [e["id"] for e in http.get("/events", params={"after": middle}).json()["events"]] == everything[2:]
    assert http.get("/events", params={"types": "flow.succeeded"}).json()["events"] == []
    assert http.get("/events", params={"after": "p0=x"}).status_code == 422
    assert http.get("/events", params={"types": "flow.succeded"}).status_code == 422
    got: dict[str, Any] = {}
    poll = threading.Thread(target=lambda: got.update(http.get("/events", params={"after": rest["next"], "wait": 25}).json()))
    poll.start()
    start(built, 1)
    poll.join(30)
    assert [e["type"] for e in got["events"]] == ["flow.created"]


def test_replay_schedules_deliveries(api: tuple[httpx.Client, Any]) -> None:
    http, built = api
    with WebhookReceiver() as receiver:
        endpoint = http.post("/webhooks", json={"url": receiver.url}).json()
        receiver.secrets = [endpoint["secret"]]
        start(built, 3)
        assert http.post("/events/replay", json={}).json() == {"scheduled": 3}
        assert http.post("/events/replay", json={"endpoint": endpoint["id"], "types": ["flow.failed"]}).json() == {"scheduled": 0}
        assert http.post("/events/replay", json={"endpoint": "we_missing"}).status_code == 404
        assert http.post("/events/replay", json={"aftr": "x"}).status_code == 422
        built.webhooks.send_due()
        assert len(receiver.applied) == 3


#: Hosts a fuzzer sent (issue 26: "http://0" answered 500), forms of addresses and hosts no resolver takes.
ODD_URLS = [
    *("http://0", "http://0.", "https://0:0", "http://00", "http://4294967296", "http://[::]", "http://0x7f000001"),
    *("http://[::ffff:0:0]:0", "http://a\x00b", "http://[a\x01b]", "http://[::1", "http://é.com", "http://" + "a" * 64),
]


def test_an_odd_url_is_registered_or_refused_and_tested_never_a_500(api: tuple[httpx.Client, Any]) -> None:
    http, _ = api
    for url in ODD_URLS:
        made = http.post("/webhooks", json={"url": url})
        assert made.status_code in (201, 422), (url, made.text)
        if made.status_code == 201:
            tested = http.post(f"/webhooks/{made.json()['id']}/test")
            assert tested.status_code == 200 and not tested.json()["ok"], (url, tested.text)
        else:
            assert made.json()["field"] == "url", (url, made.text)


def test_deliver_now_makes_an_endpoints_backing_off_deliveries_due(api: tuple[httpx.Client, Any]) -> None:
    """Issue 27: after a receiver's outage nothing but waiting delivered what was pending; the CLI had
    ``webhooks deliver``, the API (and so the console and the client) nothing."""
    http, built = api
    with WebhookReceiver() as receiver:
        receiver.answer = lambda body: (503, {})
        endpoint = http.post("/webhooks", json={"url": receiver.url, "events": ["flow.created"]}).json()
        other = http.post("/webhooks", json={"url": receiver.url, "events": ["flow.created"]}).json()
        start(built, 1)
        webhooks = built.webhooks
        assert webhooks.fanout() == 2
        backing_off = []
        for tag, slot in webhooks.slots.items():
            for member in [m.decode() for m in built.engine.redis.zrange(slot.due, 0, -1)]:
                webhooks.deliver(tag, member)  # the first retry comes 5 s later: too soon to move (a lease)
                failed = webhooks.deliver(tag, member)
                assert failed is not None and failed["nextAt"] > webhooks.now() + 200, failed
                backing_off.append((slot.due, member))
        moved = http.post(f"/webhooks/{endpoint['id']}/deliver-now")
        assert moved.status_code == 200 and moved.json() == {"due_now": 1}, moved.text
        due = {member.partition("|")[2]: float(built.engine.redis.zscore(key, member)) for key, member in backing_off}
        assert due[endpoint["id"]] <= webhooks.now() < due[other["id"]], "only this endpoint's, and made due now"
        assert http.post(f"/webhooks/{endpoint['id']}/deliver-now").json() == {"due_now": 0}
        assert http.post("/webhooks/we_nope/deliver-now").status_code == 404
        attempts = http.get(f"/webhooks/{other['id']}/attempts").json()["attempts"]
        assert attempts[0]["nextAttempt"], "attempts say when the next one comes"
