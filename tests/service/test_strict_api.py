"""Issue 10, part A, over real HTTP: what a merchant sends by mistake is refused before anything is
written or sent, with the field, the reason and the closest known name; the key is checked first,
then the size, then the body is parsed; every error has the documented shape; ``/docs`` loads nothing
from another host."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from durapay.workflows.engine.states import FlowState
from tests.service.conftest import API_KEY, Served, waiting_flow

KEY = {"X-Api-Key": API_KEY}
CARD = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}


def moto(order_id: str, **extra: Any) -> dict[str, Any]:
    return {"order": {"orderId": order_id, "amount": "1500", "currency": "EUR"}, "card": CARD, **extra}


def flows_written(served: Served) -> int:
    return len(served.engine.list(limit=1000))


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (moto("typo-1", captureTyp="EXPLICIT"), "captureTyp", "did you mean `captureType`?"),
        (moto("typo-2", captureType="EXPLCIT"), "captureType", "did you mean `EXPLICIT`?"),
        ({**moto("typo-3"), "order": {"orderId": "typo-3", "amount": "1500", "currency": "EUR", "ammount": "1"}},
         "order.ammount", "did you mean `amount`?"),
        ({**moto("typo-4"), "card": {**CARD, "cvc": "123"}}, "card.cvc", "unknown field"),
        ({**moto("zero"), "order": {"orderId": "zero", "amount": 0, "currency": "EUR"}}, "order.amount", "at least 1"),
        ({**moto("huge"), "order": {"orderId": "huge", "amount": str(10**30), "currency": "EUR"}}, "order.amount", "at most"),
        ({**moto("yen"), "order": {"orderId": "yen", "amount": 10**11, "currency": "JPY"}}, "order.amount", "JPY"),
        ({**moto("blank"), "order": {"orderId": "blank", "amount": "100", "currency": ""}}, "order.currency", "three-letter"),
    ],
)  # fmt: skip
def test_a_misspelt_or_out_of_range_input_is_refused_before_anything_is_written(
    served: Served, body: dict[str, Any], field: str, reason: str
) -> None:
    before = flows_written(served)
    answer = served.http.post("/flows/moto?wait=0", json=body, headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_input"
    assert answer.json()["field"] == field
    assert reason in answer.json()["reason"]
    assert flows_written(served) == before


def test_a_correct_input_still_starts_and_a_card_verification_may_be_zero(served: Served) -> None:
    assert served.http.post("/flows/moto?wait=0", json=moto("ok-1", captureType="EXPLICIT"), headers=KEY).status_code == 201
    verify = {**moto("ok-2"), "order": {"orderId": "ok-2", "amount": "0", "currency": "EUR"}}
    assert served.http.post("/flows/card_verification?wait=0", json=verify, headers=KEY).status_code == 201


def test_pass_through_sends_an_unmodelled_field_and_refuses_to_override_a_modelled_one(served: Served) -> None:
    started = served.http.post("/flows/moto?wait=0", json=moto("pt-1", passThrough={"newField": "x"}), headers=KEY)
    assert started.status_code == 201, started.text
    record = served.engine.get(started.json()["id"])
    model = served.engine.registry["moto"].input_model.model_validate(served.engine.cards.open(record.id, record.input))
    assert model.wire()["newField"] == "x" and "passThrough" not in model.wire()
    clash = served.http.post("/flows/moto?wait=0", json=moto("pt-2", passThrough={"captureType": "IMPLICIT"}), headers=KEY)
    assert clash.status_code == 422
    assert clash.json()["field"] == "passThrough.captureType"


def test_a_schedule_input_typo_gets_the_closest_name(served: Served) -> None:
    body = {"contractId": "c-1", "amount": 1500, "currency": "EUR", "description": "gym", "rule": {"every": "month", "day": 1},
            "start": "2030-01-01", "timezon": "Europe/Rome"}  # fmt: skip
    answer = served.http.post("/schedules", json=body, headers=KEY)
    assert answer.status_code == 422, answer.text
    assert (answer.json()["field"], "did you mean `timezone`?" in answer.json()["reason"]) == ("timezon", True)


# -- item 3: the key first, then the size, then parsing --------------------------------------------


def test_without_a_key_malformed_json_is_401_not_422(served: Served) -> None:
    for path in ("/flows/moto", "/schedules", "/flows/f1/cancel", "/flows/f1/signals/3ds_result"):
        answer = served.http.post(path, content=b"{oops", headers={"content-type": "application/json"})
        assert answer.status_code == 401, (path, answer.text)
        assert answer.json() == {"error": "unauthorized", "reason": "missing or wrong X-Api-Key"}


def test_a_body_above_the_limit_is_413_declared_or_streamed(served: Served) -> None:
    limit = served.runtime.settings.api.max_body_bytes
    junk = moto("big", passThrough={"junk": "x" * limit})
    declared = served.http.post("/flows/moto", json=junk, headers=KEY)
    assert declared.status_code == 413
    assert declared.json() == {"error": "too_large", "reason": f"body larger than {limit} bytes"}

    def chunks() -> Iterator[bytes]:
        text = json.dumps(junk).encode()
        for start in range(0, len(text), 8192):
            yield text[start : start + 8192]

    streamed = served.http.post("/flows/moto", content=chunks(), headers=KEY | {"content-type": "application/json"})
    assert streamed.status_code == 413
    assert flows_written(served) == 0


def test_the_receiver_keeps_its_own_limit_and_needs_no_key(served: Served) -> None:
    answer = served.http.post("/notifications", content=b"x" * 5000)
    assert answer.status_code == 413
    assert answer.json()["outcome"] == "KO"


def test_deeply_nested_json_gets_the_documented_error_shape(served: Served) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    answer = served.http.post("/flows/moto", content=deep.encode(), headers=KEY | {"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_input"
    assert answer.json()["field"] == "(body)"


# -- items 4 and 6: signals ------------------------------------------------------------------------


def test_a_signal_payload_is_checked_before_it_is_stored(served: Served) -> None:
    record = served.engine.start("three_steps", moto("sig-1"))
    bad = served.http.post(f"/flows/{record.id}/signals/3ds_result", json={"foo": 1}, headers=KEY)
    assert bad.status_code == 422, bad.text
    known = "unknown field; known fields: PaRes, paymentId, threeDSAuthResponse"
    assert (bad.json()["field"], bad.json()["reason"]) == ("foo", known)
    empty = served.http.post(f"/flows/{record.id}/signals/3ds_result", json={"threeDSAuthResponse": ""}, headers=KEY)
    assert (empty.status_code, empty.json()["field"]) == (422, "threeDSAuthResponse")
    assert served.engine.get(record.id).signals == [], "nothing was stored"
    good = served.http.post(f"/flows/{record.id}/signals/3ds_result", json={"threeDSAuthResponse": "abc"}, headers=KEY)
    assert good.status_code == 200 and good.json()["result"] == "stored"


def test_a_signal_the_flow_kind_does_not_take_is_refused_with_the_names_it_takes(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "sig-2", "00112233445566778899aabbccddeeff")
    answer = served.http.post(f"/flows/{flow_id}/signals/3ds_result", json={"threeDSAuthResponse": "x"}, headers=KEY)
    assert answer.status_code == 422
    assert answer.json()["field"] == "name"
    assert "it takes: paid" in answer.json()["reason"]
    unknown = served.http.post(f"/flows/{flow_id}/signals/3ds_reslt", json={}, headers=KEY)
    assert unknown.status_code == 404
    assert "did you mean `3ds_result`?" in unknown.json()["reason"]


def test_nobody_but_the_receiver_delivers_a_notification(served: Served) -> None:
    flow_id = waiting_flow(served.engine, "sig-3", "00112233445566778899aabbccddeeff")
    paid = {"operation": {"orderId": "sig-3", "operationId": "op-1", "operationResult": "EXECUTED"}}
    for by in ("api", "cli", "python"):
        with pytest.raises(ValueError, match="only through the notification receiver"):
            served.engine.signal(flow_id, "notification", paid, by=by)
    assert served.engine.get(flow_id).state is FlowState.WAITING
    assert served.engine.get(flow_id).signals == []


# -- item 5: run_at --------------------------------------------------------------------------------


@pytest.mark.parametrize("run_at", ["2h", "1", "2020-01-01T00:00:00Z", "2030-01-01T00:00:00", "nan", "inf"])
def test_run_at_in_the_past_or_ambiguous_is_refused(served: Served, run_at: str) -> None:
    answer = served.http.post("/flows/moto", params={"run_at": run_at}, json=moto("late"), headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "query.run_at"
    assert "future" in answer.json()["reason"] and "age" not in answer.json()["reason"]
    assert flows_written(served) == 0


def test_run_at_as_a_delay_sleeps_until_then(served: Served) -> None:
    answer = served.http.post("/flows/moto", params={"run_at": "in 2h"}, json=moto("later"), headers=KEY)
    assert answer.status_code == 201, answer.text
    record = served.engine.get(answer.json()["id"])
    assert record.state is FlowState.SLEEPING
    assert record.due is not None and record.due > served.engine.clock.now() + 7000


@pytest.mark.parametrize(
    ("method", "path", "params", "field", "meant"),
    [
        ("POST", "/flows/moto", {"runat": "+2h"}, "query.runat", "run_at"),
        ("GET", "/flows", {"stat": "failed"}, "query.stat", "state"),
        ("GET", "/schedules", {"limt": "2"}, "query.limt", "limit"),
    ],
)
def test_an_unknown_query_parameter_is_refused_not_ignored(
    served: Served, method: str, path: str, params: dict[str, str], field: str, meant: str
) -> None:
    """``?runat=+2h`` (``run_at`` misspelt) was ignored: the payment ran at once; ``?stat=failed`` listed
    every flow as if filtered."""
    body = moto("typo") if method == "POST" else None
    answer = served.http.request(method, path, params=params, json=body, headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert f"did you mean `{meant}`?" in answer.json()["reason"]
    assert flows_written(served) == 0


def test_an_unknown_value_of_a_query_parameter_gets_the_closest_known_one(served: Served) -> None:
    answer = served.http.get("/flows", params={"state": "faild"}, headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "query.state"
    assert "did you mean `failed`?" in answer.json()["reason"]


# -- item 8: /docs offline, the security schemes ---------------------------------------------------


def test_docs_load_nothing_from_another_host(served: Served) -> None:
    page = served.http.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text) + re.findall(r"url: '([^']+)'", page.text)
    assert sources, page.text
    assert all(source.startswith("/") for source in sources), sources
    assert "validatorUrl" in page.text
    for source in sources:
        assert served.http.get(source).status_code == 200, source


def test_docs_may_not_be_framed_by_another_site(served: Served) -> None:
    """Issue 37, finding 8: ``/docs`` (whose Authorize form takes an API key) had no frame-blocking
    header, while every console page has one."""
    for path in ("/docs", "/docs/oauth2-redirect"):
        page = served.http.get(path)
        assert page.status_code == 200
        assert page.headers["X-Frame-Options"] == "DENY", path
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"], path


def test_the_document_declares_both_security_schemes_and_typed_answers(served: Served) -> None:
    spec = served.http.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["APIKeyHeader"]["name"] == "X-Api-Key"
    assert schemes["HTTPBearer"]["scheme"] == "bearer"
    started = spec["paths"]["/flows/moto"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert started == {"$ref": "#/components/schemas/FlowView"}
    assert {"401", "413", "422"} <= set(spec["paths"]["/flows/moto"]["post"]["responses"])


def test_a_method_the_path_does_not_take_is_405_listing_what_it_takes(served: Served) -> None:
    answer = served.http.request("OPTIONS", "/flows/moto", headers=KEY)
    assert answer.status_code == 405
    assert answer.json()["error"] == "method_not_allowed"
    assert "POST" in answer.headers["allow"].split(", ")
    history = served.http.delete("/flows/f1/history", headers=KEY)
    assert (history.status_code, history.headers["allow"]) == (405, "GET")
    assert served.http.request("OPTIONS", "/flows/moto", headers=KEY).headers["allow"] == "POST", "the concrete path's"
    assert served.http.put("/flows/f1", headers=KEY).headers["allow"] == "GET", "not the hidden POST /flows/{kind}"
    assert served.http.put("/schedules", headers=KEY).headers["allow"] == "GET, POST", "both routes of the path"
