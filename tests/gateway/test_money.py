"""Amounts: integers in minor units in Python, digit strings on the wire, ISO 4217 exponents."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import ValidationError

from durapay.gateway import Order, exponent, format_money, parse_minor, to_major, to_minor


@pytest.mark.parametrize(
    ("currency", "digits"),
    [("EUR", 2), ("USD", 2), ("JPY", 0), ("KRW", 0), ("KWD", 3), ("BHD", 3), ("JOD", 3), ("eur", 2), ("XYZ", 2)],
)
def test_exponents(currency: str, digits: int) -> None:
    assert exponent(currency) == digits


@pytest.mark.parametrize(
    ("major", "currency", "minor"),
    [
        ("50", "EUR", 5000),
        ("50", "JPY", 50),
        ("12.34", "EUR", 1234),
        (Decimal("1.234"), "KWD", 1234),
        ("0.01", "USD", 1),
        (7, "JPY", 7),
    ],
)
def test_major_and_minor_both_ways(major: str | Decimal | int, currency: str, minor: int) -> None:
    assert to_minor(major, currency) == minor
    assert to_major(minor, currency) == Decimal(str(major))


def test_to_minor_refuses_floats_and_excess_precision() -> None:
    with pytest.raises(TypeError):
        to_minor(1.5, "EUR")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="more than 0 decimal"):
        to_minor("1.5", "JPY")
    with pytest.raises(ValueError, match="more than 2 decimal"):
        to_minor("1.234", "EUR")
    with pytest.raises(ValueError, match="not a number"):
        to_minor("ten", "EUR")


def test_amount_is_int_in_python_and_string_on_the_wire() -> None:
    order = Order.model_validate({"orderId": "o-1", "amount": "3545", "currency": "eur"})
    assert order.amount == 3545 and isinstance(order.amount, int)
    assert order.currency == "EUR"
    assert order.wire() == {"orderId": "o-1", "amount": "3545", "currency": "EUR"}
    assert Order(orderId="o-2", amount=50, currency="JPY").wire()["amount"] == "50"


@pytest.mark.parametrize("bad", ["35.45", "-1", "", " 12", "1e3", 12.5, True, None, "\uff11\uff12"])
def test_bad_amounts_are_refused_with_the_field(bad: object) -> None:
    with pytest.raises(ValidationError) as caught:
        Order.model_validate({"orderId": "o-1", "amount": bad, "currency": "EUR"})
    assert caught.value.errors()[0]["loc"] == ("amount",)


@pytest.mark.parametrize("bad", ["EURO", "E1R", "", 978])
def test_bad_currency_is_refused(bad: object) -> None:
    with pytest.raises(ValidationError) as caught:
        Order.model_validate({"orderId": "o-1", "amount": "1", "currency": bad})
    assert caught.value.errors()[0]["loc"] == ("currency",)


@pytest.mark.parametrize("typed", ["\u0661\u0662", "\u00b2", "\uff11", "1.5", "-5", "", " 12"])
def test_parse_minor_takes_only_the_ascii_digits(typed: str) -> None:
    """The one parser of amounts (the API's Amount fields, the console's forms): int() takes "١٢" as 12."""
    with pytest.raises(ValueError, match="digits 0-9"):
        parse_minor(typed)


def test_parse_minor_refuses_thousands_of_digits_before_converting_them() -> None:
    assert parse_minor("0" * 5000 + "1500") == 1500
    with pytest.raises(ValueError, match="must be at most"):
        parse_minor("9" * 5000)  # int() raises past 4,300 digits


@pytest.mark.parametrize(
    ("minor", "currency", "shown"),
    [
        (9900, "EUR", "99.00 EUR"),
        ("1990", "EUR", "19.90 EUR"),
        (5, "eur", "0.05 EUR"),
        (123456789, "EUR", "1,234,567.89 EUR"),
        ("150000", "JPY", "150,000 JPY"),
        (1234, "KWD", "1.234 KWD"),
        (0, "EUR", "0.00 EUR"),
        ("12.5", "EUR", "12.5 EUR"),  # not a whole number of minor units: shown as it came, never guessed at
        (1500, None, "1500 (minor units)"),
        (None, "EUR", ""),
    ],
)
def test_money_reads_in_major_units_with_the_currency_s_decimals(minor: object, currency: str | None, shown: str) -> None:
    """A 99.00 EUR payment read "9900 EUR" in the console and the CLI."""
    assert format_money(minor, currency) == shown
