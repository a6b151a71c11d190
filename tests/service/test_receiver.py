"""The notification receiver over real HTTP: tokens, repeats, malformed and oversized bodies, a burst.

Every refusal for a token (wrong, another order's, missing) or an unknown order gets the same status
and body, and is counted; a recorded event is acknowledged 200 and a repeat never signals twice.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from config import load_settings
from service.receiver import REFUSED, REFUSED_STATUS, NotificationReceiver
from service.runtime import Runtime
from tests.service.conftest import Served, notification, signals_in_log, waiting_flow
from workflows.states import FlowState

TOKEN = "2f0ea5059b41414ca3744fe672327d85"
OTHER_TOKEN = "9a1b2c3d4e5f60718293a4b5c6d7e8f9"


def post(served: Served, body: Any) -> httpx.Response:
    return served.http.post("/notifications", json=body)


def test_a_good_token_records_the_event_and_resumes_the_flow(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-good", TOKEN)
    answer = post(served, notification("ord-good", TOKEN, "ev-good"))
    assert answer.status_code == 200
    assert answer.json() == {"outcome": "OK"}
    record = served.engine.get(flow_id)
    assert record.state is FlowState.READY, "resumed: ready to run its wait step again"
    assert [s.payload for s in record.signals] == [
        {
            "eventId": "ev-good",
            "eventTime": "2026-01-01T10:00:00.000Z",
            "operation": {"orderId": "ord-good", "operationId": "op-ord-good", "operationResult": "EXECUTED"},
        }
    ]
    assert served.runtime.redis.exists(served.engine.keys.event("ev-good")), "the event id is recorded"
    assert served.counter("accepted") == 1
    # The flow then consumes the notification and finishes.
    assert served.engine.run_step(flow_id, "payment") == FlowState.SUCCEEDED.value


@pytest.mark.parametrize(
    ("case", "token"),
    [("wrong token", "0" * 32), ("token of another order", OTHER_TOKEN), ("no token", None), ("empty token", "")],
)
def test_a_bad_token_is_refused_alike_and_counted(served: Served, case: str, token: str | None) -> None:
    flow_id = waiting_flow(served.engine, "ord-a", TOKEN)
    waiting_flow(served.engine, "ord-b", OTHER_TOKEN)
    answer = post(served, notification("ord-a", token, f"ev-{case}"))
    assert answer.status_code == REFUSED_STATUS, case
    assert answer.json() == REFUSED, case
    assert served.engine.get(flow_id).state is FlowState.WAITING
    assert served.engine.get(flow_id).signals == []
    assert served.counter("rejected") == 1
    assert not served.runtime.redis.exists(served.engine.keys.event(f"ev-{case}")), "a refused event is not recorded"


def test_an_unknown_order_gets_the_same_refusal(served: Served) -> None:
    waiting_flow(served.engine, "ord-known", TOKEN)
    answer = post(served, notification("ord-nobody-knows", TOKEN, "ev-unknown"))
    assert (answer.status_code, answer.json()) == (REFUSED_STATUS, REFUSED)
    assert served.counter("rejected") == 1


def test_a_repeated_event_is_acknowledged_without_a_second_signal(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-rep", TOKEN)
    body = notification("ord-rep", TOKEN, "ev-rep")
    assert post(served, body).status_code == 200
    assert served.engine.run_step(flow_id, "payment") == FlowState.SUCCEEDED.value
    for _ in range(3):
        again = post(served, body)
        assert (again.status_code, again.json()) == (200, {"outcome": "OK"})
    assert signals_in_log(served.engine, flow_id) == 1
    assert served.counter("accepted") == 1
    assert served.counter("duplicate") == 3


def test_a_notification_without_event_id_is_deduplicated_by_its_body(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-noid", TOKEN)
    body = notification("ord-noid", TOKEN)
    del body["eventId"]
    assert post(served, body).status_code == 200
    assert post(served, body).status_code == 200
    assert len(served.engine.get(flow_id).signals) == 1


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"{not json", "body is not JSON"),
        (b"", "body is empty"),
        (b"[1, 2]", "body must be a JSON object, got list"),
        (b'"text"', "body must be a JSON object, got str"),
        (json.dumps({"eventId": "e", "operation": "nope"}).encode(), "operation"),
        (json.dumps({"eventId": ["e"], "operation": {"orderId": "o"}}).encode(), "eventId"),
        (json.dumps({"eventId": "e", "securityToken": TOKEN}).encode(), "operation.orderId: missing"),
        (b"\xff\xfe\x00", "body is not JSON"),
        (b"[" * 2_000 + b"]" * 2_000, "nested too deeply"),
    ],
)
def test_a_malformed_body_is_400_naming_the_problem(served: Served, raw: bytes, problem: str) -> None:
    answer = served.http.post("/notifications", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    body = answer.json()
    assert body["outcome"] == "KO"
    assert problem in body["error"]
    assert "Traceback" not in answer.text
    assert served.counter("malformed") == 1


def test_an_oversized_body_is_refused_before_it_is_read(served: Served) -> None:
    limit = served.runtime.settings.receiver.max_body_bytes
    body = notification("ord-big", TOKEN) | {"padding": "x" * (limit + 10)}
    answer = post(served, body)
    assert answer.status_code == 413
    assert str(limit) in answer.json()["error"]

    def chunks() -> Any:  # no Content-Length: refused once the streamed body crosses the limit
        for _ in range(limit // 512 + 4):
            yield b" " * 512

    streamed = served.http.post("/notifications", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert served.counter("oversized") == 2
    # A body just under the limit is read and judged on its content.
    small = served.http.post("/notifications", content=b" " * (limit - 1))
    assert small.status_code == 400


def test_the_receiver_path_needs_no_api_key_but_the_api_does(served: Served) -> None:
    assert served.http.get("/flows").status_code == 401
    assert post(served, notification("ord-x", TOKEN)).status_code == REFUSED_STATUS


def test_a_burst_of_1000_notifications_loses_none_and_resumes_each_flow_once(served: Served) -> None:
    count = 1000
    flows = {f"ord-burst-{n}": waiting_flow(served.engine, f"ord-burst-{n}", f"tok{n:029d}") for n in range(count)}
    bodies = [notification(order, f"tok{n:029d}", f"ev-burst-{n}") for n, order in enumerate(flows)]
    # Every 10th event is delivered twice (the gateway retries), interleaved with the rest.
    bodies += bodies[::10]
    local = threading.local()

    def send(body: dict[str, Any]) -> int:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=served.url, timeout=30.0)
        return int(local.client.post("/notifications", json=body).status_code)

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(send, bodies))
    elapsed = time.monotonic() - began
    assert statuses == [200] * len(bodies)
    records = served.engine.store.many(flows.values())
    assert len(records) == count
    assert all(record.state is FlowState.READY for record in records), "every flow resumed"
    assert all(len(record.signals) == 1 for record in records), "each exactly once"
    assert served.counter("accepted") == count
    assert served.counter("duplicate") == count // 10
    assert elapsed < 60, f"the burst took {elapsed:.1f}s"


# -- the receiver's logic without HTTP: races and outages ---------------------------------------------


def test_a_repeat_while_the_first_is_still_recording_is_asked_to_retry(runtime: Runtime) -> None:
    engine = runtime.engine
    flow_id = waiting_flow(engine, "ord-race", TOKEN)
    receiver = NotificationReceiver(engine, runtime.settings.receiver, settle_seconds=0.2)
    # Another receiver claimed the event a moment ago and has not finished.
    pending = json.dumps({"state": "pending", "flow": flow_id, "t": time.time()})
    engine.redis.set(engine.keys.event("ev-race"), pending)
    receipt = receiver.receive(json.dumps(notification("ord-race", TOKEN, "ev-race")).encode())
    assert receipt.status == 503
    assert engine.get(flow_id).signals == []


def test_a_stale_claim_of_a_receiver_that_died_is_taken_over(runtime: Runtime) -> None:
    engine = runtime.engine
    flow_id = waiting_flow(engine, "ord-stale", TOKEN)
    receiver = NotificationReceiver(engine, runtime.settings.receiver, stale_seconds=5)
    # A receiver died after claiming the event, before signalling: its claim is a minute old.
    engine.redis.set(engine.keys.event("ev-stale"), json.dumps({"state": "pending", "flow": flow_id, "t": time.time() - 60}))
    receipt = receiver.receive(json.dumps(notification("ord-stale", TOKEN, "ev-stale")).encode())
    assert receipt.status == 200
    assert len(engine.get(flow_id).signals) == 1
    assert json.loads(engine.redis.get(engine.keys.event("ev-stale")))["state"] == "done"


def test_redis_unavailable_is_503_not_a_traceback(runtime: Runtime, key_prefix: str) -> None:
    from service.runtime import build_runtime

    settings = load_settings({"engine": {"key_prefix": key_prefix}})
    broken = build_runtime(settings, redis_url="redis://127.0.0.1:9/0")
    broken.engine.redis = redis.Redis(host="127.0.0.1", port=9, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        receiver = NotificationReceiver(broken.engine, settings.receiver)
        receipt = receiver.receive(json.dumps(notification("ord-down", TOKEN)).encode())
        assert receipt.status == 503
        assert receipt.body["outcome"] == "KO"
    finally:
        broken.close()


def test_a_payment_notified_after_the_flow_failed_is_not_dropped(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-late", TOKEN)
    served.engine.signal(flow_id, "notification", {"fail": True}, by="notification")
    assert served.engine.run_step(flow_id, "payment") == FlowState.FAILED.value
    answer = post(served, notification("ord-late", TOKEN, "ev-late", result="AUTHORIZED"))
    assert answer.status_code == 200, "acknowledged: the gateway must not keep resending"
    late = served.engine.get(flow_id)
    assert late.state is FlowState.NEEDS_ATTENTION
    assert late.error is not None and late.error["type"] == "LatePayment"
    assert served.counter("late_payment") == 1
    assert post(served, notification("ord-late", TOKEN, "ev-late", result="AUTHORIZED")).status_code == 200
    assert served.counter("late_payment") == 1, "a repeated event is not counted twice"
