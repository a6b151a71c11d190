"""Notification parsing and the security-token check."""

from __future__ import annotations

import json

import pytest

from durapay.gateway import (
    InvalidSecurityToken,
    NotificationError,
    OperationResult,
    customer_payment,
    parse_notification,
    verify_security_token,
)

BODY = {
    "eventId": "554ccc00-28fb-4344-a3fa-4bb8d1999bd5",
    "eventTime": "2022-09-01T01:20:00.001Z",
    "securityToken": "2f0ea5059b41414ca3744fe672327d85",
    "operation": {"orderId": "ord-1", "operationId": "42", "operationResult": "AUTHORIZED", "operationAmount": "100"},
}


def test_parse_reads_the_documented_fields() -> None:
    note = parse_notification(json.dumps(BODY).encode())
    assert note.eventId == BODY["eventId"]
    assert note.order_id == "ord-1"
    assert note.operation is not None and note.operation.operationResult is OperationResult.AUTHORIZED


def test_parse_keeps_legacy_and_unknown_fields() -> None:
    note = parse_notification({**BODY, "paymentId": "p-1", "eventType": "X"})
    assert note.model_extra == {"paymentId": "p-1", "eventType": "X"}


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"{not json", "not JSON"), (b"[1, 2]", "JSON object"), (b'{"operation": 5}', "operation")],
)
def test_malformed_bodies_raise_a_notification_error(body: bytes, message: str) -> None:
    with pytest.raises(NotificationError, match=message):
        parse_notification(body)


def test_matching_token_is_accepted() -> None:
    verify_security_token(parse_notification(BODY), ["2f0ea5059b41414ca3744fe672327d85"])


def test_any_of_several_tokens_for_the_order_is_accepted() -> None:
    tokens = ["0" * 32, "2f0ea5059b41414ca3744fe672327d85", "f" * 32]
    verify_security_token(parse_notification(BODY), tokens)


def test_mismatch_is_rejected_without_echoing_kept_tokens() -> None:
    with pytest.raises(InvalidSecurityToken) as caught:
        verify_security_token(parse_notification(BODY), ["a" * 32, "b" * 32])
    assert "a" * 32 not in str(caught.value)
    assert not caught.value.retryable


def test_missing_token_is_rejected() -> None:
    body = {key: value for key, value in BODY.items() if key != "securityToken"}
    with pytest.raises(InvalidSecurityToken, match="no securityToken"):
        verify_security_token(parse_notification(body), ["2f0ea5059b41414ca3744fe672327d85"])


def test_empty_token_never_matches_an_empty_kept_list_or_blank_token() -> None:
    body = {**BODY, "securityToken": ""}
    with pytest.raises(InvalidSecurityToken):
        verify_security_token(parse_notification(body), [""])
    with pytest.raises(InvalidSecurityToken):
        verify_security_token(parse_notification(BODY), [])


def test_a_token_of_another_order_is_rejected() -> None:
    kept = {"ord-1": ["1" * 32], "ord-2": ["2f0ea5059b41414ca3744fe672327d85"]}
    note = parse_notification(BODY)
    with pytest.raises(InvalidSecurityToken):
        verify_security_token(note, kept[note.order_id or ""])


@pytest.mark.parametrize(
    ("operation", "customers"),
    [
        ({"operationType": "CAPTURE", "channel": "ECOMMERCE", "operationResult": "EXECUTED"}, True),  # a page's sale
        ({"operationType": "AUTHORIZATION", "channel": "ECOMMERCE", "operationResult": "AUTHORIZED"}, True),
        ({"operationType": "CAPTURE", "channel": "BACKOFFICE", "operationResult": "EXECUTED"}, False),  # the merchant's
        ({"operationType": "DELAY_CHARGE", "channel": "BACKOFFICE", "operationResult": "EXECUTED"}, False),
        ({"operationType": "NOSHOW", "operationResult": "EXECUTED"}, False),
        ({"operationType": "REFUND", "channel": "BACKOFFICE", "operationResult": "REFUNDED"}, False),
        ({"operationType": "CAPTURE", "operationResult": "EXECUTED", "parentOperationId": "1"}, False),
        ({"operationType": "CAPTURE", "channel": "ECOMMERCE", "operationResult": "DECLINED"}, False),
    ],
)
def test_a_notified_operation_is_a_customers_payment_only_if_the_merchant_did_not_make_it(
    operation: dict[str, str], customers: bool
) -> None:
    """A capture or refund of the customer's payment, or a reservation charge, notified to the page's order,
    is the merchant's own flow's money, never a second payment of the page's flow."""
    body = {"operation": {"operationId": "9", "orderId": "o-1", **operation}}
    assert (customer_payment(body) is not None) is customers
