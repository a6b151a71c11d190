"""What a flow page says in words: its outcome at the gateway (operation, result, amount, response code).

Which actions a flow accepts, and what each will do, is the engine's rule (``workflows.engine.operator_actions``),
asked by the pages, so that a person is never shown a button that can only fail, nor told something the
engine will not do.
"""

from __future__ import annotations

import json
from typing import Any

from durapay.gateway import format_money
from durapay.service.views import money_text, operation_time
from durapay.workflows.engine import TERMINAL, FlowRecord, late_payment
from durapay.workflows.flow_money import asked_money
from durapay.workflows.moments import moment_text


def facts(record: FlowRecord, refunding: FlowRecord | None = None) -> dict[str, Any]:
    """The outcome in a payment's terms: operation id, result, amount, ISO response code, soft/hard;
    ``refunding``: the refund flow of its late payment under way (``Engine.refund_under_way``), linked."""
    outcome = record.outcome or {}
    error = record.error or {}
    operation = outcome.get("operation") if isinstance(outcome.get("operation"), dict) else {}
    operation = operation or {}
    amount = operation.get("operationAmount")
    currency = operation.get("operationCurrency") or ""
    asked = asked_money(record.input)
    return {
        # The money at stake from the start: what the request asks (the outcome's amount comes once there is one).
        "asked": format_money(*asked) if asked else "",
        "money": money_text(record.outcome, record.input),
        "result": outcome.get("result") or ("" if record.state not in TERMINAL else record.state.value),
        "reason": outcome.get("reason") or "",
        "operation_id": operation.get("operationId") or error.get("operationId") or "",
        "operation_type": operation.get("operationType") or "",
        "operation_time": moment_text(operation_time(record.outcome, record.outputs)),
        "operation_result": operation.get("operationResult") or error.get("operationResult") or "",
        "amount": format_money(amount, currency),
        "response_code": operation.get("responseCode") or error.get("responseCode") or "",
        "decline": error.get("decline") or "",
        "operation_ids": outcome.get("operationIds") or [],
        "late": late_payment(record),
        "refund_flows": refund_flows(outcome),
        "refunding": {"id": refunding.id, "state": refunding.state.value} if refunding is not None else None,
        "note": started_by(record),
    }


def started_by(record: FlowRecord) -> dict[str, str]:
    """Who started the flow from another one, and why (the record's ``note``: a refund or a capture started
    from a payment's page, a late payment's refund), or nothing."""
    try:
        note = json.loads(record.fields.get("note") or "{}")
    except ValueError:
        return {}
    return {name: str(note[name]) for name in ("by", "from", "reason") if isinstance(note, dict) and note.get(name)}


def refund_flows(outcome: dict[str, Any]) -> list[str]:
    """The refund flows a flow's outcome names (a late payment refunded by durapay), to link to."""
    found = [(outcome.get("refund") or {}).get("flow")]
    found += [
        ((late.get("refund") or {}) if isinstance(late, dict) else {}).get("flow") for late in outcome.get("latePayments") or []
    ]
    return [str(flow) for flow in dict.fromkeys(found) if flow]
