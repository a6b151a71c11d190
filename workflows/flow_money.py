"""What a flow is for, in money: the one rule every surface that lists or acts on flows shows it by.

A person decides by the money (a flow page, the CLI's list, a bulk dry run's listed flows and totals): the
amount and currency the gateway holds once the flow's outcome names an operation, and until then what its
input asks. Here, not in ``service.views``, so that the engine's side (``workflows.bulk_plan``) and the
surfaces read one rule; ``gateway.format_money`` writes it as a person reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from durapay.gateway import parse_minor


def asked_money(data: Any) -> tuple[Any, str] | None:
    """What a flow's ``input`` asks for, in minor units and currency (``order.amount``, a post-operation's or a
    charge's ``amount``, a reservation's); None for a flow about no amount (a link's cancel, a contract) or
    one that asks for "the whole amount" (a refund without ``amount``)."""
    data = data if isinstance(data, Mapping) else {}
    for holder in (data.get("order"), data, data.get("reservation")):
        if isinstance(holder, Mapping) and holder.get("amount") not in (None, ""):
            return holder["amount"], str(holder.get("currency") or "")
    return None


def outcome_money(outcome: Any) -> tuple[Any, str] | None:
    """The amount of the operation a flow's ``outcome`` names (what the gateway holds), or None."""
    operation = outcome.get("operation") if isinstance(outcome, Mapping) else None
    if isinstance(operation, Mapping) and operation.get("operationAmount") not in (None, ""):
        return operation["operationAmount"], str(operation.get("operationCurrency") or "")
    return None


def flow_money(outcome: Any, data: Any) -> tuple[Any, str] | None:
    """What a flow is for, in minor units and currency, from its ``outcome`` and ``input`` (a record's
    or a view's): the operation its outcome names (:func:`outcome_money`: what the gateway holds), else
    what its input asks (:func:`asked_money`); None for a flow about no amount (a link's cancel, a
    contract). A surface that shows both (the request's amount from the start, then the outcome's) reads
    the two itself (``service.views.money_text``)."""
    return outcome_money(outcome) or asked_money(data)


def minor_money(outcome: Any, data: Any) -> tuple[int, str] | None:
    """:func:`flow_money` as a whole number of minor units (``gateway.parse_minor``) and an upper-case
    code; None for a flow about no amount, or one whose amount is not a number (shown as it came by
    ``format_money``, never added up)."""
    money = flow_money(outcome, data)
    if money is None:
        return None
    try:
        return parse_minor(money[0]), money[1].strip().upper()
    except ValueError:
        return None


def totals(moneys: Iterable[tuple[int, str] | None]) -> dict[str, int]:
    """Minor units per currency (``""``: flows whose input named no currency), currencies in order."""
    summed: dict[str, int] = {}
    for money in moneys:
        if money is not None:
            summed[money[1]] = summed.get(money[1], 0) + money[0]
    return dict(sorted(summed.items()))
