"""A schedule's contract, checked at the gateway when the schedule is made.

Why then: ``schedules add --contract`` took any contract id, and a typo (or a customer's CIT contract,
which the merchant cannot charge) surfaced only at the first charge, a month later, as a declined MIT.
The gateway finds contracts by their customer only (``GET /contracts/customers/{customerId}``: the
spec has no lookup by contract id), so the check needs the schedule's ``customerId``: with it, the
contract must be one of that customer's, of a type the merchant may charge (``MIT_SCHEDULED`` or
``MIT_UNSCHEDULED``), and a ``contractFrequency`` given must be the contract's. Without it nothing
can be looked up, and :func:`check_contract` says so (None: checked; a sentence: why not).

A refusal is the schedule's :class:`~durapay.workflows.engine.InputError` naming the field (nothing is
written); a gateway that does not answer is :class:`ContractUnchecked` (try again: nothing was written).
"""

from __future__ import annotations

from durapay.gateway import Catalogue, GatewayClient, GatewayError, NotFound
from durapay.workflows.engine import InputError
from durapay.workflows.schedules.model import ScheduleInput

#: The contract types a merchant charges by itself (a CIT contract needs the cardholder each time).
CHARGEABLE = frozenset({"MIT_SCHEDULED", "MIT_UNSCHEDULED"})


class ContractUnchecked(Exception):
    """The gateway did not answer the contract lookup (transport, 5xx): nothing was written; retry."""

    retryable = True


def check_contract(client: GatewayClient, spec: ScheduleInput) -> str | None:
    """Look ``spec``'s contract up at the gateway (module docstring). None when it was found as it should
    be; the reason it was not looked up (no ``customerId``); InputError or ContractUnchecked otherwise."""
    if not spec.customerId:
        return (
            "the contract was not checked at the gateway: it finds contracts by their customer; "
            "give the schedule's customerId (--customer) to check it when the schedule is made"
        )
    try:
        answer = client.call(Catalogue.get_customer_contracts, spec.customerId)
    except NotFound:
        raise InputError(
            "schedule", "customerId", f"the gateway knows no customer {spec.customerId!r} (nor so the contract)"
        ) from None
    except GatewayError as exc:
        raise ContractUnchecked(f"the contract could not be checked at the gateway ({exc}); nothing was written: retry") from None
    found = {contract.contractId: contract for contract in answer.contracts}
    contract = found.get(spec.contractId)
    if contract is None:
        known = ", ".join(sorted(found)) or "none"
        raise InputError(
            "schedule",
            "contractId",
            f"customer {spec.customerId!r} has no contract {spec.contractId!r} at the gateway (its contracts: {known})",
        )
    kind = str(contract.contractType or "")
    if kind and kind not in CHARGEABLE:
        raise InputError(
            "schedule",
            "contractId",
            f"contract {spec.contractId!r} is {kind}: the merchant cannot charge it by itself (MIT_SCHEDULED or MIT_UNSCHEDULED)",
        )
    days = contract.contractFrequency
    if spec.contractFrequency is not None and days and days.isdigit() and int(days) != spec.contractFrequency:
        raise InputError(
            "schedule",
            "contractFrequency",
            f"contract {spec.contractId!r} has a frequency of {int(days)} days at the gateway, not {spec.contractFrequency}",
        )
    return None
