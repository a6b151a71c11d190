"""The gateway writes a moment two ways; the client reads both into one aware datetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from durapay.gateway import GatewayTime, ThreeStepsInitResponse, parse_gateway_time

#: The real test environment's answer to a frictionless card's 3-step init, as a public client records it.
SANDBOX_INIT = {
    "operation": {
        "orderId": "ngGFbpHStk",
        "operationId": "829023675869933329",
        "channel": None,
        "operationType": "AUTHORIZATION",
        "operationResult": "PENDING",
        "operationTime": "2023-11-28 12:41:46.724",
        "paymentMethod": "CARD",
        "paymentCircuit": "VISA",
        "paymentInstrumentInfo": "***4549",
        "paymentEndToEndId": "829023675869933329",
        "cancelledOperationId": None,
        "operationAmount": "100",
        "operationCurrency": "EUR",
        "customerInfo": {"cardHolderName": None, "cardHolderEmail": None},
        "warnings": [],
        "paymentLinkId": None,
        "additionalData": {"maskedPan": "434994******4549", "cardExpiryDate": "202605"},
    },
    "threeDSEnrollmentStatus": "ENROLLED",
    "threeDSAuthRequest": "notneeded",
    "threeDSAuthUrl": "https://stg-ta.example/monetaweb/phoenixstos",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2022-09-01T01:20:00.001Z", datetime(2022, 9, 1, 1, 20, 0, 1000, tzinfo=UTC)),
        ("2022-09-01T01:20:00+02:00", datetime(2022, 8, 31, 23, 20, tzinfo=UTC)),
        ("2023-11-28 12:41:46.724", datetime(2023, 11, 28, 11, 41, 46, 724000, tzinfo=UTC)),  # no offset: UTC+01:00
        ("2023-11-28 12:41:46", datetime(2023, 11, 28, 11, 41, 46, tzinfo=UTC)),
    ],
)
def test_both_forms_parse(text: str, expected: datetime) -> None:
    assert parse_gateway_time(text) == expected
    assert GatewayTime(text).moment == expected


def test_an_unreadable_time_is_kept_as_sent() -> None:
    with pytest.raises(ValueError):
        parse_gateway_time("yesterday")
    value = GatewayTime("yesterday")
    assert value == "yesterday" and value.moment is None


def test_the_test_environment_answer_parses() -> None:
    init = ThreeStepsInitResponse.model_validate(SANDBOX_INIT)
    assert init.threeDSEnrollmentStatus == "ENROLLED" and init.threeDSAuthRequest == "notneeded"
    assert init.operation.operationTime == "2023-11-28 12:41:46.724", "kept as sent"
    assert init.operation.operationTime is not None
    assert init.operation.operationTime.moment == datetime(2023, 11, 28, 12, 41, 46, 724000, tzinfo=timezone(timedelta(hours=1)))
    assert init.model_dump(mode="json")["operation"]["operationTime"] == "2023-11-28 12:41:46.724"
