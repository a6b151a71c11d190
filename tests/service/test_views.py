"""What the API and the CLI show of a flow: no card secret, whatever the depth or the flow kind."""

from __future__ import annotations

from durapay.service.views import redact


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
