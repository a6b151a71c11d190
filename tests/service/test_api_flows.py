"""The control API over real HTTP: the key, starting flows, reading, listing, signals, cancel, retry.

``served`` runs no worker (steps are run by the test with ``engine.run_step``); ``live`` runs a real
Celery worker, for the answers that depend on a step having run (the customer URL).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from durapay.service.app import create_app
from durapay.service.auth import MissingApiKey
from durapay.service.runtime import Runtime
from durapay.workflows.engine.states import FlowState
from tests.service.conftest import API_KEY, Served, notification, waiting_flow

KEY = {"X-Api-Key": API_KEY}
TOKEN = "00112233445566778899aabbccddeeff"

PROTECTED = [
    ("GET", "/flows"),
    ("GET", "/flows/f123"),
    ("GET", "/flows/f123/history"),
    ("POST", "/flows/moto"),
    ("POST", "/flows/f123/signals/3ds_result"),
    ("POST", "/flows/f123/cancel"),
    ("POST", "/flows/f123/retry"),
    ("GET", "/schedules"),
    ("POST", "/schedules"),
    ("GET", "/schedules/s1"),
    ("PATCH", "/schedules/s1"),
    ("DELETE", "/schedules/s1"),
    ("POST", "/schedules/s1/pause"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_without_the_key_every_control_route_is_401(served: Served, method: str, path: str) -> None:
    for headers in ({}, {"X-Api-Key": "wrong"}, {"X-Api-Key": API_KEY[:-1]}, {"Authorization": "Bearer wrong"}):
        answer = served.http.request(method, path, headers=headers, json={"bad": "body"})
        assert answer.status_code == 401, (method, path, headers)
        assert answer.json() == {"error": "unauthorized", "reason": "missing or wrong X-Api-Key"}


def test_with_the_key_or_a_bearer_token_the_api_answers(served: Served) -> None:
    assert served.http.get("/flows", headers=KEY).status_code == 200
    assert served.http.get("/flows", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


def test_open_paths_need_no_key(served: Served) -> None:
    assert served.http.get("/healthz").json() == {"status": "ok"}
    spec = served.http.get("/openapi.json").json()
    assert "/notifications" in spec["paths"]
    assert {"/flows/hpp", "/flows/moto", "/flows/three_steps", "/flows/refund", "/schedules"} <= set(spec["paths"])
    assert served.http.get("/docs").status_code == 200


def test_the_openapi_document_gives_each_kind_an_example_its_start_takes(served: Served) -> None:
    """Issue 41 finding 8: the hpp body had to be found in docs/api.md. Each POST /flows/{kind} carries an
    example (workflows.flows.examples) that the strict reader takes as the kind's input."""
    from durapay.gateway import validate_strict
    from durapay.workflows.flows import REGISTRY

    spec = served.http.get("/openapi.json").json()
    for kind, definition in REGISTRY.items():
        content = spec["paths"][f"/flows/{kind}"]["post"]["requestBody"]["content"]["application/json"]
        [example] = content["examples"].values()
        validate_strict(definition.input_model, example["value"])
        assert "durapay dev" in example["description"], example


def test_an_empty_api_key_refuses_to_build_the_app_unless_insecure(runtime: Runtime) -> None:
    from dataclasses import replace

    from durapay.config import load_settings

    open_settings = load_settings({"engine": {"key_prefix": runtime.settings.engine.key_prefix}})
    unkeyed = replace(runtime, settings=open_settings)
    with pytest.raises(MissingApiKey, match="DURAPAY_API__KEY is empty"):
        create_app(unkeyed)
    create_app(unkeyed, insecure=True)


def test_start_answers_id_state_and_the_customer_url(live: Served) -> None:
    answer = live.http.post("/flows/notified", json={"orderId": "ord-start", "token": TOKEN})
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["id"].startswith("f")
    assert body["kind"] == "notified"
    assert body["customer_url"] == "https://pay.example/ord-start", "waited for the first step's URL"
    assert body["state"] in {"ready", "running", "waiting"}
    assert body["outputs"]["create"]["securityToken"] == "***", "secrets are masked in answers"


def test_idempotency_key_gives_the_same_flow_and_a_different_body_conflicts(served: Served) -> None:
    body = {"orderId": "ord-idem", "token": TOKEN}
    headers = KEY | {"Idempotency-Key": "merchant-order-77"}
    first = served.http.post("/flows/notified?wait=0", json=body, headers=headers)
    second = served.http.post("/flows/notified?wait=0", json=body, headers=headers)
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    other = served.http.post("/flows/notified?wait=0", json={**body, "orderId": "ord-other"}, headers=headers)
    assert other.status_code == 409
    assert other.json()["error"] == "conflict"


def test_a_start_key_names_the_whole_request_its_run_at_too(served: Served) -> None:
    """Issue 23, item 13: the same key and body with another ``?run_at`` was answered 201 with the first
    flow, still due at the first time. A delay repeated later is the same request."""
    body = {"orderId": "ord-idem-later", "token": TOKEN}
    headers = KEY | {"Idempotency-Key": "merchant-order-78"}
    first = served.http.post("/flows/notified?wait=0&run_at=in%202h", json=body, headers=headers)
    assert first.status_code == 201
    again = served.http.post("/flows/notified?wait=0&run_at=in%202h", json=body, headers=headers)
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert again.json()["due"] == first.json()["due"], "the first flow, due when it was first asked"
    for other in ("/flows/notified?wait=0&run_at=in%203h", "/flows/notified?wait=0"):
        refused = served.http.post(other, json=body, headers=headers)
        assert refused.status_code == 409, other
        assert refused.json()["error"] == "conflict"
    unkeyed_later = served.http.post(
        "/flows/notified?wait=0", json={**body, "orderId": "ord-idem-now"}, headers=KEY | {"Idempotency-Key": "merchant-order-79"}
    )
    assert unkeyed_later.status_code == 201
    assert (
        served.http.post(
            "/flows/notified?wait=0&run_at=in%201h",
            json={**body, "orderId": "ord-idem-now"},
            headers=KEY | {"Idempotency-Key": "merchant-order-79"},
        ).status_code
        == 409
    ), "a key first used without a start time"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/flows/moto", {"order": {"orderId": "o1", "amount": "x", "currency": "EUR"}, "card": {}}, "order.amount"),
        ("/flows/moto", {"order": {"orderId": "o1", "amount": "100", "currency": "EUR"}}, "card"),
        ("/flows/moto", [1, 2], "(body)"),
        ("/flows/notified?wait=999", {"orderId": "o", "token": "t"}, "query.wait"),
        ("/flows/notified?run_at=tomorrowish", {"orderId": "o", "token": "t"}, "query.run_at"),
    ],
)
def test_bad_input_is_422_naming_the_field(served: Served, path: str, body: Any, field: str) -> None:
    answer = served.http.post(path, json=body, headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_input"
    assert answer.json()["field"] == field
    assert answer.json()["reason"]


def test_an_unknown_flow_kind_is_a_path_that_does_not_exist(served: Served) -> None:
    answer = served.http.post("/flows/mot", json={}, headers=KEY)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"] == "not_found"
    assert "did you mean `moto`?" in answer.json()["reason"]


def test_a_body_that_is_not_json_is_422(served: Served) -> None:
    answer = served.http.post("/flows/moto", content=b"{oops", headers=KEY | {"content-type": "application/json"})
    assert answer.status_code == 422
    assert answer.json()["field"] == "(body)"
    assert "not valid JSON" in answer.json()["reason"]


@pytest.mark.parametrize(
    ("query", "field"),
    [("limit=0", "query.limit"), ("limit=501", "query.limit"), ("after=", "query.after"), ("after=12.5", "query.after"),
     ("after=soon:f1", "query.after"), ("offset=2", "query.offset"), ("state=bogus", "query.state"),
     ("kind=bogus", "query.kind"), ("since=yesterday-ish", "query.since")],
)  # fmt: skip
def test_bad_list_filters_are_422(served: Served, query: str, field: str) -> None:
    answer = served.http.get(f"/flows?{query}", headers=KEY)
    assert answer.status_code == 422
    assert answer.json()["field"] == field


def test_list_filters_and_pages(served: Served) -> None:
    waiting = [waiting_flow(served.engine, f"ord-list-{n}", TOKEN) for n in range(3)]
    ready = [served.engine.start("notified", {"orderId": f"ord-ready-{n}", "token": TOKEN}).id for n in range(2)]
    everything = served.http.get("/flows", headers=KEY).json()
    assert {flow["id"] for flow in everything["flows"]} == set(waiting + ready)
    assert (everything["limit"], everything["next"]) == (50, None)
    first = served.http.get("/flows?state=waiting&limit=2", headers=KEY).json()
    assert len(first["flows"]) == 2 and first["next"]
    rest = served.http.get("/flows", params={"state": "waiting", "limit": 2, "after": first["next"]}, headers=KEY).json()
    assert len(rest["flows"]) == 1 and rest["next"] is None
    assert {f["id"] for f in first["flows"] + rest["flows"]} == set(waiting)
    assert all(f["state"] == "waiting" for f in first["flows"])
    by_kind = served.http.get("/flows?kind=notified&since=1h", headers=KEY).json()
    assert len(by_kind["flows"]) == 5
    assert served.http.get("/flows?kind=moto", headers=KEY).json()["flows"] == []
    assert served.http.get("/flows?since=2000-01-01T00:00:00Z", headers=KEY).json()["flows"]
    assert served.http.get("/flows?since=4102444800", headers=KEY).json()["flows"] == []


def test_pages_neither_repeat_nor_skip_a_flow_when_flows_start_between_them(served: Served) -> None:
    """With ``offset``, a page read, then flows started, then the next page showed the first page's end again."""
    older = [served.engine.start("notified", {"orderId": f"ord-page-{n}", "token": TOKEN}).id for n in range(7)]
    first = served.http.get("/flows?limit=3", headers=KEY).json()
    seen = [flow["id"] for flow in first["flows"]]
    for n in range(5):
        served.engine.start("notified", {"orderId": f"ord-new-{n}", "token": TOKEN})
    after = first["next"]
    for _ in range(10):
        if after is None:
            break
        page = served.http.get("/flows", params={"limit": 3, "after": after}, headers=KEY).json()
        seen += [flow["id"] for flow in page["flows"]]
        after = page["next"]
    assert sorted(seen) == sorted(older) and len(seen) == len(set(seen)), "every flow once, none of the new ones"


def test_a_bad_cursor_is_refused_saying_why(served: Served) -> None:
    answer = served.http.get("/flows?after=yesterday:fabc", headers=KEY)
    assert answer.status_code == 422
    assert answer.json() == {
        "error": "invalid_input",
        "field": "query.after",
        "reason": "the cursor's time 'yesterday' is not a time: pass the `next` of the previous page as it is",
    }


def test_a_flow_shows_the_definition_it_started_on(served: Served) -> None:
    """Issue 38: the record keeps ``kind@version`` from its start; a record of an earlier release, without
    the field, is on the kind's first version as the code declares it (docs/deploys.md)."""
    flow_id = waiting_flow(served.engine, "ord-version", TOKEN)
    current = served.engine.registry["notified"].version
    assert served.engine.redis.hget(served.engine.keys.flow(flow_id), "definition") == f"notified@{current}".encode()
    flow = served.http.get(f"/flows/{flow_id}", headers=KEY).json()
    assert flow["definition"] == {"kind": "notified", "version": current}
    served.engine.redis.hdel(served.engine.keys.flow(flow_id), "definition")
    assert served.http.get(f"/flows/{flow_id}", headers=KEY).json()["definition"] == {"kind": "notified", "version": current}


def test_get_history_and_404(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-get", TOKEN)
    flow = served.http.get(f"/flows/{flow_id}", headers=KEY).json()
    assert flow["state"] == "waiting" and flow["step"] == "payment"
    assert flow["customer_url"] == "https://pay.example/ord-get"
    assert flow["outputs"]["create"]["securityToken"] == "***"
    history = served.http.get(f"/flows/{flow_id}/history", headers=KEY).json()["history"]
    assert [entry["to"] for entry in history] == ["ready", "running", "ready", "running", "waiting"]
    missing = served.http.get("/flows/fnothere", headers=KEY)
    assert (missing.status_code, missing.json()["error"]) == (404, "not_found")
    assert served.http.get("/flows/fnothere/history", headers=KEY).status_code == 404
    assert served.http.get("/flows/bad%20id", headers=KEY).status_code == 422


def test_signal_resumes_then_a_finished_flow_refuses_it(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-sig", TOKEN)
    payload = notification("ord-sig", None)
    forged = served.http.post(f"/flows/{flow_id}/signals/notification", json=payload, headers=KEY)
    assert forged.status_code == 422 and forged.json()["field"] == "name", "only the receiver delivers notifications"
    answer = served.http.post(f"/flows/{flow_id}/signals/paid", json=payload, headers=KEY)
    assert answer.status_code == 200
    assert answer.json()["result"] == "resumed"
    assert served.engine.run_step(flow_id, "payment") == FlowState.SUCCEEDED.value
    late = served.http.post(f"/flows/{flow_id}/signals/paid", json={}, headers=KEY)
    assert late.status_code == 409
    assert served.http.post("/flows/fnothere/signals/paid", headers=KEY).status_code == 404
    bad = served.http.post(f"/flows/{flow_id}/signals/paid", json=[1], headers=KEY)
    assert bad.status_code == 422


def test_a_signal_without_body_is_stored_until_the_flow_waits(served: Served) -> None:
    record = served.engine.start("notified", {"orderId": "ord-early", "token": TOKEN})
    answer = served.http.post(f"/flows/{record.id}/signals/paid", headers=KEY)
    assert answer.json()["result"] == "stored"


def test_cancel_then_cancel_again_conflicts(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-cancel", TOKEN)
    answer = served.http.post(f"/flows/{flow_id}/cancel", json={"reason": "customer left"}, headers=KEY)
    assert answer.status_code == 200
    assert answer.json()["state"] == "cancelled"
    assert answer.json()["outcome"] == {"reason": "customer left"}
    again = served.http.post(f"/flows/{flow_id}/cancel", headers=KEY)
    assert again.status_code == 409
    assert "already ended" in again.json()["reason"]
    assert served.http.post(f"/flows/{flow_id}/cancel", json={"reason": ""}, headers=KEY).status_code == 422


def test_a_start_naming_another_flows_order_id_is_a_conflict_naming_the_field(served: Served) -> None:
    first = served.http.post("/flows/notified", json={"orderId": "ord-taken", "token": TOKEN}, headers=KEY)
    assert first.status_code == 201
    second = served.http.post("/flows/notified", json={"orderId": "ord-taken", "token": "other"}, headers=KEY)
    assert second.status_code == 409, second.text
    assert second.json()["field"] == "orderId" and first.json()["id"] in second.json()["reason"]


def test_a_cancel_while_money_may_be_in_flight_is_accepted_as_a_request(served: Served) -> None:
    """202: the flow reads the gateway before it may end (the engine's rule: docs/durability.md). The money in
    flight is written as a money step's claim writes it (this app's test kind has no money step)."""
    flow_id = waiting_flow(served.engine, "ord-inflight", TOKEN)
    unsettled = {"step": "payment", "op": "create_moto_order", "t": served.engine.clock.now()}
    served.engine.redis.hset(served.engine.keys.flow(flow_id), "unsettled", json.dumps(unsettled))
    answer = served.http.post(f"/flows/{flow_id}/cancel", json={"reason": "customer left"}, headers=KEY)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["state"] == "ready" and body["cancel_requested"] and body["unsettled"]["op"] == "create_moto_order"
    history = served.http.get(f"/flows/{flow_id}/history", headers=KEY).json()
    assert "cancel requested, the gateway is read first" in json.dumps(history)


def test_retry_a_failed_flow_and_refuse_a_cancelled_one(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "ord-retry", TOKEN)
    served.engine.signal(flow_id, "notification", {"fail": True}, by="notification")
    assert served.engine.run_step(flow_id, "payment") == FlowState.FAILED.value
    answer = served.http.post(f"/flows/{flow_id}/retry", headers=KEY)
    assert answer.status_code == 200
    assert (answer.json()["state"], answer.json()["step"]) == ("ready", "create")
    served.engine.cancel(flow_id, "done with it")
    refused = served.http.post(f"/flows/{flow_id}/retry", headers=KEY)
    assert refused.status_code == 409
    assert served.http.post("/flows/fnothere/retry", headers=KEY).status_code == 404


def test_unknown_routes_and_methods_answer_in_the_error_shape(served: Served) -> None:
    assert served.http.get("/nothing", headers=KEY).json()["error"] == "not_found"
    answer = served.http.put("/flows/f1", headers=KEY)
    assert answer.status_code == 405
    assert answer.json()["error"] == "method_not_allowed"


def test_a_run_at_start_sleeps_until_then(served: Served) -> None:
    later = served.engine.clock.now() + 3600
    answer = served.http.post(f"/flows/notified?run_at={later}", json={"orderId": "ord-later", "token": TOKEN}, headers=KEY)
    assert answer.status_code == 201
    assert answer.json()["state"] == "sleeping"
    assert answer.json()["due"] == pytest.approx(later)


def test_a_start_may_name_its_tenant(served: Served) -> None:
    """Issue 40, item 2: ``?tenant=`` names the merchant a platform starts the flow for (with the terminal,
    the flow's fairness key, ``workflows.engine.fairness``): kept on the record; a bad one refused naming it."""
    answer = served.http.post(
        "/flows/notified?wait=0&tenant=acme-eu", json={"orderId": "ord-tenant", "token": TOKEN}, headers=KEY
    )
    assert answer.status_code == 201
    assert served.engine.get(answer.json()["id"]).fields["tenant"] == "acme-eu"
    assert answer.json()["tenant"] == "acme-eu"
    assert served.http.get(f"/flows/{answer.json()['id']}", headers=KEY).json()["tenant"] == "acme-eu"
    for bad in ("a%20b", "4111111111111111", "x" * 65):
        refused = served.http.post(
            f"/flows/notified?wait=0&tenant={bad}", json={"orderId": "ord-t2", "token": TOKEN}, headers=KEY
        )
        assert refused.status_code == 422 and refused.json()["field"] == "query.tenant", refused.json()
        assert "4111111111111111" not in refused.text


def test_http_keeps_working_after_errors(served: Served) -> None:
    with httpx.Client(base_url=served.url, headers=KEY) as client:
        for _ in range(3):
            assert client.get("/flows/fnothere").status_code == 404
            assert client.get("/flows").status_code == 200


def test_the_wait_for_the_customer_url_is_bounded(served: Served) -> None:
    began = time.monotonic()
    answer = served.http.post("/flows/notified?wait=0.3", json={"orderId": "ord-slow", "token": TOKEN}, headers=KEY)
    assert answer.status_code == 201
    assert answer.json()["customer_url"] is None and answer.json()["state"] == "ready", "no worker ran the first step"
    assert time.monotonic() - began >= 0.3, "it waited as asked, then answered without the URL"


def test_a_flow_carrying_card_data_may_not_wait_longer_than_its_bound(served: Served) -> None:
    """Issue 37, finding 8: ``run_at=9999-12-31T23:59:59Z`` was accepted for a MOTO, whose card (CVV
    included) is kept until it runs. Bounded (DURAPAY_ENGINE__MAX_CARD_DELAY_SECONDS, a day by default),
    refused naming the field before anything is written; a flow without card data may wait longer."""
    card = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}
    moto = {"order": {"orderId": "ord-later-1", "amount": "1500", "currency": "EUR"}, "card": card}
    for when in ("9999-12-31T23:59:59Z", "in 2d"):
        refused = served.http.post(f"/flows/moto?wait=0&run_at={when}", json=moto, headers=KEY)
        assert refused.status_code == 422, refused.text
        assert refused.json()["field"] == "run_at" and "DURAPAY_ENGINE__MAX_CARD_DELAY_SECONDS" in refused.json()["reason"]
    assert served.engine.list(limit=5) == []
    assert served.runtime.settings.engine.max_card_delay_seconds == 86400.0
    within = served.http.post("/flows/moto?wait=0&run_at=in%2023h", json=moto, headers=KEY)
    assert within.status_code == 201, within.text
    later = served.http.post("/flows/notified?wait=0&run_at=in%2030d", json={"orderId": "ord-later-2", "token": "t"}, headers=KEY)
    assert later.status_code == 201, later.text


def test_a_start_names_its_terminal_an_unknown_one_is_refused_and_the_list_filters_by_it(redis_url: str, key_prefix: str) -> None:
    from durapay.service.runtime import build_runtime
    from durapay.service.server import ApiServer
    from tests.service.conftest import NOTIFIED, service_settings

    built = build_runtime(
        service_settings(key_prefix, terminals={"it": {"api_key": "key-of-it"}}),
        redis_url=redis_url,
        flows={"notified": NOTIFIED},
    )
    built.engine.sender = None
    try:
        with ApiServer(create_app(built)) as server, httpx.Client(base_url=server.url, timeout=10.0, headers=KEY) as http:
            on_it = http.post("/flows/notified?terminal=it", json={"orderId": "ord-term-1", "token": TOKEN})
            assert on_it.status_code == 201 and on_it.json()["terminal"] == "it", on_it.text
            plain = http.post("/flows/notified", json={"orderId": "ord-term-2", "token": TOKEN}).json()
            assert plain["terminal"] == "default"
            refused = http.post("/flows/notified?terminal=fr", json={"orderId": "ord-term-3", "token": TOKEN})
            assert refused.status_code == 422 and refused.json()["field"] == "query.terminal"
            assert refused.json()["reason"] == "unknown terminal 'fr'; known terminals: default, it"
            assert built.engine.flow_for_order("ord-term-3") is None, "nothing written"
            listed = http.get("/flows?terminal=it").json()["flows"]
            assert [(flow["id"], flow["terminal"]) for flow in listed] == [(on_it.json()["id"], "it")]
            assert [flow["id"] for flow in http.get("/flows?terminal=default").json()["flows"]] == [plain["id"]]
            assert http.get("/flows?terminal=fr").json()["field"] == "query.terminal"
            assert http.get(f"/flows/{on_it.json()['id']}").json()["terminal"] == "it"
    finally:
        built.close()
