"""Notifications from the gateway: parse the body, check its security token.

The gateway POSTs ``{eventId, eventTime, securityToken, operation}`` (all optional per its docs) to the
``notificationUrl`` of the creation request. The token is the ``securityToken`` returned by that
creation call; the merchant keeps one or more per order (a retried attempt gets a new one) and accepts
a notification only when its token matches one of them.

The comparison runs in constant time over *every* kept token, so the time taken does not reveal which
token (or how much of one) matched.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from durapay.gateway._base import GatewayModel
from durapay.gateway._client import describe_validation_error
from durapay.gateway._codes import SUCCESS_RESULTS
from durapay.gateway._errors import InvalidSecurityToken, NotificationError
from durapay.gateway._models_common import Operation


class Notification(GatewayModel):
    eventId: str | None = None
    eventTime: str | None = None
    securityToken: str | None = None
    operation: Operation | None = None

    @property
    def order_id(self) -> str | None:
        return self.operation.orderId if self.operation else None


def parse_notification(body: bytes | str | Mapping[str, Any]) -> Notification:
    """Parse a notification body, or raise NotificationError naming what is wrong."""
    if isinstance(body, (bytes, str)):
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise NotificationError(f"body is not JSON: {exc}") from None
    else:
        data = dict(body)
    if not isinstance(data, dict):
        raise NotificationError(f"body must be a JSON object, got {type(data).__name__}")
    try:
        return Notification.model_validate(data)
    except ValidationError as exc:
        field, reason = describe_validation_error(exc)
        raise NotificationError(f"{field}: {reason}") from None


def verify_security_token(notification: Notification, kept_tokens: Iterable[str]) -> None:
    """Accept the notification only if its token equals one kept for the order; else raise.

    Raises InvalidSecurityToken when the token is missing, when no token is kept for the order, or
    when none matches. The message never repeats the kept tokens.
    """
    received = (notification.securityToken or "").encode()
    matched = False
    for token in kept_tokens:
        # compare_digest on every token, no early exit: timing does not depend on which one matched.
        matched |= hmac.compare_digest(received, token.encode())
    if not received:
        raise InvalidSecurityToken("notification carries no securityToken")
    if not matched:
        raise InvalidSecurityToken("securityToken is not valid for this order")


#: The operation fields a record keeps of a reported payment (no card data).
REPORTED_FIELDS = ("operationId", "orderId", "operationType", "operationResult", "operationAmount", "operationCurrency")


#: Operation types of a customer's payment (a sale is a CAPTURE; a card verification takes no money but
#: is the flow's outcome); a refund, void, cancel or reservation charge is the merchant's, never one.
PAYMENT_TYPES = frozenset({"AUTHORIZATION", "CAPTURE", "CARD_VERIFICATION"})


def reported_payment(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The payment a body (``{operation}``: a step's answer, a notification) reports as taken
    (AUTHORIZED or EXECUTED), or None.

    The engine marks such a signal when it stores it, so that whatever the flow's state then (waiting,
    in a step, ended), the money is accounted for: taken as the outcome, or shown to a person.
    """
    operation = body.get("operation")
    if not isinstance(operation, Mapping) or operation.get("operationResult") not in {r.value for r in SUCCESS_RESULTS}:
        return None
    return {key: operation.get(key) for key in REPORTED_FIELDS if operation.get(key) is not None}


def customer_payment(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The payment a *notification* reports a customer made (``reported_payment``), or None for an
    operation the merchant made on the order: a post-operation on its payment (a capture, a refund, a
    void, a cancel) or a reservation charge (NOSHOW, INCREMENTAL, DELAY_CHARGE). Those are the merchant's
    own flows' money, never a second payment of the flow the order is notified to.

    The gateway gives merchant-initiated operations channel ``BACKOFFICE`` (post-operations and MIT), and a
    notification comes only for an order made with a ``notificationUrl``: a page the customer pays
    (``ECOMMERCE``). So on such an order a ``BACKOFFICE`` operation is the merchant's, not the customer's
    (a capture of the customer's authorization is type CAPTURE, as a sale is: its channel tells them
    apart; docs/gateway.md)."""
    paid = reported_payment(body)
    operation = body.get("operation")
    if paid is None or not isinstance(operation, Mapping) or not customer_operation(operation):
        return None
    return paid


def customer_operation(operation: Mapping[str, Any]) -> bool:
    """Whether ``operation`` (as the gateway writes it) is one a customer made paying (a payment type, not
    the merchant's back office on the order: see :func:`customer_payment`). The one rule for "a customer's
    payment on a page", used by notifications and by the reads of a page's order alike."""
    kind = str(operation.get("operationType") or "")
    if kind and kind not in PAYMENT_TYPES:
        return False
    return operation.get("channel") != "BACKOFFICE" and not operation.get("parentOperationId")
