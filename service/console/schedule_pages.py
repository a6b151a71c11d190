"""The console's schedule pages: the list, one schedule with its occurrences, and its actions (pause,
resume, cancel, change the amount, resolve an occurrence whose flow is gone), each confirmed and
CSRF-protected like the flow actions; the schedule API (``workflows.schedules.Schedules``) decides what
is allowed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from durapay.gateway import parse_minor
from durapay.service.console.session import PATH
from durapay.service.console.web import READ_ONLY, Console, redirect, to_login
from durapay.workflows.engine import ChangedSince, InputError, NotFound, OperatorError
from durapay.workflows.schedules import Attempt, Schedules
from durapay.workflows.schedules.api import seen_text
from durapay.workflows.schedules.model import ScheduleState

ACTIONS = {
    "pause": "Pause",
    "resume": "Resume",
    "cancel": "Cancel",
    "amount": "Change the amount",
    "resolve": "Resolve the occurrence",
}
EXPLAIN = {
    "pause": "No occurrence fires while paused: nothing is sent to the gateway until you resume.",
    "resume": "The schedule goes on from now: occurrences that passed meanwhile are skipped (not charged late). "
    "An occurrence whose charge failed for a reason other than a decline (nothing was charged) is charged again now.",
    "cancel": "No further charge is started. Charges already sent finish and are still counted and told; charges "
    "made are not refunded; the record and history are kept.",
    "amount": "From the next occurrence on, each MIT charge at the gateway is for the new amount; earlier charges stay.",
    "resolve": "The flow of this occurrence expired before the schedule read its outcome: look its order up at the "
    "gateway and say what it shows. Nothing is sent to the gateway. Charged: counted as a charge. Not charged: "
    "closed without a charge. Either way this schedule never charges the occurrence again (never twice); money "
    "still owed needs a new payment. Then resume the schedule.",
}
#: Which actions each state allows (the policy refuses the others: never show a button that can only fail).
ALLOWED = {
    ScheduleState.ACTIVE.value: ["pause", "cancel", "amount"],
    ScheduleState.DUNNING.value: ["pause", "cancel", "amount"],
    ScheduleState.PAUSED.value: ["resume", "cancel", "amount"],
    ScheduleState.NEEDS_ATTENTION.value: ["resume", "cancel"],
}


def allowed(state: str, gone: bool = False) -> list[str]:
    """The actions of a schedule in ``state``; ``gone``: an occurrence's flow is gone, so a needs_attention
    schedule offers resolve instead of resume (which is refused until every such occurrence is resolved)."""
    actions = ALLOWED.get(state, [])
    if gone and state == ScheduleState.NEEDS_ATTENTION.value:
        return ["resolve" if action == "resume" else action for action in actions]
    return actions


def gone_rows(attempts: list[Attempt]) -> list[dict[str, Any]]:
    """The occurrences whose flow is gone, as the pages show them (occurrence, attempt, order, flow)."""
    return [
        {"occurrence": a.occurrence, "attempt": a.attempt, "orderId": a.data["order"]["orderId"], "flow": a.flow_id}
        for a in attempts
    ]


def schedule_router(console: Console, schedules: Schedules) -> APIRouter:
    router = APIRouter(prefix=f"{PATH}/schedules", include_in_schema=False)

    @router.get("")
    def listing(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        state = request.query_params.get("state", "")
        try:
            records = schedules.list(state=state or None, limit=200)
        except InputError as exc:
            return console.refuse(request, session, 422, "Schedules", f"{exc.field}: {exc.reason}")
        return console.page(
            request,
            "schedules.html",
            session,
            title="Schedules",
            rows=[record.summary() for record in records],
            states=[s.value for s in ScheduleState],
            state=state,
        )

    @router.get("/{schedule_id}")
    def one(request: Request, schedule_id: str) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        try:
            record = schedules.get(schedule_id)
            history = schedules.history(schedule_id)
        except NotFound:
            return console.refuse(request, session, 404, "No such schedule", f"no schedule {schedule_id!r}")
        summary = record.summary()
        gone = gone_rows(schedules.gone(schedule_id)) if record.state is ScheduleState.NEEDS_ATTENTION else []
        return console.page(
            request,
            "schedule.html",
            session,
            title=f"Schedule {schedule_id}",
            s=summary,
            gone=gone,
            history=list(reversed(history))[:200],
            actions=allowed(summary["state"], bool(gone)) if session.operator else [],
            done=request.query_params.get("done", ""),
        )

    @router.get("/{schedule_id}/confirm/{action}")
    def confirm(request: Request, schedule_id: str, action: str) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        if not session.operator:
            return console.refuse(request, session, 403, "Read-only", READ_ONLY)
        try:
            record = schedules.get(schedule_id)
            gone = gone_rows(schedules.gone(schedule_id)) if record.state is ScheduleState.NEEDS_ATTENTION else []
        except NotFound:
            return console.refuse(request, session, 404, "No such schedule", f"no schedule {schedule_id!r}")
        summary = record.summary()
        if action not in allowed(summary["state"], bool(gone)):
            why = f"{action} is not possible for a {summary['state']} schedule"
            if action == "resume" and gone:
                why += ": the flow of " + ", ".join(row["occurrence"] for row in gone) + " is gone; resolve it first"
            return console.refuse(request, session, 409, "Not possible now", why)
        return console.page(
            request,
            "schedule_confirm.html",
            session,
            title=f"Confirm: {ACTIONS[action]}",
            s=summary,
            gone=gone,
            action=action,
            label=ACTIONS[action],
            explanation=EXPLAIN[action],
            seen=seen_text(record),  # posted back: the action is taken only on the schedule as shown
        )

    @router.post("/{schedule_id}/{action}")
    async def act(request: Request, schedule_id: str, action: str) -> Response:
        posted = await console.operator_post(request)
        if isinstance(posted, Response):
            return posted
        session, form = posted
        reason = (form.get("reason") or "").strip()[:500] or "cancelled from the console"
        amount_text = (form.get("amount") or "").strip()
        occurrence = (form.get("occurrence") or "").strip()
        outcome = (form.get("outcome") or "").strip()
        operation_id = (form.get("operationId") or "").strip() or None
        seen = str(form.get("seen") or "")  # what the confirmation page showed: acted on only if still so
        if not seen:
            why = "this confirmation does not say which state of the schedule it showed: open its page and confirm again"
            return console.refuse(request, session, 409, "Look again", why)
        run: dict[str, Callable[[], Any]] = {
            "pause": lambda: schedules.pause(schedule_id, by=session.by, seen=seen),
            "resume": lambda: schedules.resume(schedule_id, by=session.by, seen=seen),
            "cancel": lambda: schedules.cancel(schedule_id, reason, by=session.by, seen=seen),
            "amount": lambda: schedules.change_amount(schedule_id, parse_minor(amount_text), by=session.by, seen=seen),
            "resolve": lambda: schedules.resolve(
                schedule_id, occurrence, outcome, operation_id=operation_id, by=session.by, seen=seen
            ),
        }
        if action not in run:
            return console.refuse(request, session, 404, "No such action", f"no action {action!r}")
        if action == "amount":  # the API's parser: "²", "١٢" or 5,000 digits are refused here as there
            try:
                parse_minor(amount_text)
            except ValueError as exc:
                return console.refuse(request, session, 422, "Amount", f"amount: {exc}")
        try:
            run[action]()
        except NotFound:
            return console.refuse(request, session, 404, "No such schedule", f"no schedule {schedule_id!r}")
        except InputError as exc:
            return console.refuse(request, session, 422, "Not done", f"{exc.field}: {exc.reason}")
        except ChangedSince as exc:
            return console.refuse(request, session, 409, "Changed since you looked", f"{exc}: nothing was done; look again")
        except OperatorError as exc:
            return console.refuse(request, session, 409, "Not done", str(exc))
        return redirect(f"{PATH}/schedules/{schedule_id}?done={action}")

    return router
