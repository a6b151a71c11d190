"""What the API and the CLI show of a flow: no card secret, whatever the depth or the flow kind."""

from __future__ import annotations

import pytest

from durapay.service.views import money_text, redact, rule_text


def test_card_secrets_are_masked_at_any_depth() -> None:
    shown = redact(
        {
            "input": {
                "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
                "walletPaymentData": {"pan": "5186151650005008", "cryptogram": "AgAAAA"},
                "orders": [{"cardNumber": "5186151650005008", "securityToken": "tok"}],
            },
            "outputs": {"init": {"threeDSAuthResponse": "pares", "amount": "1500"}},
        }
    )
    assert shown["input"]["card"] == {"pan": "434994******4549", "expiryDate": "***", "cvv": "***"}
    assert shown["input"]["walletPaymentData"] == "***"
    assert shown["input"]["orders"] == [{"cardNumber": "518615******5008", "securityToken": "***"}]
    assert shown["outputs"]["init"] == {"threeDSAuthResponse": "***", "amount": "1500"}


def test_a_value_too_short_for_a_card_number_is_hidden_whole() -> None:
    assert redact({"pan": "1234"}) == {"pan": "***"}
    assert redact({"cvv": ""}) == {"cvv": ""}, "an empty value reveals nothing"


def test_what_a_flow_is_for_its_request_then_the_gateway_s_operation() -> None:
    """Issue 41 finding 4: the money at stake from the start (the request), then the outcome's when it
    differs; the outcome's alone when the request names no amount (a refund of the whole)."""
    paid = {"operation": {"operationId": "1", "operationAmount": "990", "operationCurrency": "EUR"}}
    assert money_text(paid, {"order": {"amount": "1500", "currency": "EUR"}}) == "15.00 EUR \u2192 9.90 EUR"
    assert money_text(paid, {"order": {"amount": "990", "currency": "EUR"}}) == "9.90 EUR"
    assert money_text(paid, {"operationId": "1"}) == "9.90 EUR"
    assert money_text({}, {"order": {"amount": "1500", "currency": "EUR"}}) == "15.00 EUR"
    assert money_text(None, {"operationId": "1", "amount": 250, "currency": "JPY"}) == "250 JPY"
    assert money_text(None, {"reservation": {"amount": "12345", "currency": "KWD"}}) == "12.345 KWD"
    assert money_text(None, {"linkId": "l-1"}) == ""


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ({"every": "days", "interval": 1}, "every day"),
        ({"every": "days", "interval": 30}, "every 30 days"),
        ({"every": "month", "day": 31}, "monthly on day 31"),
        ({"every": "week", "weekday": "friday"}, "weekly on friday"),
        ({"cron": "0 9 * * 1-5"}, "cron 0 9 * * 1-5"),
        ({"every": "fortnight"}, '{"every": "fortnight"}'),
    ],
)
def test_a_schedule_s_rule_in_words(rule: dict[str, object], words: str) -> None:
    assert rule_text(rule) == words
