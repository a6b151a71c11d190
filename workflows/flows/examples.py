"""A valid example input for every flow kind, as ``stripe trigger``'s fixtures are: what ``durapay flows
kinds KIND --example`` prints, what the console's Kinds page shows and what the OpenAPI document gives
as each ``POST /flows/{kind}``'s example.

Every example starts as it is against ``durapay dev`` (the simulator's published test cards, its
amounts, a fresh order id each time: a second start of the same example is a second flow, never the
same order id refused as taken). The payments succeed or wait for their customer; a kind that acts on an
earlier object (a refund on a payment's operation, a MIT on a contract, a link's cancel) names one that
does not exist, so its flow fails at the gateway, and :attr:`Example.needs` says which field to replace
and where to read its value. ``tests/workflows/flows/test_examples.py`` checks that every kind has one
and that each is the kind's valid input; ``tests/test_snippets.py`` starts them all against dev.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

#: The published card the simulator approves without a challenge (docs/simulator.md, Test cards).
APPROVING_CARD = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}
AMOUNT = "2500"
CURRENCY = "EUR"


@dataclass(frozen=True)
class Example:
    """An example input and, for a kind acting on an earlier object, which field to replace and how."""

    data: dict[str, Any]
    needs: str = ""


def _order(tag: str, amount: str = AMOUNT) -> dict[str, Any]:
    return {"orderId": tag, "amount": amount, "currency": CURRENCY, "description": "durapay example"}


def _session(amount: str = AMOUNT) -> dict[str, Any]:
    return {
        "actionType": "PAY",
        "amount": amount,
        "language": "eng",
        "resultUrl": "https://shop.example/done",
        "cancelUrl": "https://shop.example/cancelled",
    }


def _in_days(today: datetime, days: int) -> str:
    return (today + timedelta(days=days)).date().isoformat()


def _setup(tag: str) -> dict[str, Any]:
    text = "UGF5bWVudCBkdWUgYXQgY2hlY2staW4u"  # base64 of "Payment due at check-in."
    return {
        "service": {"serviceName": "DISPUTELESS", "terminalId": "T-1", "enabled": "Y"},
        "termsAndConditions": [{"name": f"{tag}-terms", "termsAndConditions": [{"language": "eng", "text": text}]}],
        "structures": [{"structureId": f"{tag}-hotel", "structureName": "Hotel Aurora", "status": "ACTIVE"}],
    }


_PAYMENT = "operationId: a succeeded payment's (durapay flows show ID: its operation), "
_RESERVATION = "reservationId and originalOperationId: a paid reservation flow's (durapay flows show ID)"
_LINK = "linkId: a waiting paybylink flow's (durapay flows show ID: outputs.create.paymentLink.linkId)"

#: Each kind's example, made from a fresh tag (an order id of 11 characters: the gateway takes 18) and today.
MAKERS: dict[str, Callable[[str, datetime], Example]] = {
    "hpp": lambda tag, today: Example({"order": _order(tag), "paymentSession": _session()}),
    "paybylink": lambda tag, today: Example(
        {"order": _order(tag), "paymentSession": _session(), "expirationDate": _in_days(today, 7)}
    ),
    "paybylink_cancel": lambda tag, today: Example({"linkId": f"{tag}-link"}, _LINK),
    "paybylink_renew": lambda tag, today: Example({"linkId": f"{tag}-link", "expirationDate": _in_days(today, 14)}, _LINK),
    "paybylink_modify": lambda tag, today: Example({"linkId": f"{tag}-link", "expirationDate": _in_days(today, 10)}, _LINK),
    "three_steps": lambda tag, today: Example({"order": _order(tag), "card": dict(APPROVING_CARD)}),
    "svs": lambda tag, today: Example({"order": _order(tag), "card": dict(APPROVING_CARD)}),
    "build": lambda tag, today: Example(
        {"merchantUrl": "https://shop.example", "order": _order(tag), "paymentSession": _session()}
    ),
    "build_cancel": lambda tag, today: Example(
        {"sessionId": f"{tag}-session"}, "sessionId: a waiting build flow's (durapay flows show ID: outputs.create.sessionId)"
    ),
    "moto": lambda tag, today: Example({"order": _order(tag), "card": dict(APPROVING_CARD)}),
    "card_verification": lambda tag, today: Example({"order": _order(tag, "0"), "card": dict(APPROVING_CARD)}),
    "wallet": lambda tag, today: Example({"order": _order(tag), "walletPaymentData": {"pan": APPROVING_CARD["pan"]}}),
    "mit": lambda tag, today: Example(
        {"order": _order(tag), "contractId": f"{tag}-ct"},
        "contractId: a contract made by a payment with recurrence CONTRACT_CREATION (three_steps, hpp)",
    ),
    "refund": lambda tag, today: Example(
        {"operationId": f"{tag}-op", "amount": 1000, "currency": CURRENCY}, _PAYMENT + "or its page's Refund"
    ),
    "capture": lambda tag, today: Example(
        {"operationId": f"{tag}-op", "amount": 1000, "currency": CURRENCY},
        "operationId: an authorization's (a payment with captureType EXPLICIT: durapay flows show ID), or its page's Capture",
    ),
    "cancel_capture": lambda tag, today: Example(
        {"operationId": f"{tag}-op"}, "operationId: a capture flow's operation, the same day (durapay flows show ID)"
    ),
    "deactivate_contract": lambda tag, today: Example(
        {"contractId": f"{tag}-ct"}, "contractId: a contract made by a payment with recurrence CONTRACT_CREATION"
    ),
    "reservation_setup": lambda tag, today: Example(_setup(tag)),
    "reservation": lambda tag, today: Example(
        {
            "reservation": {
                "reservationId": f"{tag}-res",
                "amount": "20000",
                "currency": CURRENCY,
                "deposit": "5000",
                "reservationType": "PREPAID_REFUNDABLE",
                "structureId": f"{tag}-hotel",
                "customerName": "Ada",
                "customerSurname": "Lovelace",
            }
        },
        "structureId (and termsAndConditionsIds): a succeeded reservation_setup flow's outcome",
    ),
    "no_show": lambda tag, today: Example(
        {"reservationId": f"{tag}-res", "amount": 5000, "currency": CURRENCY, "description": "no-show"}, _RESERVATION
    ),
    "incremental": lambda tag, today: Example(
        {"reservationId": f"{tag}-res", "amount": 3000, "currency": CURRENCY, "description": "room service"}, _RESERVATION
    ),
    "delay_charge": lambda tag, today: Example(
        {
            "reservationId": f"{tag}-res",
            "amount": 1200,
            "currency": CURRENCY,
            "description": "minibar",
            "runAt": (today + timedelta(days=1)).replace(microsecond=0).isoformat(),
        },
        _RESERVATION + "; runAt: after its check-out",
    ),
}


def fresh_tag() -> str:
    """A new example order id: ``ex`` and 9 hex digits (letters among them: never 13 digits in a row, which
    durapay would refuse as looking like a card number)."""
    return "ex" + secrets.token_hex(5)[:9]


def example(kind: str, *, tag: str | None = None, today: datetime | None = None) -> Example:
    """``kind``'s example (KeyError for a kind without one: a test keeps that from happening), with a fresh
    order id unless ``tag`` is given (the OpenAPI document's fixed one)."""
    return MAKERS[kind](tag or fresh_tag(), today or datetime.now(UTC))
