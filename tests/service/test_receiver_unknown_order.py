"""A notification for an order no flow holds, over real HTTP: refused like a bad token, then counted,
logged with its order id and told to the merchant (``notification.unknown_order``), bounded.

Its token cannot be checked (no token is kept for the order), so the answer stays the bad token's
401; what the body claims reaches the merchant marked unverified, once per order id per hour and at
most ``DURAPAY_RECEIVER__UNKNOWN_ORDER_EVENTS_PER_MINUTE`` a minute, on the pull feed and on webhooks.
The receiver's bookkeeping runs after the answer is sent, so the tests wait for its counter.
The gateway is unreachable here: an unknown order never makes durapay ask it anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.config import SettingsError, load_settings
from durapay.service.app import create_app
from durapay.service.receiver import COUNTERS, REFUSED, REFUSED_STATUS
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.events import EVENT_TYPES, Event
from durapay.workflows.unknown_orders import CLAIM_CHARS, ONCE_SECONDS, TYPE, mark_key
from tests.service.conftest import API_KEY, NOTIFIED, Served, notification, service_settings, waiting_flow
from tests.waiting import wait_until

TOKEN = "2f0ea5059b41414ca3744fe672327d85"
NOWHERE = "http://127.0.0.1:9"
KEY = {"X-Api-Key": API_KEY}
MASKED_PAN = "434994******4549"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000.0)


@pytest.fixture
def serve(redis_url: str, key_prefix: str, clock: ManualClock) -> Iterator[Callable[..., Served]]:
    """The app over HTTP on a runtime with ``settings`` overrides; its clock is ``clock``."""
    opened: list[tuple[Runtime, ApiServer, httpx.Client]] = []

    def make(**overrides: Any) -> Served:
        groups = {
            "gateway": {"base_url": NOWHERE + "/api"},
            "receiver": {"public_url": NOWHERE + "/notifications"},
            "webhooks": {"allow_private": True},
        }
        for group, values in overrides.items():
            groups[group] = {**groups.get(group, {}), **values}
        built = build_runtime(
            service_settings(key_prefix, **groups), redis_url=redis_url, clock=clock, flows={"notified": NOTIFIED}
        )
        built.engine.sender = None
        built.webhooks.send = None  # no worker: the test delivers what is due itself
        server = ApiServer(create_app(built)).__enter__()
        http = httpx.Client(base_url=server.url, timeout=10.0)
        opened.append((built, server, http))
        return Served(built, server, http)

    yield make
    for built, server, http in opened:
        http.close()
        server.__exit__(None, None, None)
        built.close()


@pytest.fixture
def served(serve: Callable[..., Served]) -> Served:
    return serve()


def claim(order_id: str, event_id: str, *, token: str | None = TOKEN) -> dict[str, Any]:
    """A notification body for ``order_id`` claiming a payment of 15.00 EUR (with a masked card)."""
    body = notification(order_id, token, event_id)
    body["operation"] |= {
        "operationAmount": "1500",
        "operationCurrency": "EUR",
        "operationType": "AUTHORIZATION",
        "paymentInstrumentInfo": MASKED_PAN,
    }
    return body


def post(served: Served, body: dict[str, Any]) -> httpx.Response:
    answer = served.http.post("/notifications", json=body)
    assert (answer.status_code, answer.json()) == (REFUSED_STATUS, REFUSED)
    return answer


def counted(served: Served, name: str, expected: int) -> None:
    """Wait for the counter ``name`` to reach ``expected`` (it is counted after the answer), and no further."""
    wait_until(lambda: served.counter(name) >= expected, 10, f"notifications_{name} = {expected}")
    assert served.counter(name) == expected


def told(engine: Engine) -> list[Event]:
    return [event for event, _ in engine.events(types=[TYPE])]


def test_an_unknown_order_is_refused_then_counted_logged_and_told_to_the_merchant(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    waiting_flow(served.engine, "ord-known", TOKEN)
    caplog.set_level(logging.WARNING, logger="durapay.receiver")
    post(served, claim("ord-gone", "ev-gone"))
    counted(served, "unknown_order", 1)
    assert served.counter("rejected") == 1, "still a refusal like any other"

    (event,) = told(served.engine)
    wire = event.wire()
    assert wire["type"] == "notification.unknown_order"
    assert wire["orderId"] == "ord-gone"
    assert wire["operationId"] is None, "nothing vouches for the claimed operation id"
    assert "flow" not in wire and "kind" not in wire
    assert wire["data"] == {
        "verified": False,
        "claimed": {"operationId": "op-ord-gone", "operationResult": "EXECUTED", "amount": "1500", "currency": "EUR"},
    }
    assert event.stream == f"p{served.engine.keys.partition('ord-gone')}", "the order id's partition"
    assert MASKED_PAN not in str(event.body) and TOKEN not in str(event.body)

    # The merchant's pull feed shows it.
    feed = served.http.get("/events", params={"types": TYPE}, headers=KEY)
    assert feed.status_code == 200, feed.text
    assert [(e["id"], e["orderId"]) for e in feed.json()["events"]] == [(event.id, "ord-gone")]

    (line,) = [r for r in caplog.records if r.name == "durapay.receiver" and "ord-gone" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "op-ord-gone" in line.getMessage() and "EXECUTED" in line.getMessage()
    assert MASKED_PAN not in line.getMessage() and TOKEN not in line.getMessage()

    metrics = served.http.get("/metrics", headers=KEY).text
    assert 'durapay_notifications_total{outcome="unknown_order"} 1' in metrics.splitlines()
    assert 'durapay_notifications_total{outcome="unknown_order_capped"} 0' in metrics.splitlines()


def test_the_same_unknown_order_within_the_hour_is_counted_again_without_a_second_event(served: Served) -> None:
    post(served, claim("ord-again", "ev-1"))
    counted(served, "unknown_order", 1)
    post(served, claim("ord-again", "ev-2"))  # the gateway's retry, or another operation of the order
    post(served, claim("ord-again", "ev-1"))
    counted(served, "unknown_order", 3)
    assert [event.body["orderId"] for event in told(served.engine)] == ["ord-again"]
    mark = served.runtime.redis.ttl(mark_key(served.engine.keys, "ord-again"))
    assert ONCE_SECONDS - 60 < mark <= ONCE_SECONDS, "one event per order id per hour"
    assert served.counter("unknown_order_capped") == 0


def test_a_known_order_with_a_bad_token_is_not_an_unknown_order(served: Served) -> None:
    waiting_flow(served.engine, "ord-a", TOKEN)
    post(served, claim("ord-a", "ev-bad", token="0" * 32))  # a known order: no work left for after the answer
    post(served, claim("ord-a", "ev-none", token=None))
    assert served.counter("rejected") == 2
    assert served.counter("unknown_order") == 0
    assert told(served.engine) == []
    post(served, claim("ord-b", "ev-other"))  # an unknown one afterwards is told, alone
    counted(served, "unknown_order", 1)
    assert [event.body["orderId"] for event in told(served.engine)] == ["ord-b"]


def test_the_minute_cap_drops_events_counts_them_and_a_later_retry_is_told(
    serve: Callable[..., Served], clock: ManualClock
) -> None:
    served = serve(receiver={"unknown_order_events_per_minute": 2})
    clock.set(1_800_000_000.0)  # the start of a minute
    for number in range(4):
        post(served, claim(f"ord-flood-{number}", f"ev-{number}"))
        counted(served, "unknown_order", number + 1)
    assert [event.body["orderId"] for event in told(served.engine)] == ["ord-flood-0", "ord-flood-1"]
    assert served.counter("unknown_order_capped") == 2
    post(served, claim("ord-flood-0", "ev-0"))  # a repeat takes no share of the cap
    counted(served, "unknown_order", 5)
    assert served.counter("unknown_order_capped") == 2

    clock.advance(60)  # the next minute: the gateway's retry of a dropped one is told now
    post(served, claim("ord-flood-3", "ev-3"))
    counted(served, "unknown_order", 6)
    assert [event.body["orderId"] for event in told(served.engine)] == ["ord-flood-0", "ord-flood-1", "ord-flood-3"]
    assert served.counter("unknown_order_capped") == 2


def test_a_subscribed_webhook_endpoint_receives_the_event(served: Served) -> None:
    with WebhookReceiver() as receiver:
        made = served.http.post("/webhooks", json={"url": receiver.url, "events": [TYPE]}, headers=KEY)
        assert made.status_code == 201, made.text
        receiver.secrets = [made.json()["secret"]]
        waiting_flow(served.engine, "ord-w", TOKEN)  # its flow.created is not this endpoint's
        post(served, claim("ord-webhook", "ev-w"))
        counted(served, "unknown_order", 1)
        (event,) = told(served.engine)
        last = int(event.entry.split("-")[0])
        # A fan-out leaves the entries of the millisecond it reads the endpoints in for the next pass.
        wait_until(lambda: _server_ms(served) > last, 5, "the server's clock to pass the event")
        assert served.runtime.webhooks.tick() == 1
        wait_until(lambda: receiver.received, 10, "the delivery")
        assert receiver.refused == 0, "signed as any event"
        (got,) = receiver.received
        assert (got.id, got.type) == (event.id, TYPE)
        assert got.body["orderId"] == "ord-webhook" and got.body["data"]["verified"] is False


def _server_ms(served: Served) -> int:
    seconds, micros = served.runtime.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_long_order_id_is_cut_in_the_event_and_the_log(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="durapay.receiver")
    long_id = "x" * 1500  # twice in the body (the operation id repeats it): under the 4 KB limit
    post(served, claim(long_id, "ev-long"))
    counted(served, "unknown_order", 1)
    (event,) = told(served.engine)
    assert len(event.body["orderId"]) == CLAIM_CHARS and event.body["orderId"].startswith("xxx")
    assert max(len(r.getMessage()) for r in caplog.records if r.name == "durapay.receiver") < 600
    post(served, claim(long_id, "ev-long-2"))
    counted(served, "unknown_order", 2)
    assert len(told(served.engine)) == 1, "the long id's mark holds too"


def test_with_events_off_it_is_still_counted(serve: Callable[..., Served]) -> None:
    served = serve(events={"enabled": False})
    post(served, claim("ord-quiet", "ev-q"))
    counted(served, "unknown_order", 1)
    assert told(served.engine) == []


def test_the_type_and_the_counters_are_listed() -> None:
    assert TYPE in EVENT_TYPES
    assert {"unknown_order", "unknown_order_capped"} <= set(COUNTERS)


@pytest.mark.parametrize("value", [0, -1, 10_001, "many"])
def test_an_out_of_range_cap_is_refused_naming_the_variable(value: Any) -> None:
    with pytest.raises(SettingsError, match="DURAPAY_RECEIVER__UNKNOWN_ORDER_EVENTS_PER_MINUTE"):
        load_settings({"receiver": {"unknown_order_events_per_minute": value}})


def test_an_unknown_receiver_setting_is_refused() -> None:
    with pytest.raises(SettingsError, match="DURAPAY_RECEIVER__UNKNOWN_ORDER_EVENT_PER_MINUTE"):
        load_settings({"receiver": {"unknown_order_event_per_minute": 5}})
