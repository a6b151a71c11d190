"""What the API and the CLI show of a flow: the record's summary with card data masked.

Why mask here: a flow's input (MOTO, 3-step, SVS) holds a card number and a CVV, and its outputs the
order's security token; a merchant may also have typed a card number into a description or a
``passThrough``. They stay in the record while the steps need them; nothing durapay *shows* (HTTP
answers, CLI tables, the console, the demo) repeats them: a card number anywhere keeps its first six
and last four digits, a CVV and a token become ``***`` (``workflows.engine.sensitive.mask``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from durapay.gateway import GatewayTime, format_money
from durapay.workflows.engine import TENANT_FIELD, FlowDefinition, FlowRecord, allowed, mask, versions
from durapay.workflows.flow_money import asked_money, outcome_money

#: What every view applies (one rule, in ``workflows.engine.sensitive``): secrets ``***``, card numbers masked.
redact = mask


def steps_done(record: FlowRecord, registry: Mapping[str, FlowDefinition]) -> list[str]:
    """The steps with an output, in the flow's order (Redis keeps a hash's fields in no order)."""
    definition = registry.get(record.kind)
    order = definition.step_index if definition else {}
    return sorted(record.outputs, key=lambda name: (order.get(name, len(order)), name))


def flow_view(
    record: FlowRecord,
    registry: Mapping[str, FlowDefinition],
    marks: Sequence[Mapping[str, Any]] = (),
    *,
    refunding: FlowRecord | None = None,
) -> dict[str, Any]:
    """The full view (``GET /flows/{id}``, ``durapay flows show``), with the flow's reconciliation marks
    when given (``FlowStore.marks``: the answers of actions on the flow leave them out)."""
    view: dict[str, Any] = redact(record.summary(), record.identifiers)  # its operation ids whole in its text
    view["steps_done"] = steps_done(record, registry)
    kind, version = versions.recorded(record.kind, record.fields, registry)
    view["definition"] = {"kind": kind, "version": version or None}
    view["terminal"] = record.terminal
    view["tenant"] = record.fields.get(TENANT_FIELD) or None
    view["actions"] = allowed(record, refunding=refunding)  # refunding: Engine.refund_under_way's
    view["attention"] = [dict(mark) for mark in marks]  # the report's lines: no card data (FlowStore.marks)
    return view


def flow_brief(record: FlowRecord) -> dict[str, Any]:
    """One line of a list: no input or outputs."""
    return {
        "id": record.id,
        "kind": record.kind,
        "state": record.state.value,
        "step": record.step,
        "order_id": record.order_id or None,
        "customer_url": record.customer_url or None,
        "created": record.created,
        "updated": record.updated,
        "result": (record.outcome or {}).get("result"),
        "error": redact(record.error, record.identifiers),
        "terminal": record.terminal,
    }


def operation_time(outcome: Any, outputs: Any) -> GatewayTime | None:
    """The gateway's ``operationTime`` of the operation a flow's ``outcome`` names, as the gateway wrote it
    (its zone, unlabelled: docs/gateway.md), read from the outcome or from the step output holding that
    operation (the outcome keeps id, type, result and amount); None when none says."""
    operation = outcome.get("operation") if isinstance(outcome, Mapping) else None
    if not isinstance(operation, Mapping) or not operation.get("operationId"):
        return None
    found = [operation, *(output.get("operation", output) for output in (outputs or {}).values() if isinstance(output, Mapping))]
    for candidate in found:
        same = isinstance(candidate, Mapping) and candidate.get("operationId") == operation["operationId"]
        if same and candidate.get("operationTime"):
            return GatewayTime(str(candidate["operationTime"]))
    return None


def money_text(outcome: Any, data: Any) -> str:
    """The money at stake on a flow as a person reads it (``gateway.format_money``), wherever a flow is
    listed or acted on (the console's pages, the CLI's tables): the amount and currency its request asks
    for, from the start (a flow waiting for a customer or stopped for a person has no outcome yet); then,
    once the gateway holds an operation of another amount, that one too (``15.00 EUR → 9.90 EUR``); the
    outcome's alone when the request names none; ``""`` for a flow about no amount."""
    asked, held = asked_money(data), outcome_money(outcome)
    asked_text, held_text = (format_money(*money) if money else "" for money in (asked, held))
    if asked_text and held_text and held_text != asked_text:
        return f"{asked_text} \u2192 {held_text}"
    return asked_text or held_text


def rule_text(rule: Any) -> str:
    """A schedule's rule in words (``every 30 days``, ``monthly on day 5``, ``weekly on monday``,
    ``cron 0 9 * * 1-5``), for the console and the CLI; anything else as JSON, never hidden."""
    if isinstance(rule, Mapping):
        every = rule.get("every")
        if every == "days":
            interval = int(rule.get("interval") or 1)
            return "every day" if interval == 1 else f"every {interval} days"
        if every == "month" and rule.get("day") is not None:
            return f"monthly on day {rule['day']}"
        if every == "week" and rule.get("weekday"):
            return f"weekly on {rule['weekday']}"
        if rule.get("cron"):
            return f"cron {rule['cron']}"
    return json.dumps(rule, sort_keys=True, default=str)
