"""Money: integer minor units in Python, strings of digits on the wire, ISO 4217 exponents.

The gateway sends and takes amounts as strings in minor units ("3545"; "50 EUR is 5000, 50 JPY is 50").
durapay never holds an amount as a float: ``Amount`` fields are ``int`` in Python and serialise to a
string in JSON. :func:`to_minor` and :func:`to_major` convert for people who think in major units.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, PlainSerializer

# Exponents that differ from 2 (ISO 4217; the gateway's currency list has BHD/JOD/KWD = 3 and
# BYR/CLP/ISK/JPY/KRW/VND = 0 among the currencies the gateway admits).
_EXPONENT_0 = frozenset("BIF BYR CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF".split())
_EXPONENT_3 = frozenset("BHD IQD JOD KWD LYD OMR TND".split())
_EXPONENT_4 = frozenset("CLF UYW".split())

#: The currencies the gateway's published reference list admits.
GATEWAY_CURRENCIES = frozenset(
    """
    AED AOA ARS AUD AZN BAM BGN BHD BRL BYN BYR CAD CHF CLP CNY COP CZK DKK EGP EUR GBP GIP HKD HRK HUF INR
    ISK JOD JPY KRW KWD KZT LTL LVL MKD MXN MYR NGN NOK PHP PLN QAR RON RSD RUB SAR SEK SGD THB TRY TWD UAH
    USD VEF VND ZAR
    """.split()
)


def exponent(currency: str) -> int:
    """Number of decimal places of ``currency`` (ISO 4217); 2 unless the table says otherwise."""
    code = currency.upper()
    if code in _EXPONENT_0:
        return 0
    if code in _EXPONENT_3:
        return 3
    if code in _EXPONENT_4:
        return 4
    return 2


def to_minor(major: Decimal | str | int, currency: str) -> int:
    """``Decimal("12.34"), "EUR"`` → ``1234``. Refuses floats and amounts finer than the currency."""
    if isinstance(major, float):
        raise TypeError("amounts are never floats: pass a Decimal or a string")
    try:
        value = Decimal(major)
    except InvalidOperation:
        raise ValueError(f"{major!r} is not a number") from None
    scaled = value.scaleb(exponent(currency))
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{major} {currency} has more than {exponent(currency)} decimal places")
    return int(scaled)


def to_major(minor: int, currency: str) -> Decimal:
    """``1234, "EUR"`` → ``Decimal("12.34")``; ``50, "JPY"`` → ``Decimal("50")``."""
    return Decimal(minor).scaleb(-exponent(currency))


def _parse_minor(value: Any) -> Any:
    """Accept "3545" (the wire form) or 3545; refuse floats, signs, decimals, bools and blanks."""
    if isinstance(value, bool):
        raise ValueError("must be a whole number of minor units, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if not value.isascii() or not value.isdigit():
            raise ValueError(f'must be a string of digits in minor units (e.g. "3545"), got {value!r}')
        return int(value)
    raise ValueError(f"must be a whole number of minor units, got {type(value).__name__}")


def _non_negative(value: int) -> int:
    if value < 0:
        raise ValueError("must not be negative")
    return value


def _parse_currency(value: Any) -> Any:
    if isinstance(value, str) and len(value) == 3 and value.isascii() and value.isalpha():
        return value.upper()
    raise ValueError(f"must be a three-letter ISO 4217 code, got {value!r}")


#: An amount in minor units: ``int`` in Python, a string of digits on the wire.
Amount = Annotated[
    int,
    BeforeValidator(_parse_minor),
    AfterValidator(_non_negative),
    PlainSerializer(str, return_type=str, when_used="json"),
]

#: An ISO 4217 alphabetic code. Codes outside :data:`GATEWAY_CURRENCIES` are kept (the gateway may
#: add currencies); :func:`exponent` falls back to 2 for them.
Currency = Annotated[str, BeforeValidator(_parse_currency)]
