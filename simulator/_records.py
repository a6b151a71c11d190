"""The records the simulator keeps: orders, operations, links, contracts, build sessions.

Plain dataclasses so that the whole state snapshots to JSON and back (``--state-file``) with
``dataclasses.asdict``. Each record knows how to show itself on the wire, in the gateway's field names;
internal fields (the card number kept for later charges, the money pools) never leave the simulator
except through ``/_sim/`` inspection.

Money pools: every operation that moves money on its own (a payment, a no-show, incremental or delayed
charge) keeps ``authorized``, ``captured``, ``refunded`` and ``voided``; captures, refunds, voids and
cancels point at it through ``parent_id`` and change its pool, never each other's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from durapay.gateway import RESPONSE_CODE_FIELD
from durapay.simulator._cards import card_id, expiry_yyyymm, masked


@dataclass
class OperationRecord:
    operation_id: str
    order_id: str
    operation_type: str
    result: str
    amount: int
    currency: str
    time: str
    channel: str
    created_by: str
    path: str
    idempotency_key: str | None = None
    payment_method: str = "CARD"
    circuit: str | None = None
    pan: str | None = None
    expiry: str | None = None
    response_code: str | None = None
    cancelled_operation_id: str | None = None
    parent_id: str | None = None
    payment_link_id: str | None = None
    capture_explicit: bool = False
    recurrence: dict[str, Any] | None = None
    customer_info: dict[str, Any] | None = None
    # money pool of a payment-like operation
    pool: bool = False
    authorized: int = 0
    captured: int = 0
    refunded: int = 0
    voided: bool = False
    # server-to-server flows: "three_steps" or "svs"; 3DS of three steps
    flow: str = ""
    challenge: bool = False
    threeds_request: str | None = None
    pares: dict[str, bool] = field(default_factory=dict)
    threeds_validated: bool = False
    # every call that created or changed this operation
    steps: list[dict[str, Any]] = field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        """The ``Operation`` object of the gateway's answers."""
        additional: dict[str, Any] = {}
        if self.response_code is not None:
            additional[RESPONSE_CODE_FIELD] = self.response_code
        if self.pan:
            additional["maskedPan"] = masked(self.pan)
            additional["cardId"] = card_id(self.pan)
        if self.expiry:
            additional["cardExpiryDate"] = expiry_yyyymm(self.expiry)
        if self.response_code == "000":
            additional["authorizationCode"] = self.operation_id[-6:]
        body: dict[str, Any] = {
            "orderId": self.order_id,
            "operationId": self.operation_id,
            "channel": self.channel,
            "operationType": self.operation_type,
            "operationResult": self.result,
            "operationTime": self.time,
            "paymentMethod": self.payment_method,
            "paymentCircuit": self.circuit,
            "paymentInstrumentInfo": f"***{self.pan[-4:]}" if self.pan else None,
            "paymentEndToEndId": self.operation_id,
            "cancelledOperationId": self.cancelled_operation_id,
            "operationAmount": str(self.amount),
            "operationCurrency": self.currency,
            "customerInfo": self.customer_info,
            "warnings": [],
            "paymentLinkId": self.payment_link_id,
            "additionalData": additional,
        }
        return body

    def inspect(self) -> dict[str, Any]:
        """What ``/_sim/operations`` shows: who created it, with which key, and where it stands."""
        return {
            "operationId": self.operation_id,
            "orderId": self.order_id,
            "operation": self.created_by,
            "path": self.path,
            "idempotencyKey": self.idempotency_key,
            "operationType": self.operation_type,
            "operationResult": self.result,
            "amount": self.amount,
            "currency": self.currency,
            "responseCode": self.response_code,
            "parentOperationId": self.parent_id,
            "time": self.time,
            "steps": [dict(step) for step in self.steps],
        }


@dataclass
class OrderRecord:
    order_id: str
    order: dict[str, Any]
    amount: int
    currency: str
    created_at: str
    kind: str
    created_by: str
    session: dict[str, Any] | None = None
    session_amount: int = 0
    action_type: str = "PAY"
    capture_explicit: bool = False
    recurrence: dict[str, Any] | None = None
    notification_url: str | None = None
    result_url: str | None = None
    cancel_url: str | None = None
    security_tokens: list[str] = field(default_factory=list)
    operation_ids: list[str] = field(default_factory=list)
    link_ids: list[str] = field(default_factory=list)
    page_open: bool = False
    reservation_id: str | None = None

    def info(self) -> dict[str, Any]:
        """The ``order`` part of ``OrderDetails``."""
        keys = ("orderId", "amount", "currency", "customerId", "description", "customField")
        return {key: self.order[key] for key in keys if self.order.get(key) is not None}


@dataclass
class LinkRecord:
    link_id: str
    order_id: str
    amount: int
    expiration_date: str
    created_at: str
    link: str
    created_by: str
    security_token: str
    status: str = "ACTIVE"
    paid_by_operation_id: str | None = None
    duration_days: int = 1

    def wire(self) -> dict[str, Any]:
        return {
            "linkId": self.link_id,
            "amount": str(self.amount),
            "expirationDate": self.expiration_date,
            "link": self.link,
            "paidByOperationId": self.paid_by_operation_id,
            "status": self.status,
        }


@dataclass
class ContractRecord:
    contract_id: str
    contract_type: str
    customer_id: str | None
    pan: str
    expiry: str
    created_by_operation_id: str
    contract_expiry_date: str | None = None
    contract_frequency: str | None = None
    status: str = "ACTIVE"
    internal: bool = False

    def wire(self, circuit_name: str) -> dict[str, Any]:
        return {
            "contractId": self.contract_id,
            "contractType": self.contract_type,
            "contractExpiryDate": self.contract_expiry_date,
            "contractFrequency": self.contract_frequency,
            "paymentMethod": "CARD",
            "paymentCircuit": circuit_name,
            "paymentInstrumentInfo": f"***{self.pan[-4:]}",
            "status": self.status,
        }


@dataclass
class BuildSessionRecord:
    session_id: str
    order_id: str
    version: str
    state: str
    created_at: str
    expires_at: str
    security_token: str
    merchant_url: str
    root_url: str
    payment_service: str | None = None
    pan: str | None = None
    expiry: str | None = None
    challenge: bool = False
    gdi_done: bool = False
    gdi_approved: bool = True
    operation_id: str | None = None
    finished: bool = False


@dataclass
class PendingRecord:
    """An operation a ``pend`` rule answered ``PENDING``, and how and when it settles."""

    operation_id: str
    operation: str
    final: str
    created_at: str
    settle_after: float | None = None
    #: A post-operation's result when it settles to success (``REFUNDED``, ``VOIDED``, ``EXECUTED``).
    success_result: str | None = None
    #: The type a reservation charge keeps through settling (``NOSHOW``, ``INCREMENTAL``, ``DELAY_CHARGE``).
    kept_type: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "operation": self.operation,
            "final": self.final,
            "createdAt": self.created_at,
            "settleAfter": self.settle_after,
        }
