"""The generic call: headers, Idempotency-Key rules, request validation, error mapping, parsing.

Faults are produced with httpx.MockTransport (a handler raising httpx's own exceptions), which is
exactly what a real dropped connection or timeout looks like to the client.
"""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from durapay.config import GatewaySettings
from durapay.gateway import (
    CATALOGUE,
    BadRequest,
    BinaryResponse,
    Catalogue,
    ConnectionDropped,
    EmptyResponse,
    GatewayClient,
    GatewayTimeout,
    GatewayUnreachable,
    InvalidResponse,
    NotFound,
    OperationResult,
    RateLimited,
    RequestInvalid,
    ServerError,
    Unauthorized,
    Unknown,
    _client,
)

BASE = "https://gateway.test/api/phoenix-0.0/psp/api/v1"
HPP_BODY = {
    "order": {"orderId": "ord-1", "amount": "1500", "currency": "EUR"},
    "paymentSession": {"actionType": "PAY", "amount": "1500", "language": "eng"},
}
CARD = {"pan": "4349940199004549", "expiryDate": "0526"}
OPERATION = {
    "orderId": "ord-1",
    "operationId": "123",
    "operationType": "CAPTURE",
    "operationResult": "EXECUTED",
    "operationAmount": "1500",
    "operationCurrency": "EUR",
}

Handler = Callable[[httpx.Request], httpx.Response]


def make_client(handler: Handler, **settings: Any) -> GatewayClient:
    config = GatewaySettings(base_url=BASE, api_key="key-123", **settings)
    return GatewayClient(config, transport=httpx.MockTransport(handler))


class Recorder:
    def __init__(self, response: httpx.Response | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.response = response or httpx.Response(200, json={"operation": OPERATION})

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.response


def test_every_call_sends_api_key_fresh_correlation_id_and_json() -> None:
    recorder = Recorder(httpx.Response(200, json={"hostedPage": "https://x/p", "securityToken": "t"}))
    with make_client(recorder) as client:
        client.call(Catalogue.create_hpp_order, request=HPP_BODY)
        client.call(Catalogue.create_hpp_order, request=HPP_BODY)
    first, second = recorder.requests
    assert first.url == BASE + "/orders/hpp"
    assert first.headers["X-Api-Key"] == "key-123"
    assert uuid.UUID(first.headers["Correlation-Id"]).version == 4
    assert first.headers["Correlation-Id"] != second.headers["Correlation-Id"]
    assert first.headers["Content-Type"] == "application/json"
    assert json.loads(first.content)["order"]["amount"] == "1500"
    assert "Idempotency-Key" not in first.headers


def test_idempotency_key_is_sent_where_the_operation_takes_one() -> None:
    recorder = Recorder(httpx.Response(200, json={"operationId": "9", "operationTime": "2026-01-01T00:00:00Z"}))
    with make_client(recorder) as client:
        answer = client.call(Catalogue.refund_operation, "123", request={"amount": "100"}, idempotency_key="k" * 63)
    assert recorder.requests[0].headers["Idempotency-Key"] == "k" * 63
    assert recorder.requests[0].url.path.endswith("/operations/123/refunds")
    assert answer.operationId == "9"


@pytest.mark.parametrize(
    ("key", "reason"),
    [("k" * 64, "at most 63"), ("", "empty"), ("has space", "printable ASCII"), (None, "missing")],
)
def test_bad_or_missing_idempotency_key_is_refused_before_sending(key: str | None, reason: str) -> None:
    recorder = Recorder()
    with make_client(recorder) as client, pytest.raises(RequestInvalid) as caught:
        client.call(Catalogue.create_mit_order, request=_mit(), idempotency_key=key)
    assert caught.value.field == "Idempotency-Key"
    assert reason in caught.value.reason
    assert recorder.requests == []
    assert not caught.value.retryable


def test_idempotency_key_on_an_operation_that_takes_none_is_refused() -> None:
    recorder = Recorder()
    with make_client(recorder) as client, pytest.raises(RequestInvalid, match="takes none"):
        client.call(Catalogue.create_hpp_order, request=HPP_BODY, idempotency_key="abc")
    assert recorder.requests == []


def test_operations_taking_idempotency_keys_are_the_documented_seven() -> None:
    keyed = {op.path for op in CATALOGUE if op.idempotency_key}
    assert keyed == {
        "/orders/mit",
        "/operations/{operationId}/refunds",
        "/operations/{operationId}/captures",
        "/incrementals",
        "/delay_charges",
        "/no_shows",
        "/reservation/{reservationId}/mit",
    }


def test_invalid_request_names_the_field_and_sends_nothing() -> None:
    recorder = Recorder()
    bad = {**HPP_BODY, "order": {**HPP_BODY["order"], "amount": "15.00"}}
    with make_client(recorder) as client, pytest.raises(RequestInvalid) as caught:
        client.call(Catalogue.create_hpp_order, request=bad)
    assert caught.value.field == "order.amount"
    assert "digits" in caught.value.reason
    assert recorder.requests == []


def test_path_arguments_are_checked_and_quoted() -> None:
    recorder = Recorder(httpx.Response(200, json={"orderStatus": {"order": {"orderId": "a/b"}}}))
    with make_client(recorder) as client:
        client.call(Catalogue.get_order, "a/b")
        with pytest.raises(RequestInvalid, match="path argument"):
            client.call(Catalogue.get_order)
    assert recorder.requests[0].url.raw_path.endswith(b"/orders/a%2Fb")


def test_get_request_model_becomes_the_query() -> None:
    recorder = Recorder(httpx.Response(200, json={"orders": []}))
    with make_client(recorder) as client:
        client.call(Catalogue.list_orders, request={"maxRecords": 50, "minAmount": 100, "amountType": "ORDER_AMOUNT"})
    params = recorder.requests[0].url.params
    assert params["maxRecords"] == "50"
    assert params["minAmount"] == "100"
    assert params["amountType"] == "ORDER_AMOUNT"
    assert recorder.requests[0].content == b""


def error_response(status: int, **kwargs: Any) -> httpx.Response:
    return httpx.Response(status, **kwargs)


@pytest.mark.parametrize(
    ("response", "error", "retryable", "ambiguous"),
    [
        (
            error_response(400, json={"errors": [{"code": "PS0026", "description": "Invalid amount parameter"}]}),
            BadRequest,
            False,
            False,
        ),
        (error_response(401), Unauthorized, False, False),
        (error_response(404), NotFound, False, False),
        (error_response(429, headers={"Retry-After": "7"}), RateLimited, True, False),
        (error_response(500, json={"errors": [{"code": "PS0000", "description": "Generic"}]}), ServerError, True, True),
        (error_response(503, text="unavailable"), ServerError, True, True),
    ],
)
def test_error_statuses_map_to_the_tree(
    response: httpx.Response, error: type[Exception], retryable: bool, ambiguous: bool
) -> None:
    with make_client(lambda request: response) as client, pytest.raises(error) as caught:
        client.call(Catalogue.get_operation, "123")
    assert caught.value.retryable is retryable  # type: ignore[attr-defined]
    assert caught.value.ambiguous is ambiguous  # type: ignore[attr-defined]
    assert caught.value.status_code == response.status_code  # type: ignore[attr-defined]
    assert caught.value.correlation_id  # type: ignore[attr-defined]


def test_bad_request_keeps_the_gateway_errors_list() -> None:
    body = {"errors": [{"code": "PS0029", "description": "refund too big"}, {"code": "PS0026", "description": "x"}]}
    with make_client(lambda request: httpx.Response(400, json=body)) as client, pytest.raises(BadRequest) as caught:
        client.call(Catalogue.refund_operation, "1", request={}, idempotency_key="key")
    assert caught.value.codes == ("PS0029", "PS0026")
    assert caught.value.to_dict()["errors"][0] == {"code": "PS0029", "description": "refund too big"}


def test_rate_limit_carries_the_retry_after_hint() -> None:
    response = httpx.Response(429, headers={"Retry-After": "7"})
    with make_client(lambda request: response) as client, pytest.raises(RateLimited) as caught:
        client.call(Catalogue.list_payment_methods)
    assert caught.value.retry_after == 7.0


def raising(exc: Exception) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("exc", "error", "ambiguous"),
    [
        (httpx.ConnectError("refused"), GatewayUnreachable, False),
        (httpx.ConnectTimeout("slow connect"), GatewayTimeout, False),
        (httpx.ReadTimeout("no answer"), GatewayTimeout, True),
        (httpx.WriteTimeout("stuck sending"), GatewayTimeout, True),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), ConnectionDropped, True),
        (httpx.ReadError("connection reset"), ConnectionDropped, True),
    ],
)
def test_transport_failures_are_retryable_and_flag_ambiguity(exc: Exception, error: type[Exception], ambiguous: bool) -> None:
    with make_client(raising(exc)) as client, pytest.raises(error) as caught:
        client.call(Catalogue.create_moto_order, request={**HPP_BODY, "card": CARD})
    assert caught.value.retryable is True  # type: ignore[attr-defined]
    assert caught.value.ambiguous is ambiguous  # type: ignore[attr-defined]


def test_unknown_fields_and_values_are_kept_not_passed_off_as_known() -> None:
    body = {"operation": {**OPERATION, "operationResult": "PARTIALLY_SETTLED", "newField": {"x": 1}}, "extraTop": 5}
    with make_client(lambda request: httpx.Response(200, json=body)) as client:
        answer = client.call(Catalogue.create_mit_order, request=_mit(), idempotency_key="key")
    assert isinstance(answer.operation.operationResult, Unknown)
    assert answer.operation.operationResult == "PARTIALLY_SETTLED"
    assert str(answer.operation.operationResult) not in {member.value for member in OperationResult}
    assert answer.operation.model_extra == {"newField": {"x": 1}}
    assert answer.model_extra == {"extraTop": 5}
    assert answer.wire()["operation"]["newField"] == {"x": 1}
    assert answer.wire()["operation"]["operationResult"] == "PARTIALLY_SETTLED"


def test_known_values_parse_to_members() -> None:
    with make_client(lambda request: httpx.Response(200, json=OPERATION)) as client:
        op = client.call(Catalogue.get_operation, "123")
    assert op.operationResult is OperationResult.EXECUTED
    assert op.operationAmount == 1500


def test_a_success_body_that_does_not_parse_is_an_ambiguous_invalid_response() -> None:
    handler = lambda request: httpx.Response(200, text="<html>oops</html>")  # noqa: E731
    with make_client(handler) as client, pytest.raises(InvalidResponse) as caught:
        client.call(Catalogue.get_operation, "123")
    assert caught.value.ambiguous and caught.value.retryable


def test_binary_and_empty_answers() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/pdf"):
            return httpx.Response(200, content=b"%PDF-1.4", headers={"content-type": "application/pdf"})
        return httpx.Response(200, json=True)

    with make_client(handler) as client:
        pdf = client.call(Catalogue.get_agency_condition_pdf, "ac-1")
        empty = client.call(Catalogue.cancel_paybylink, "link-1")
    assert isinstance(pdf, BinaryResponse) and pdf.content == b"%PDF-1.4" and pdf.mediaType == "application/pdf"
    assert isinstance(empty, EmptyResponse)


def test_plugin_name_header_when_configured() -> None:
    recorder = Recorder(httpx.Response(200, json={"paymentMethods": []}))
    with make_client(recorder, plugin_name="durapay-test") as client:
        client.call(Catalogue.list_payment_methods)
    assert recorder.requests[0].headers["x-plugin-name"] == "durapay-test"


def _mit() -> dict[str, Any]:
    return {"order": HPP_BODY["order"], "contractId": "c-1"}


def test_every_gateway_client_of_a_process_shares_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx builds a TLS context per client, parsing the CA bundle each time (50 ms per engine, and the
    tests build engines by the hundred): the gateway clients of a process build none of their own, and
    the one they share verifies certificates as httpx's default does."""
    shared = _client.tls_context()
    made: list[object] = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *args, **kwargs: made.append(args) or real(*args, **kwargs))
    for _ in range(3):
        GatewayClient(GatewaySettings(base_url=BASE, api_key="key-123")).close()
    assert made == [], "a client built a TLS context of its own"
    assert shared.verify_mode is ssl.CERT_REQUIRED and shared.check_hostname
