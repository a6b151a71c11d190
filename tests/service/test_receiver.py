"""The notification receiver over real HTTP: tokens, repeats, malformed and oversized bodies, a burst,
and the read-back of every notified operation from the gateway (the simulator, over HTTP).

Every refusal for a token (wrong, another order's, missing) or an unknown order gets the same status
and body, and is counted; a recorded event is acknowledged 200 and a repeat never signals twice. A
notification with the right token moves a flow only on what the gateway says of its operation: an
operation it does not have is answered 503 (the gateway retries), another order's operation 401, and a
result or amount the body made up is replaced by the gateway's. The bodies posted are the simulator's
own (its notifications are logged, not delivered: ``notify_drop``), forged where a test says so.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from durapay.config import load_settings
from durapay.gateway import Catalogue
from durapay.service.receiver import REFUSED, REFUSED_STATUS, NotificationReceiver
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.sensitive import luhn, mask_text
from durapay.workflows.engine.states import FlowState
from tests.service.conftest import NOTIFIED, Served, notification, service_settings, signals_in_log, waiting_flow

TOKEN = "2f0ea5059b41414ca3744fe672327d85"
OTHER_TOKEN = "9a1b2c3d4e5f60718293a4b5c6d7e8f9"
APPROVE = "4349940199004549"
DECLINE = "4349940199997007"
#: The operation id of the finding: one the gateway never made.
PHANTOM = "555000000000000001"
NOWHERE = "http://127.0.0.1:9/notifications"


# -- a gateway: the simulator, its notifications logged and never sent ---------------------------------


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=41)) as server:
        yield server


@pytest.fixture
def sim(simulator: SimulatorServer) -> SimulatorServer:
    simulator.admin.reset()
    simulator.admin.set_faults(mode="notify_drop")  # the tests post the simulator's bodies themselves
    simulator.admin.set_faults(mode="latency", operation="get_operation", latency_ms=0)  # counts the reads
    return simulator


@pytest.fixture
def runtime(redis_url: str, key_prefix: str, sim: SimulatorServer) -> Iterator[Runtime]:
    """conftest's runtime, its gateway the simulator."""
    settings = service_settings(key_prefix, gateway={"base_url": sim.base_url}, receiver={"public_url": NOWHERE})
    built = build_runtime(settings, redis_url=redis_url, flows={"notified": NOTIFIED})
    built.engine.sender = None
    yield built
    built.engine.gateway().close()
    built.close()


def reads(sim: SimulatorServer) -> int:
    """How many times the gateway was asked ``GET /operations/{operationId}``."""
    rules = sim.admin.faults()["rules"]
    return int(next(rule["fired"] for rule in rules if rule.get("operation") == "get_operation" and rule["mode"] == "latency"))


def post(served: Served, body: Any) -> httpx.Response:
    return served.http.post("/notifications", json=body)


def hosted_page(engine: Engine, order_id: str) -> str:
    """A hosted page made at the gateway for ``order_id``; its security token."""
    created = engine.gateway().call(
        Catalogue.create_hpp_order,
        request={
            "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
            "paymentSession": {
                "actionType": "PAY",
                "amount": "1500",
                "language": "eng",
                "resultUrl": "https://shop.example/r",
                "notificationUrl": NOWHERE,
            },
        },
    )
    assert created.securityToken
    return created.securityToken


def pay(sim: SimulatorServer, order_id: str, pan: str = APPROVE) -> dict[str, Any]:
    """The customer pays on the page (declined with ``DECLINE``); the gateway's notification body of it."""
    done = sim.admin.complete_hpp(order_id, pan=pan)
    (sent,) = [n for n in sim.admin.notifications(order_id=order_id) if n["operationId"] == done["operationId"]]
    body: dict[str, Any] = sent["body"]
    return body


def page_flow(engine: Engine, order_id: str) -> str:
    """A ``notified`` flow waiting on a real hosted page of ``order_id`` (the gateway's token kept)."""
    return waiting_flow(engine, order_id, hosted_page(engine, order_id))


def hpp_flow(engine: Engine, order_id: str) -> tuple[str, str]:
    """A real ``hpp`` flow waiting for its customer: (flow id, the security token the gateway gave it)."""
    order = {"orderId": order_id, "amount": "1500", "currency": "EUR"}
    session = {"actionType": "PAY", "amount": "1500", "language": "eng", "resultUrl": "https://shop.example/r"}
    record = engine.start("hpp", {"order": order, "paymentSession": session})
    assert engine.run_step(record.id, "create") == FlowState.READY.value
    assert engine.run_step(record.id, "payment") == FlowState.WAITING.value
    token = engine.get(record.id).outputs["create"]["securityToken"]
    return record.id, str(token)


def cancel_waiting(engine: Engine, flow_id: str) -> None:
    """Cancel a waiting hosted page flow: a request (the customer may still pay), whose step reads the
    order and, nothing paid, ends it ``cancelled`` (docs/durability.md, Waiting flows)."""
    assert engine.cancel(flow_id, "customer left").cancel_requested
    assert engine.run_step(flow_id, "payment") == FlowState.CANCELLED.value


def gateway_view(body: dict[str, Any]) -> dict[str, Any]:
    """A notified operation as the signal carries it: the gateway's fields, none empty."""
    return {key: value for key, value in body["operation"].items() if value is not None}


def claimed(served: Served, event_id: str) -> bool:
    return bool(served.runtime.redis.exists(served.engine.keys.event(event_id)))


def test_a_good_token_records_the_event_and_resumes_the_flow(served: Served, sim: SimulatorServer) -> None:
    flow_id = page_flow(served.engine, "ord-good")
    body = pay(sim, "ord-good")
    answer = post(served, body)
    assert answer.status_code == 200
    assert answer.json() == {"outcome": "OK"}
    record = served.engine.get(flow_id)
    assert record.state is FlowState.READY, "resumed: ready to run its wait step again"
    assert [s.payload for s in record.signals] == [
        {"eventId": body["eventId"], "eventTime": body["eventTime"], "operation": gateway_view(body)}
    ]
    assert record.signals[0].payload["operation"]["operationResult"] == "EXECUTED"
    assert claimed(served, body["eventId"]), "the event id is recorded"
    assert served.counter("accepted") == 1
    assert reads(sim) == 1, "the operation was read back from the gateway once"
    # The flow then consumes the notification and finishes.
    assert served.engine.run_step(flow_id, "payment") == FlowState.SUCCEEDED.value


def test_the_log_names_the_gateways_operation_whole_and_a_claimed_one_masked(
    served: Served, sim: SimulatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37, finding 8: log masking turned Luhn-valid operation ids (one in ten) into masked numbers.
    The operation read back from the gateway is an identifier, marked so (``sensitive.Identifier``) and
    whole in the log; an operation id a body only claims is masked like any number there."""
    caplog.set_level(logging.INFO, logger="durapay.receiver")
    for attempt in range(12):  # the simulator numbers operations in order: one in ten passes the Luhn check
        order_id = f"ord-logged-{attempt}"
        page_flow(served.engine, order_id)
        body = pay(sim, order_id)
        if luhn(body["operation"]["operationId"]):
            break
    operation = body["operation"]["operationId"]
    assert luhn(operation) and mask_text(operation) != operation
    assert post(served, body).status_code == 200
    claimed_only = notification("ord-no-flow", TOKEN, event_id="ev-claimed")  # no flow holds it: logged with its claims
    claimed_only["operation"]["operationId"] = APPROVE
    assert post(served, claimed_only).status_code == REFUSED_STATUS
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert f"(operation {operation})" in logged, logged
    assert APPROVE not in logged and f"{APPROVE[:6]}******{APPROVE[-4:]}" in logged


@pytest.mark.parametrize(
    ("case", "token"),
    [("wrong token", "0" * 32), ("token of another order", OTHER_TOKEN), ("no token", None), ("empty token", "")],
)
def test_a_bad_token_is_refused_alike_and_counted(served: Served, sim: SimulatorServer, case: str, token: str | None) -> None:
    flow_id = waiting_flow(served.engine, "ord-a", TOKEN)
    waiting_flow(served.engine, "ord-b", OTHER_TOKEN)
    answer = post(served, notification("ord-a", token, f"ev-{case}"))
    assert answer.status_code == REFUSED_STATUS, case
    assert answer.json() == REFUSED, case
    assert served.engine.get(flow_id).state is FlowState.WAITING
    assert served.engine.get(flow_id).signals == []
    assert served.counter("rejected") == 1
    assert not claimed(served, f"ev-{case}"), "a refused event is not recorded"
    assert reads(sim) == 0, "a forger without the token never makes durapay ask the gateway"


def test_an_unknown_order_gets_the_same_refusal(served: Served, sim: SimulatorServer) -> None:
    waiting_flow(served.engine, "ord-known", TOKEN)
    answer = post(served, notification("ord-nobody-knows", TOKEN, "ev-unknown"))
    assert (answer.status_code, answer.json()) == (REFUSED_STATUS, REFUSED)
    assert served.counter("rejected") == 1
    assert reads(sim) == 0


def test_a_repeated_event_is_acknowledged_without_a_second_signal(served: Served, sim: SimulatorServer) -> None:
    flow_id = page_flow(served.engine, "ord-rep")
    body = pay(sim, "ord-rep")
    assert post(served, body).status_code == 200
    assert served.engine.run_step(flow_id, "payment") == FlowState.SUCCEEDED.value
    for _ in range(3):
        again = post(served, body)
        assert (again.status_code, again.json()) == (200, {"outcome": "OK"})
    assert signals_in_log(served.engine, flow_id) == 1
    assert served.counter("accepted") == 1
    assert served.counter("duplicate") == 3
    assert reads(sim) == 1, "a repeat is acknowledged without asking the gateway again"


def test_a_notification_without_event_id_is_deduplicated_by_its_body(served: Served, sim: SimulatorServer) -> None:
    flow_id = page_flow(served.engine, "ord-noid")
    body = pay(sim, "ord-noid")
    del body["eventId"]
    assert post(served, body).status_code == 200
    assert post(served, body).status_code == 200
    assert len(served.engine.get(flow_id).signals) == 1


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"{not json", "body is not valid JSON"),
        (b"", "body is empty"),
        (b"[1, 2]", "body must be a JSON object, got list"),
        (b'"text"', "body must be a JSON object, got str"),
        (json.dumps({"eventId": "e", "operation": "nope"}).encode(), "operation"),
        (json.dumps({"eventId": ["e"], "operation": {"orderId": "o"}}).encode(), "eventId"),
        (json.dumps({"eventId": "e", "securityToken": TOKEN}).encode(), "operation.orderId: missing"),
        (json.dumps({"eventId": "e", "securityToken": TOKEN, "operation": {"orderId": "o"}}).encode(), "operation.operationId"),
        (
            json.dumps({"eventId": "e", "securityToken": TOKEN, "operation": {"orderId": "o", "operationId": " "}}).encode(),
            "operation.operationId: missing",
        ),
        (
            json.dumps({"eventId": "e", "securityToken": TOKEN, "operation": {"orderId": "o", "operationId": ".."}}).encode(),
            "operation.operationId: not an operation id",
        ),
        (b"\xff\xfe\x00", "the body is UTF-16 (little-endian, with a byte order mark)"),
        (b"[" * 2_000 + b"]" * 2_000, "nested deeper than 32 levels"),
    ],
)
def test_a_malformed_body_is_400_naming_the_problem(served: Served, sim: SimulatorServer, raw: bytes, problem: str) -> None:
    answer = served.http.post("/notifications", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    body = answer.json()
    assert body["outcome"] == "KO"
    assert problem in body["error"]
    assert "Traceback" not in answer.text
    assert served.counter("malformed") == 1
    assert reads(sim) == 0


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


def test_a_burst_of_1000_notifications_loses_none_and_resumes_each_flow_once(served: Served, sim: SimulatorServer) -> None:
    count = 1000
    orders = [f"ord-burst-{n}" for n in range(count)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        flows = dict(zip(orders, pool.map(lambda order: page_flow(served.engine, order), orders), strict=True))
        list(pool.map(lambda order: sim.admin.complete_hpp(order, pan=APPROVE), orders))
    sent = {note["orderId"]: note["body"] for note in sim.admin.notifications()}  # one payment per order
    bodies = [sent[order] for order in orders]
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


# -- the read-back: a notification moves money state only on what the gateway says ----------------------


def forged(body: dict[str, Any], event_id: str, **operation: str) -> dict[str, Any]:
    """``body`` (the gateway's, with its real token) as a forger would change it: another event id,
    operation fields of their choosing."""
    return {**body, "eventId": event_id, "operation": {**body["operation"], **operation}}


def phantom(order_id: str, token: str, event_id: str = "ev-phantom") -> dict[str, Any]:
    """The finding: the page's real token, an operation the gateway does not have."""
    return {
        "eventId": event_id,
        "eventTime": "2026-01-01T10:00:00.000Z",
        "securityToken": token,
        "operation": {"orderId": order_id, "operationId": PHANTOM, "operationResult": "EXECUTED", "operationAmount": "1500"},
    }


UNVERIFIED = {"outcome": "KO", "error": "operation not found at the gateway; try again"}


def test_an_invented_operation_with_the_real_token_does_not_end_a_waiting_hosted_page(
    served: Served, sim: SimulatorServer
) -> None:
    flow_id, token = hpp_flow(served.engine, "ord-phantom")
    answer = post(served, phantom("ord-phantom", token))
    assert (answer.status_code, answer.json()) == (503, UNVERIFIED), "not 200: the gateway would retry; a forger learns nothing"
    record = served.engine.get(flow_id)
    assert record.state is FlowState.WAITING, record.summary()
    assert record.signals == [] and signals_in_log(served.engine, flow_id) == 0
    assert served.counter("unverified") == 1
    assert served.counter("accepted") == 0
    assert not claimed(served, "ev-phantom"), "the claim is released: a retry is processed"
    assert reads(sim) == 1


def test_an_invented_operation_does_not_make_a_cancelled_flow_a_late_payment(served: Served, sim: SimulatorServer) -> None:
    flow_id, token = hpp_flow(served.engine, "ord-cancelled")
    cancel_waiting(served.engine, flow_id)
    answer = post(served, phantom("ord-cancelled", token))
    assert (answer.status_code, answer.json()) == (503, UNVERIFIED)
    record = served.engine.get(flow_id)
    assert record.state is FlowState.CANCELLED, record.summary()
    assert record.error is None or record.error.get("type") != "LatePayment"
    assert served.counter("late_payment") == 0
    assert served.counter("unverified") == 1


def test_a_forged_result_for_a_real_operation_is_judged_on_the_gateways_word(served: Served, sim: SimulatorServer) -> None:
    flow_id, _ = hpp_flow(served.engine, "ord-forged")
    declined = pay(sim, "ord-forged", DECLINE)
    assert declined["operation"]["operationResult"] == "DECLINED"
    lie = forged(declined, "ev-forged", operationResult="EXECUTED", operationAmount="999999")
    assert post(served, lie).status_code == 200
    (signal,) = served.engine.get(flow_id).signals
    assert signal.payload["operation"] == gateway_view(declined), "the gateway's operation, not the body's"
    assert served.engine.run_step(flow_id, "payment") == FlowState.FAILED.value
    failed = served.engine.get(flow_id)
    assert failed.error is not None and failed.error["operationResult"] == "DECLINED", failed.summary()


def test_a_forged_result_does_not_make_a_cancelled_flow_a_late_payment(served: Served, sim: SimulatorServer) -> None:
    flow_id, _ = hpp_flow(served.engine, "ord-forged-late")
    cancel_waiting(served.engine, flow_id)
    declined = pay(sim, "ord-forged-late", DECLINE)
    assert post(served, forged(declined, "ev-forged-late", operationResult="EXECUTED")).status_code == 200
    assert served.engine.get(flow_id).state is FlowState.CANCELLED
    assert served.counter("late_payment") == 0


def test_an_operation_of_another_order_is_refused_like_a_bad_token(served: Served, sim: SimulatorServer) -> None:
    mine, token = hpp_flow(served.engine, "ord-mine")
    hpp_flow(served.engine, "ord-theirs")
    theirs = pay(sim, "ord-theirs")
    # My page's token and order id, their (real, paid) operation.
    lie = {**forged(theirs, "ev-theirs", orderId="ord-mine"), "securityToken": token}
    answer = post(served, lie)
    assert (answer.status_code, answer.json()) == (REFUSED_STATUS, REFUSED)
    assert served.engine.get(mine).state is FlowState.WAITING
    assert served.engine.get(mine).signals == []
    assert served.counter("rejected") == 1
    assert not claimed(served, "ev-theirs")


def test_an_operation_the_gateway_does_not_have_yet_is_retried_until_it_does(served: Served, sim: SimulatorServer) -> None:
    flow_id, token = hpp_flow(served.engine, "ord-early")
    hpp_flow(served.engine, "ord-before")
    before = pay(sim, "ord-before")
    # The simulator numbers operations in sequence: the next one it makes will be this.
    coming = str(int(before["operation"]["operationId"]) + 1)
    early = phantom("ord-early", token, "ev-early") | {
        "operation": {"orderId": "ord-early", "operationId": coming, "operationResult": "AUTHORIZED"}
    }
    assert (post(served, early).status_code, served.counter("unverified")) == (503, 1)
    assert served.engine.get(flow_id).state is FlowState.WAITING
    paid = pay(sim, "ord-early")
    assert paid["operation"]["operationId"] == coming
    retried = post(served, early)  # the gateway sends the same event again
    assert retried.status_code == 200
    (signal,) = served.engine.get(flow_id).signals
    assert signal.payload["operation"] == gateway_view(paid)
    assert served.engine.run_step(flow_id, "payment") == FlowState.SUCCEEDED.value
    assert served.counter("accepted") == 1


@pytest.mark.parametrize(
    "fault",
    [{"mode": "error", "status": 500}, {"mode": "error", "status": 503}, {"mode": "drop"}],
    ids=["500", "503", "connection dropped"],
)
def test_a_failed_read_is_503_with_the_claim_released(served: Served, sim: SimulatorServer, fault: dict[str, Any]) -> None:
    flow_id = page_flow(served.engine, "ord-unread")
    body = pay(sim, "ord-unread")
    sim.admin.set_faults(operation="get_operation", count=1, **fault)
    answer = post(served, body)
    assert answer.status_code == 503
    assert answer.json() == {"outcome": "KO", "error": "could not read the operation at the gateway; try again"}
    assert served.engine.get(flow_id).signals == []
    assert not claimed(served, body["eventId"]), "released: the gateway's retry is processed, not taken for a repeat"
    assert served.counter("failed") == 1
    assert post(served, body).status_code == 200
    assert len(served.engine.get(flow_id).signals) == 1
    assert served.counter("accepted") == 1


# -- the receiver's logic without HTTP: races and outages ---------------------------------------------


def test_a_repeat_while_the_first_is_still_recording_is_asked_to_retry(runtime: Runtime, sim: SimulatorServer) -> None:
    engine = runtime.engine
    flow_id = page_flow(engine, "ord-race")
    body = pay(sim, "ord-race")
    receiver = NotificationReceiver(engine, runtime.settings.receiver, settle_seconds=0.2)
    # Another receiver claimed the event a moment ago and has not finished.
    pending = json.dumps({"state": "pending", "flow": flow_id, "t": time.time()})
    engine.redis.set(engine.keys.event(body["eventId"]), pending)
    receipt = receiver.receive(json.dumps(body).encode())
    assert receipt.status == 503
    assert engine.get(flow_id).signals == []
    assert reads(sim) == 0


def test_a_stale_claim_of_a_receiver_that_died_is_taken_over(runtime: Runtime, sim: SimulatorServer) -> None:
    engine = runtime.engine
    flow_id = page_flow(engine, "ord-stale")
    body = pay(sim, "ord-stale")
    key = engine.keys.event(body["eventId"])
    receiver = NotificationReceiver(engine, runtime.settings.receiver, stale_seconds=5)
    # A receiver died after claiming the event, before signalling: its claim is a minute old.
    engine.redis.set(key, json.dumps({"state": "pending", "flow": flow_id, "t": time.time() - 60}))
    receipt = receiver.receive(json.dumps(body).encode())
    assert receipt.status == 200
    assert len(engine.get(flow_id).signals) == 1
    assert json.loads(engine.redis.get(key))["state"] == "done"


def test_redis_unavailable_is_503_not_a_traceback(runtime: Runtime, key_prefix: str) -> None:
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


def test_a_payment_notified_after_the_flow_failed_is_not_dropped(served: Served, sim: SimulatorServer) -> None:
    flow_id = page_flow(served.engine, "ord-late")
    served.engine.signal(flow_id, "notification", {"fail": True}, by="notification")
    assert served.engine.run_step(flow_id, "payment") == FlowState.FAILED.value
    body = pay(sim, "ord-late")
    answer = post(served, body)
    assert answer.status_code == 200, "acknowledged: the gateway must not keep resending"
    late = served.engine.get(flow_id)
    assert late.state is FlowState.NEEDS_ATTENTION
    assert late.error is not None and late.error["type"] == "LatePayment"
    assert late.error["operation"]["operationId"] == body["operation"]["operationId"]
    assert served.counter("late_payment") == 1
    assert post(served, body).status_code == 200
    assert served.counter("late_payment") == 1, "a repeated event is not counted twice"


def test_an_authentic_notification_whose_flow_record_is_gone_is_told_not_dropped(served: Served, sim: SimulatorServer) -> None:
    """A review of issues 21 and 22: an order lookup can outlive its flow's record (a renewal kept the
    lookups longer than the record); a verified notification for it was answered 200 and dropped, counted
    only ``accepted``: money at the gateway in no flow, silently. It is told like an unknown order
    (``notification.unknown_order``, now ``verified``) and counted ``unknown_order``."""
    from durapay.workflows.unknown_orders import TYPE
    from tests.waiting import wait_until

    flow_id = page_flow(served.engine, "ord-record-gone")
    served.engine.redis.delete(served.engine.keys.flow(flow_id))  # the record expired before its lookups
    body = pay(sim, "ord-record-gone")
    assert post(served, body).status_code == 200
    wait_until(lambda: served.counter("unknown_order") == 1, 10, "the notification counted as an unknown order")
    (event,) = [event.wire() for event, _ in served.engine.events(types=[TYPE])]
    assert event["orderId"] == "ord-record-gone"
    assert event["data"]["verified"] is True and event["operationId"] == body["operation"]["operationId"]
