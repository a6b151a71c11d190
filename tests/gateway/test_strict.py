"""The strict mode of the gateway models (merchant input) beside their lenient mode (gateway answers)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from durapay.gateway import (
    STRICT,
    CaptureType,
    MotoRequest,
    Operation,
    OperationResponse,
    Order,
    Unknown,
    describe_validation_error,
    max_amount,
    validate_strict,
)

CARD = {"pan": "4349940199004549", "expiryDate": "1230"}


def moto(**extra: Any) -> dict[str, Any]:
    return {"order": {"orderId": "o-1", "amount": "1500", "currency": "EUR"}, "card": CARD, **extra}


def refusal(model: Any, data: Any) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        validate_strict(model, data)
    return describe_validation_error(caught.value)


def test_lenient_reading_is_unchanged_for_gateway_answers() -> None:
    answer = OperationResponse.model_validate(
        {"operation": {"operationId": "1", "operationResult": "SOMETHING_NEW", "operationAmount": "0", "newField": 1}}
    )
    assert isinstance(answer.operation.operationResult, Unknown)
    assert answer.operation.model_extra == {"newField": 1}
    assert Order.model_validate({"orderId": "o", "amount": str(10**30), "currency": "EUR"}).amount == 10**30
    assert MotoRequest.model_validate(moto(captureTyp="EXPLICIT")).model_extra == {"captureTyp": "EXPLICIT"}


def test_strict_reading_refuses_unknown_fields_with_the_closest_name() -> None:
    assert refusal(MotoRequest, moto(captureTyp="EXPLICIT")) == ("captureTyp", "unknown field; did you mean `captureType`?")
    field, reason = refusal(MotoRequest, moto(zzz=1))
    assert field == "zzz" and "known fields: captureType, card, order" in reason


def test_strict_reading_refuses_unknown_values_with_the_known_ones() -> None:
    field, reason = refusal(MotoRequest, moto(captureType="EXPLCIT"))
    assert field == "captureType"
    assert reason == "unknown value 'EXPLCIT'; did you mean `EXPLICIT`? (known values: IMPLICIT, EXPLICIT)"
    assert validate_strict(MotoRequest, moto(captureType="EXPLICIT")).captureType is CaptureType.EXPLICIT


@pytest.mark.parametrize(
    ("amount", "currency", "accepted"),
    [(1, "EUR", True), (0, "EUR", False), (max_amount("EUR"), "EUR", True), (max_amount("EUR") + 1, "EUR", False),
     (max_amount("JPY"), "JPY", True), (max_amount("JPY") + 1, "JPY", False), (max_amount("KWD"), "KWD", True),
     (10**30, "EUR", False)],
)  # fmt: skip
def test_amounts_are_positive_and_bounded_in_their_currency(amount: int, currency: str, accepted: bool) -> None:
    data = {"orderId": "o-1", "amount": amount, "currency": currency}
    if accepted:
        assert validate_strict(Order, data).amount == amount
    else:
        assert refusal(Order, data)[0] == "amount"


def test_the_bound_is_ten_digits_of_major_units_and_safe_for_javascript() -> None:
    assert max_amount("EUR") == 999_999_999_999
    assert max_amount("JPY") == 9_999_999_999
    assert max_amount(None) < 2**53


def test_the_context_is_what_selects_the_mode() -> None:
    with pytest.raises(ValidationError):
        MotoRequest.model_validate(moto(captureTyp="x"), context=dict(STRICT))
    Operation.model_validate({"operationId": "1", "brandNew": True}, context={"other": True})


def test_a_currency_in_merchant_input_is_an_iso_code_and_a_typo_gets_a_guess() -> None:
    """``"currency": "XXZ"`` was accepted and sent; ``JYP`` (for JPY) was bounded as a 2-decimal currency."""
    from durapay.workflows.flows import REGISTRY

    model = REGISTRY["moto"].input_model
    card = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}

    def refusal(currency: str) -> tuple[str, str]:
        with pytest.raises(ValidationError) as refused:
            validate_strict(model, {"order": {"orderId": "o-1", "amount": "100", "currency": currency}, "card": card})
        return describe_validation_error(refused.value)

    assert refusal("JYP") == ("order.currency", "unknown currency 'JYP'; did you mean `JPY`? (an ISO 4217 code)")
    assert refusal("XXZ")[0] == "order.currency"
    assert refusal("XAU")[0] == "order.currency", "a precious metal is not a currency a card pays in"
    assert validate_strict(model, {"order": {"orderId": "o-1", "amount": "100", "currency": "eur"}, "card": card})
    lenient = model.model_validate({"order": {"orderId": "o-1", "amount": "100", "currency": "XXZ"}, "card": card})
    assert lenient.order.currency == "XXZ", "a stored record or a gateway answer keeps any code"


def test_an_amount_in_a_part_without_its_own_currency_is_bounded_in_the_orders_currency() -> None:
    """A hosted page's ``paymentSession.amount`` of 90000000000000 with a EUR order was accepted: only the
    widest bound of any currency applied where the part names no currency."""
    from durapay.workflows.flows import REGISTRY

    model = REGISTRY["hpp"].input_model
    session = {"actionType": "PAY", "language": "eng", "resultUrl": "https://shop.example/ok"}

    def read(amount: str) -> Any:
        order = {"orderId": "o-1", "amount": "900", "currency": "EUR"}
        return validate_strict(model, {"order": order, "paymentSession": {**session, "amount": amount}})

    assert read("900")
    with pytest.raises(ValidationError) as refused:
        read("90000000000000")
    field, reason = describe_validation_error(refused.value)
    assert field == "paymentSession.amount" and "EUR" in reason and "extra zeros" in reason
