"""What a contract lets the merchant charge: the rule of ``POST /orders/mit``, in one place.

A contract is made by an approved first payment with ``recurrence.action = CONTRACT_CREATION``; its
``contractType`` says who may use it afterwards (docs/gateway.md, "MIT contracts", with the sources):

- ``CIT``: the card is kept so that the cardholder pays faster; the merchant cannot debit it directly
  (each later payment needs the cardholder's authentication).
- ``MIT_SCHEDULED``: the merchant charges "with a defined frequency"; ``contractFrequency`` is a number of
  days, and the number of days between payments must be at least that.
- ``MIT_UNSCHEDULED``: the merchant charges when it needs to.

Why the simulator enforces this rather than charging whatever it is asked: a lenient simulator lets
durapay's schedules pass their tests with charges the live gateway may refuse (a monthly rule on the
31st is 28 days from January 31 to February 28; a dunning retry the day after a decline moves every
later date of the contract).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

from durapay.gateway import ContractType, OperationResult, OperationType, Recurrence, parse_gateway_time
from durapay.simulator._clock import gateway_day
from durapay.simulator._protocol import SimError
from durapay.simulator._records import ContractRecord, OperationRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

#: Results of a charge that make it a payment of its contract: approved, whatever happened to it later
#: (captured, refunded or voided). A charge held ``PENDING`` counts as well while it is held.
PAID = frozenset({OperationResult.AUTHORIZED.value, OperationResult.EXECUTED.value, OperationResult.VOIDED.value})
FREQUENCY = re.compile(r"[0-9]{1,4}")


def check_contract_terms(recurrence: Recurrence | None, field: str) -> None:
    """A ``contractFrequency``, when given, is a number of days: 1 to 4 ASCII digits, at least 1 (PS0026
    naming ``<field>.contractFrequency``). It binds only an ``MIT_SCHEDULED`` contract."""
    text = recurrence.contractFrequency if recurrence is not None else None
    if text is not None and not (FREQUENCY.fullmatch(text) and int(text) >= 1):
        raise SimError.invalid(f"{field}.contractFrequency", "must be a number of days, from 1 to 9999")


def frequency_days(contract: ContractRecord) -> int | None:
    """The fewest days allowed between two payments of ``contract``; None when there is no minimum
    (not ``MIT_SCHEDULED``, or created without a ``contractFrequency``)."""
    text = contract.contract_frequency
    if contract.contract_type != ContractType.MIT_SCHEDULED.value or text is None or not FREQUENCY.fullmatch(text):
        return None
    return int(text)


def last_payment(sim: Simulator, contract_id: str) -> OperationRecord | None:
    """The contract's latest payment: of the charges made with it (the first payment that created it, MIT
    charges, the cardholder's later payments), the latest approved or held ``PENDING`` one. A declined or
    failed charge is no payment, nor is a card verification (it moves no money)."""
    payments = [
        op
        for op in sim.state.operations.values()
        if (op.recurrence or {}).get("contractId") == contract_id
        and op.operation_type != OperationType.CARD_VERIFICATION.value
        and (op.result in PAID or op.operation_id in sim.state.pending)
    ]
    return max(payments, key=lambda op: parse_gateway_time(op.time), default=None)


def check_mit_charge(sim: Simulator, contract: ContractRecord) -> None:
    """Refuse a merchant-initiated charge that ``contract`` does not allow, before anything is recorded
    (no order is made, so its ``orderId`` stays free). The rule durapay's schedules must keep:

    1. A contract created as ``CIT`` is the cardholder's: any MIT charge on it is refused with 400
       ``PS0017`` (invalid contract id).
    2. On an ``MIT_SCHEDULED`` contract with ``contractFrequency`` N, a charge is refused with 400
       ``PS0043`` (error during MIT invocation) unless its gateway day is at least N days after the
       gateway day of the contract's last payment (:func:`last_payment`; the first payment that created
       the contract counts, a declined charge does not). Gateway days are calendar dates in UTC+01:00,
       the zone of the gateway's operation times, whatever the hour: from 23:30 on January 1 to 00:10 on
       January 31 is 30 days; from January 31 to February 28 is 28.
    3. ``MIT_UNSCHEDULED``, and ``MIT_SCHEDULED`` without a ``contractFrequency``: no minimum.
    """
    if contract.contract_type == ContractType.CIT.value:
        detail = f"contract {contract.contract_id} is a CIT contract: the cardholder pays with it, the merchant cannot charge it"
        raise SimError.rejected("PS0017", detail)
    days = frequency_days(contract)
    last = last_payment(sim, contract.contract_id) if days is not None else None
    if days is None or last is None:
        return
    paid_on = gateway_day(parse_gateway_time(last.time))
    if (gateway_day(sim.clock.now()) - paid_on).days < days:
        detail = (
            f"contract {contract.contract_id} is MIT_SCHEDULED with contractFrequency {days}: its last payment "
            f"(operation {last.operation_id}) was on {paid_on}, the next may be made from {paid_on + timedelta(days=days)} "
            "(gateway days, UTC+01:00)"
        )
        raise SimError.rejected("PS0043", detail)
