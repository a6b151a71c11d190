"""What money the gateway holds, and whether a flow shows it: the one rule that the daily reconciliation
(``workflows.reconciliation``) and ``durapay chaos``'s ledger check (``service.chaos.reconcile``) share.

An operation is *money* when it moved funds and is final: a payment (an authorization, a capture or sale,
a reservation's no-show, incremental or delayed charge) ``AUTHORIZED`` or ``EXECUTED``; money given back
(a refund, a void, the cancel of a capture) ``REFUNDED``, ``VOIDED`` or ``EXECUTED``. A card verification
takes nothing. ``PENDING`` is money *in flight*: it may still be taken. A payment whose result later reads
``REFUNDED`` or ``VOIDED`` was given back in full and is judged through its refund.

A flow *shows* an operation (:func:`shown`) when:

* it ``succeeded`` and its outcome names it (``operationIds``, or the ``operation`` it reports);
* a person closed it as a late payment (refunded or kept: ``outcome.latePayments``,
  ``workflows.late_payments``), whatever the flow's end;
* it ``needs_attention`` naming it (its error or outputs), or saying that its call of that operation may
  have taken effect (``unsettled``: money in flight it could not confirm nor deny). The flow names the
  *call* (the catalogue's name); the gateway's operation has a *type*: :data:`MAKES` says which types
  each money call makes, so the question has one answer whether the operation is a row of the
  simulator's ledger (chaos) or of ``GET /operations`` (production), which carry different fields.

An operation found by its order rather than by its own id is either the order's *payment* (one per order:
the gateway refuses a second creation on an order id) or a *post-operation* on it (:func:`post_operation`):
money given back, a reservation charge, or the capture of the order's authorization. ``GET /operations``
names no parent, so a ``CAPTURE`` is told from a sale by the order: a ``CAPTURE`` on an order that holds
an ``AUTHORIZATION`` is that authorization's capture (the gateway captures only an authorization, on its
own order, and leaves it ``AUTHORIZED``). A post-operation is the flow's that made it, never a second
payment of the order's flow.

The same rule, for a payment *reported* to a finished flow, is ``workflows/engine/lua/money.lua``'s
``unaccounted`` (outcome names it, or ``latePayments`` closes it): this module reads the record as that
script leaves it, and never writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from durapay.workflows.engine import FlowRecord, FlowState, inflight

#: Operation types that take the customer's money, and the results that say it was taken.
PAYMENT_TYPES = frozenset({"AUTHORIZATION", "CAPTURE", "NOSHOW", "INCREMENTAL", "DELAY_CHARGE"})
TAKEN = frozenset({"AUTHORIZED", "EXECUTED"})
#: Operation types that give money back, and the results that say they did.
GIVEN_BACK_TYPES = frozenset({"REFUND", "VOID", "CANCEL"})
GIVEN_BACK = frozenset({"REFUNDED", "VOIDED", "EXECUTED"})
#: Results that say the operation moved nothing (the customer's bank or the gateway refused, or it lapsed).
REFUSED = frozenset({"DECLINED", "DENIED_BY_RISK", "THREEDS_FAILED", "3DS_FAILED", "FAILED", "CANCELED", "CANCELLED", "EXPIRED"})
PENDING = "PENDING"
#: Operation types a merchant makes on an order's payment (never the order's payment itself).
CHARGE_TYPES = frozenset({"NOSHOW", "INCREMENTAL", "DELAY_CHARGE"})
#: A payment taken, then given back whole by a later operation (its own result changes): the later
#: operation (a refund, void or cancel, with a flow of its own or none) accounts for it.
GIVEN_BACK_LATER = frozenset({"REFUNDED", "VOIDED", "CANCELED", "CANCELLED"})
#: The operation types each money call of the catalogue that acts on a payment already made (a flow
#: making one names that payment in its input's ``operationId``) makes at the gateway.
POST_CALLS: dict[str, frozenset[str]] = {
    "refund_operation": frozenset({"REFUND", "VOID"}),
    "capture_operation": frozenset({"CAPTURE"}),
    "cancel_operation": frozenset({"CANCEL"}),
    "create_no_show": frozenset({"NOSHOW"}),
    "create_incremental": frozenset({"INCREMENTAL"}),
    "create_delay_charge": frozenset({"DELAY_CHARGE"}),
    "create_reservation_mit_earlier": CHARGE_TYPES,
}
#: The operation types each money call of the catalogue (``unsettled.op``) makes at the gateway; any
#: call not named is a payment of the flow's order (:data:`ORDER_PAYMENT_TYPES`).
MAKES: dict[str, frozenset[str]] = {**POST_CALLS, "card_verification": frozenset({"CARD_VERIFICATION"})}
ORDER_PAYMENT_TYPES = frozenset({"AUTHORIZATION", "CAPTURE"})

Shown = Literal["outcome", "closed", "attention"]


def op_type(op: Mapping[str, Any]) -> str:
    return str(op.get("operationType") or "")


def op_result(op: Mapping[str, Any]) -> str:
    return str(op.get("operationResult") or "")


def is_payment(op: Mapping[str, Any]) -> bool:
    """A payment the gateway took (final)."""
    return op_type(op) in PAYMENT_TYPES and op_result(op) in TAKEN


def is_given_back(op: Mapping[str, Any]) -> bool:
    """A refund, void or cancel of a capture the gateway made (final)."""
    return op_type(op) in GIVEN_BACK_TYPES and op_result(op) in GIVEN_BACK


def is_money(op: Mapping[str, Any]) -> bool:
    return is_payment(op) or is_given_back(op)


def in_flight(op: Mapping[str, Any]) -> bool:
    """Still ``PENDING``: it may yet take (or give back) money."""
    return op_result(op) == PENDING and op_type(op) != "CARD_VERIFICATION"


def makes(call: str | None) -> frozenset[str] | None:
    """The operation types the catalogue's money call ``call`` makes (None: a record that does not say
    which call, any type)."""
    if not call:
        return None
    return MAKES.get(call, ORDER_PAYMENT_TYPES)


def post_operation(op: Mapping[str, Any], order_operations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether ``op``, on an order whose operations the gateway lists as ``order_operations``, is a
    post-operation on the order's payment rather than the payment itself (module docstring)."""
    kind = op_type(op)
    if kind in GIVEN_BACK_TYPES or kind in CHARGE_TYPES:
        return True
    if kind != "CAPTURE":
        return False
    return any(
        op_type(other) == "AUTHORIZATION"
        and str(other.get("operationId")) != str(op.get("operationId"))
        and op_result(other) not in REFUSED
        and op_result(other) != PENDING
        for other in order_operations
    )


def named_operations(record: FlowRecord) -> list[str]:
    """The operation ids a flow's outcome names as its own (empty: a kind that names none)."""
    outcome = record.outcome or {}
    ids = [str(item) for item in outcome.get("operationIds") or [] if item not in (None, "")]
    operation = outcome.get("operation")
    if isinstance(operation, Mapping) and operation.get("operationId") and str(operation["operationId"]) not in ids:
        ids.append(str(operation["operationId"]))
    return ids


def closed_late(record: FlowRecord) -> set[str]:
    """Late payments a person closed on this flow (refunded or kept), by operation id."""
    closed = (record.outcome or {}).get("latePayments") or []
    return {str(item.get("operationId")) for item in closed if isinstance(item, Mapping)}


def names(record: FlowRecord, operation_id: str) -> bool:
    """Whether the flow's error or outputs name ``operation_id`` (a ``needs_attention`` flow says which) as
    a whole id: not as a part of a longer id or number (``12`` is not named by ``"8123"``)."""
    if not operation_id:
        return False
    whole = re.compile(rf"(?<![0-9A-Za-z_]){re.escape(operation_id)}(?![0-9A-Za-z_])")
    return whole.search(json.dumps([record.error, record.outputs], default=str)) is not None


def says_in_flight(record: FlowRecord, op: Mapping[str, Any]) -> bool:
    """Whether the flow says that its call making ``op`` may have taken effect (``unsettled``): the
    operation it was told, or, when it could not read the operation back (it cannot name its id), an
    operation of a type its call makes (:data:`MAKES`); a person's retry reads it."""
    unsettled = inflight.in_flight(record) or {}
    if not unsettled:
        return False
    told = unsettled.get("operationId")
    if told:
        return str(told) == str(op.get("operationId"))
    types = makes(unsettled.get("op"))
    return types is None or op_type(op) in types


def shown(record: FlowRecord, op: Mapping[str, Any]) -> Shown | None:
    """How the flow shows the gateway's operation ``op``, or None when it does not (module docstring)."""
    operation_id = str(op.get("operationId") or "")
    if operation_id in closed_late(record):
        return "closed"
    if record.state is FlowState.SUCCEEDED and operation_id in named_operations(record):
        return "outcome"
    if record.state is FlowState.NEEDS_ATTENTION and (names(record, operation_id) or says_in_flight(record, op)):
        return "attention"
    return None


def amount_of(op: Mapping[str, Any]) -> int | None:
    try:
        return int(str(op.get("operationAmount")))
    except ValueError:
        return None


def differs(recorded: Mapping[str, Any], held: Mapping[str, Any]) -> str:
    """What the flow records of an operation and what the gateway holds disagree on (amount, currency,
    a result that moved nothing), in words; empty when they agree. A payment the flow recorded taken that
    the gateway now shows given back (``GIVEN_BACK_LATER``: a refund, a void, the cancel of a capture made
    it so) agrees: the operation that gave it back is judged on its own."""
    found: list[str] = []
    if recorded.get("operationAmount") is not None and amount_of(recorded) != amount_of(held):
        found.append(f"amount {recorded.get('operationAmount')} recorded, {held.get('operationAmount')} at the gateway")
    if recorded.get("operationCurrency") and recorded.get("operationCurrency") != held.get("operationCurrency"):
        found.append(f"currency {recorded.get('operationCurrency')} recorded, {held.get('operationCurrency')} at the gateway")
    given_back = op_result(recorded) in TAKEN and op_result(held) in GIVEN_BACK_LATER
    if op_result(held) in REFUSED and not given_back:
        found.append(f"the gateway shows it {op_result(held)}")
    return "; ".join(found)
