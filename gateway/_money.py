"""Money: integer minor units in Python, strings of digits on the wire, ISO 4217 exponents, bounds.

The gateway sends and takes amounts as strings in minor units ("3545"; "50 EUR is 5000, 50 JPY is 50").
durapay never holds an amount as a float: ``Amount`` fields are ``int`` in Python and serialise to a
string in JSON. :func:`to_minor` and :func:`to_major` convert for people who think in major units.

Bounds (merchant input only, see ``gateway._strict``): an amount a merchant sends is positive (a card
verification's order may be 0: :data:`AmountOrZero`) and at most :func:`max_amount` of its currency,
``MAJOR_DIGITS`` digits of major units (9,999,999,999.99 EUR; 9,999,999,999 JPY). No payment comes near
it, a typo of many zeros does, and every bound stays below 2**53, so a JavaScript client reading the
number never rounds it. An answer of the gateway is never refused for its amount.
"""

from __future__ import annotations

import functools
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, GetJsonSchemaHandler, PlainSerializer, ValidationInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from durapay.gateway._strict import UNKNOWN_VALUE, did_you_mean, is_strict

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


#: Digits of major units an amount may have, in any currency (see the module's docstring).
MAJOR_DIGITS = 10
#: The largest exponent of the table above: the bound of an amount whose currency is not known.
_MAX_EXPONENT = 4


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


def max_amount(currency: str | None) -> int:
    """The largest amount (minor units) a merchant may ask for in ``currency``; ``None``: in any currency."""
    digits = MAJOR_DIGITS + (exponent(currency) if currency else _MAX_EXPONENT)
    return int(10**digits) - 1


def check_amount(amount: int, currency: str | None, *, zero: bool = False) -> None:
    """Refuse (ValueError, one line) an amount below 1 (below 0 with ``zero``) or above :func:`max_amount`."""
    least = 0 if zero else 1
    if amount < least:
        raise ValueError(f"must be at least {least} (minor units)" + ("" if zero else "; a payment of nothing is no payment"))
    most = max_amount(currency)
    if amount > most:
        where = f"{to_major(most, currency)} {currency}" if currency else "any currency's bound"
        raise ValueError(f"must be at most {most} minor units ({where}); check for extra zeros")


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


def format_money(minor: Any, currency: str | None) -> str:
    """An amount as a person reads it: minor units shown in major units with the currency's decimals
    (ISO 4217) and its code. ``9900, "EUR"`` → ``"99.00 EUR"``; ``150000, "JPY"`` → ``"150,000 JPY"``;
    ``1234, "KWD"`` → ``"1.234 KWD"``.

    The one formatter of money for people: the console, the CLI's tables and records, schedules. The
    wire and ``--json`` keep minor units. ``minor`` is read as :func:`parse_minor` reads it (the gateway
    sends strings of digits); what it refuses is shown as it came, never guessed at. No currency: the
    number of minor units, said so. None: an empty string."""
    if minor is None or minor == "":
        return ""
    code = str(currency or "").strip().upper()
    try:
        value = parse_minor(minor)
    except ValueError:
        return f"{minor} {code}".strip()
    if not code:
        return f"{value} (minor units)"
    return f"{to_major(value, code):,.{exponent(code)}f} {code}"


#: The most digits an amount may be written with, leading zeros aside: far above any bound (so an answer
#: of the gateway is never refused for its size), far below what ``int()`` refuses (4,300 digits).
_MOST_DIGITS = 40
#: What every refusal of :func:`parse_minor` says it wanted (no echo of the input: it is shown in pages).
_WHOLE = 'must be a whole number of minor units in the digits 0-9 ("1500" is 15.00 EUR)'


def parse_minor(value: Any) -> int:
    """An amount in minor units from what a person or a program sent: ``"3545"`` (the wire form), ``3545``
    or ``"0003545"``; ValueError (one line, without the input) for anything else.

    The one parser of amounts: the API's ``Amount`` fields and the console's forms both use it, so the
    console cannot take what the API refuses. Only the ASCII digits 0-9: ``str.isdigit`` and ``int()``
    also take other scripts' digits ("١٢" is 12 to ``int()``) and ``isdigit`` takes superscripts ("²",
    which ``int()`` then refuses). A string of more than ``_MOST_DIGITS`` significant digits is refused
    before it is converted (``int()`` of 5,000 digits raises). JSON has one number type, so ``3545.0``
    is the integer 3545 to a JSON client (and to JSON Schema's "integer"): it is taken as 3545, exactly
    (the bounds stay below 2**53). ``35.45`` is refused. Bounds are not checked here (:func:`check_amount`)."""
    if isinstance(value, bool):
        raise ValueError(f"{_WHOLE}, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise ValueError(_WHOLE)
        significant = value.lstrip("0") or "0"  # int() counts leading zeros in its 4,300 digits too
        if len(significant) > _MOST_DIGITS:
            raise ValueError(f"must be at most {max_amount(None)} minor units (any currency's bound); check for extra zeros")
        return int(significant)
    raise ValueError(f"{_WHOLE}, not a {type(value).__name__}")


def _bounded(zero: bool) -> Any:
    """The after-validator of an amount: never negative; for merchant input (strict) also bounded."""

    def check(value: int, info: ValidationInfo) -> int:
        if value < 0:
            raise ValueError("must not be negative")
        if is_strict(info):
            check_amount(value, None, zero=zero)
        return value

    return check


#: What the OpenAPI document says of every amount. A JSON schema cannot make one field's maximum depend on
#: another's value (the currency), so ``maximum`` is the widest bound and this states each currency's.
AMOUNT_BOUNDS = (
    f"minor units (1500 = 15.00 EUR), in the digits 0-9; at most {MAJOR_DIGITS} digits of major units of the"
    f" order's currency: {max_amount('EUR')} for a currency of 2 decimals (EUR, USD),"
    f" {max_amount('JPY')} for one of none (JPY, KRW), {max_amount('KWD')} for one of 3 (BHD, JOD, KWD),"
    f" {max_amount(None)} for one of 4 (the schema's maximum); above its currency's bound an amount is refused"
    " (422, 'check for extra zeros')"
)


def _amount_schema(zero: bool) -> dict[str, Any]:
    """What the API documents: an integer or a string of digits, in the bounds of merchant input."""
    most = max_amount(None)
    digits = len(str(most))
    pattern = f"^0*[0-9]{{1,{digits}}}$" if zero else f"^0*[1-9][0-9]{{0,{digits - 1}}}$"
    return {
        "anyOf": [{"type": "integer", "minimum": 0 if zero else 1, "maximum": most}, {"type": "string", "pattern": pattern}],
        "description": AMOUNT_BOUNDS,
    }


#: The ISO 4217 codes a payment can be made in (the list of 2024, without the funds, precious metals,
#: testing and "no currency" codes). Merchant input must name one of them: a typo such as ``JYP`` would
#: otherwise be sent, and bounded as a 2-decimal currency. Gateway answers keep any code.
ISO_CURRENCIES = frozenset(
    """
    AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN BWP BYN BZD
    CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD
    GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT
    LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR
    NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP
    STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD UYU UZS VES VND VUV WST XAF XCD XCG
    XOF XPF YER ZAR ZMW ZWG
    """.split()
)


def _parse_currency(value: Any) -> Any:
    if isinstance(value, str) and len(value) == 3 and value.isascii() and value.isalpha():
        return value.upper()
    raise ValueError(f"must be a three-letter ISO 4217 code, got {value!r}")


def _known_currency(value: str, info: ValidationInfo) -> str:
    """Merchant input (strict) names a currency payments are made in; gateway answers keep any code."""
    if is_strict(info) and value not in ISO_CURRENCIES:
        # Swapped letters are the usual typo of a code (JYP): an anagram is the better guess.
        swapped = sorted(code for code in ISO_CURRENCIES if sorted(code) == sorted(value))
        hint = f"; did you mean `{swapped[0]}`?" if swapped else did_you_mean(value, ISO_CURRENCIES)
        reason = f"unknown currency {value!r}{hint} (an ISO 4217 code)"
        raise PydanticCustomError(UNKNOWN_VALUE, "{reason}", {"reason": reason})
    return value


class _Bounds:
    """Field metadata: the after-validator that sees the validation context (strict or not)."""

    def __init__(self, zero: bool) -> None:
        self.zero = zero

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.with_info_after_validator_function(_bounded(self.zero), handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        if handler.mode == "validation":
            return _amount_schema(self.zero)
        return {"type": "string", "pattern": "^[0-9]+$", "description": "minor units"}


#: An amount in minor units: ``int`` in Python, a string of digits on the wire. Merchant input: 1 or more.
Amount = Annotated[
    int,
    BeforeValidator(parse_minor),
    _Bounds(zero=False),
    PlainSerializer(str, return_type=str, when_used="json"),
]
#: The same where 0 has a meaning (a card verification's order: "without any charge").
AmountOrZero = Annotated[
    int,
    BeforeValidator(parse_minor),
    _Bounds(zero=True),
    PlainSerializer(str, return_type=str, when_used="json"),
]


class _CurrencySchema:
    """What the API documents: in requests, one of :data:`ISO_CURRENCIES` (what strict reading accepts,
    upper-cased first); in answers, any three letters (the gateway's codes are kept)."""

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        if handler.mode == "validation":
            return {"type": "string", "enum": sorted(ISO_CURRENCIES), "description": "ISO 4217 alphabetic code"}
        return {"type": "string", "pattern": "^[A-Za-z]{3}$", "description": "ISO 4217 alphabetic code"}


#: An ISO 4217 alphabetic code. Merchant input must name one of :data:`ISO_CURRENCIES`; in gateway
#: answers, codes outside :data:`GATEWAY_CURRENCIES` are kept (the gateway may add currencies), and
#: :func:`exponent` falls back to 2 for them.
Currency = Annotated[
    str,
    BeforeValidator(_parse_currency),
    AfterValidator(_known_currency),
    _CurrencySchema(),
]


@functools.cache
def bounded_amounts(model: type[Any]) -> tuple[tuple[str, bool], ...]:
    """The (field name, zero allowed) of ``model``'s amount fields, for the check in its currency (once
    per model class: the check runs for every amount read)."""
    found = []
    for name, info in model.model_fields.items():
        bounds = [item for item in info.metadata if isinstance(item, _Bounds)]
        if bounds:
            found.append((name, bounds[0].zero))
    return tuple(found)
