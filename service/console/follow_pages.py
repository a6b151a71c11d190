"""The console's refund and capture of a succeeded payment: a new flow started from the payment's page.

Which are offered, and what input they take, is ``workflows.engine.operator_actions`` (``follow_ups``,
``follow_up_input``): read from the outcome's operation, what the gateway holds. A confirmation page
says what will be sent and takes the amount (the whole by default); its form carries a random token that
becomes the new flow's start key, so the same confirmation sent twice (a double click, a resent form) is
one flow and one refund, and a new confirmation page is a new one. The new flow's record notes who asked,
from which flow, and why; the browser then follows it on its own page.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from durapay.gateway import format_money, parse_minor
from durapay.service.console.session import PATH
from durapay.service.console.web import READ_ONLY, Console, redirect, to_login
from durapay.workflows.engine import (
    FOLLOW_UPS,
    Engine,
    FlowRecord,
    InputError,
    NotFound,
    OrderIdTaken,
    StartConflict,
    follow_up_input,
    follow_ups,
    mask_text,
)

#: What each follow-up does at the gateway, for the confirmation page.
WHAT = {
    "refund": "A refund flow is started: the gateway is asked to refund {amount} of operation {operation} "
    "(sent once, with its idempotency key; asking again from this page starts nothing new).",
    "capture": "A capture flow is started: the gateway is asked to capture {amount} of authorization {operation} "
    "(sent once, with its idempotency key).",
    "void": "A refund flow is started: the gateway voids authorization {operation} whole ({amount}); a part cannot be "
    "voided (capture it first, then refund part).",
}


def _operation(record: FlowRecord) -> dict[str, Any]:
    operation = (record.outcome or {}).get("operation")
    return dict(operation) if isinstance(operation, dict) else {}


def _whole_only(record: FlowRecord, kind: str) -> bool:
    return kind == "refund" and _operation(record).get("operationType") == "AUTHORIZATION"


def follow_router(console: Console, engine: Engine) -> APIRouter:
    router = APIRouter(prefix=f"{PATH}/flows", include_in_schema=False)

    def offered(record: FlowRecord | None, kind: str) -> str | None:
        """Why ``kind`` is not offered on ``record`` now (None: it is)."""
        if record is None:
            return "no such flow (or it expired)"
        if kind not in FOLLOW_UPS or kind not in engine.registry:
            return f"no follow-up {kind!r}"
        if kind not in follow_ups(record):
            return f"flow {record.id} ({record.state}) holds no payment to {kind}"
        return None

    def load(flow_id: str) -> FlowRecord | None:
        try:
            return engine.get(flow_id)
        except NotFound:
            return None

    @router.get("/{flow_id}/follow/{kind}")
    def confirm(request: Request, flow_id: str, kind: str) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        if not session.operator:
            return console.refuse(request, session, 403, "Read-only", READ_ONLY)
        record = load(flow_id)
        why = offered(record, kind)
        if record is None or why is not None:
            return console.refuse(request, session, 409, "Not possible now", why or "")
        operation = _operation(record)
        whole = format_money(operation.get("operationAmount"), operation.get("operationCurrency"))
        what = WHAT["void" if _whole_only(record, kind) else kind]
        return console.page(
            request,
            "follow.html",
            session,
            title=f"Confirm: {FOLLOW_UPS[kind].rstrip('…')} {whole}",
            flow=record,
            kind=kind,
            operation=operation,
            whole=whole,
            fixed=_whole_only(record, kind),
            explanation=what.format(amount=whole, operation=operation.get("operationId")),
            token=secrets.token_hex(16),
        )

    @router.post("/{flow_id}/follow/{kind}")
    async def start(request: Request, flow_id: str, kind: str) -> Response:
        posted = await console.operator_post(request)
        if isinstance(posted, Response):
            return posted
        session, form = posted
        record = load(flow_id)
        why = offered(record, kind)
        if record is None or why is not None:
            return console.refuse(request, session, 409, "Not done", why or "")
        token = form.get("token", "")
        if len(token) != 32 or not all(ch in "0123456789abcdef" for ch in token):
            return console.refuse(request, session, 422, "Not done", "the form is not this console's; reload it")
        amount: int | None = None
        if not _whole_only(record, kind) and (form.get("amount") or "").strip():
            try:
                amount = parse_minor(form["amount"].strip())
            except ValueError as exc:
                return console.refuse(request, session, 422, "Not done", f"amount: {exc}")
        reason = mask_text((form.get("reason") or "").strip()[:500]) or f"{kind} from the console"
        note = {"by": session.by, "from": record.id, "reason": reason}
        try:
            started = engine.start(
                kind, follow_up_input(record, kind, amount), f"console:{kind}:{token}", derived_key=True, note=note
            )
        except (InputError, OrderIdTaken) as exc:
            return console.refuse(request, session, 422, "Not done", f"{exc.field}: {exc.reason}")
        except StartConflict as exc:
            return console.refuse(request, session, 409, "Not done", str(exc))
        return redirect(f"{PATH}/flows/{started.id}?done={kind}")

    return router
