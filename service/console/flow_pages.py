"""The console's flow pages: home, the list (filters, search, cursor pages), one flow, its actions.

Actions (retry, cancel with a reason, accept, refund or keep a late payment) go through a confirmation page
that says what will happen at the gateway, then a POST carrying the session's CSRF token; a read-only
session sees no action and is refused (403) if it posts one anyway. Every action is the engine's own
(``Engine.retry``, ``cancel``, ``refund_late_payment``, ``keep_late_payment``): the console adds no rule of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from durapay.service.console.flow_facts import facts
from durapay.service.console.overview import attention, declines, reason_of, snapshot, step_latency
from durapay.service.console.reconcile_pages import daily_run, home_summary
from durapay.service.console.session import PATH
from durapay.service.console.timeline import build, svg
from durapay.service.console.web import READ_ONLY, Console, query, redirect, secured, to_login
from durapay.service.timeparse import parse_since
from durapay.service.views import flow_brief, money_text, redact
from durapay.workflows.engine import (
    ACTIONS,
    FOLLOW_UPS,
    STOPPED,
    ChangedSince,
    Engine,
    FlowRecord,
    FlowState,
    NotFound,
    OperatorError,
    Seen,
    UnknownTerminal,
    explain,
    follow_ups,
    no_action_why,
    versions,
)
from durapay.workflows.listing import Cursor, FlowListing
from durapay.workflows.reconciliation import Reconciler
from durapay.workflows.reconciliation.findings import TITLES

PAGE_SIZE = 50
# Times come from the engine's clock, not the machine's: the demo moves its clock forward (days), and
# "the last minute", "2h ago" and a running step's bar must agree with the flows' own times.


def _time_bound(text: str, now: float) -> float | None:
    """``since``/``until`` of the list: ``15m``, ``2h``, ``7d`` ago, or an ISO time; ValueError otherwise."""
    return parse_since(text, now=now) if text else None


def flow_router(console: Console, engine: Engine, listing: FlowListing) -> APIRouter:
    router = APIRouter(prefix=PATH, include_in_schema=False)
    kinds = sorted(engine.registry)
    terminals = list(engine.terminals.names)
    reconciler = Reconciler(engine)

    @router.get("")
    def home(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        now = engine.clock.now()
        needing = [(record, reason_of(record)) for record in attention(listing)]
        return console.page(
            request,
            "home.html",
            session,
            title="Home",
            live=snapshot(engine, listing, now),
            needing=needing,
            money={record.id: money_text(record.outcome, record.input) for record, _ in needing},
            declines=declines(listing),
            latency=step_latency(engine),
            reconciliation=home_summary(reconciler),
            daily=daily_run(engine),
        )

    @router.get("/live/home")
    def live_home(request: Request) -> Response:
        if console.session(request) is None:
            return secured(JSONResponse({"error": "unauthorized"}, status_code=401))
        return secured(JSONResponse(snapshot(engine, listing, engine.clock.now())))

    @router.get("/flows")
    def flows(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        params = request.query_params
        state, kind, search = params.get("state", ""), params.get("kind", ""), params.get("q", "").strip()
        terminal = params.get("terminal", "")
        since_text, until_text, after = params.get("since", ""), params.get("until", ""), params.get("after", "")
        problems: list[str] = []
        if state and state not in {s.value for s in FlowState}:
            problems.append(f"state: unknown state {state!r}")
        if kind and kind not in engine.registry:
            problems.append(f"kind: unknown flow kind {kind!r}")
        if terminal and terminal not in terminals:
            problems.append(f"terminal: {UnknownTerminal(terminal, terminals)}")
        now = engine.clock.now()
        try:
            since = _time_bound(since_text, now)
            until = _time_bound(until_text, now)
            cursor = Cursor.parse(after) if after else None
        except ValueError as exc:
            problems.append(str(exc))
            since = until = None
            cursor = None
        records, following = [], None
        if search:
            records = listing.find(search)
        elif not problems:
            page = listing.page(
                states=[FlowState(state)] if state else [],
                kind=kind or None,
                since=since,
                until=until,
                limit=PAGE_SIZE,
                after=cursor,
                terminal=terminal or None,
            )
            records, following = page.records, page.next
        base = {"state": state, "kind": kind, "terminal": terminal, "since": since_text, "until": until_text}
        return console.page(
            request,
            "flows.html",
            session,
            status=422 if problems else 200,
            title="Flows",
            rows=[_row(record) for record in records],
            kinds=kinds,
            terminals=terminals if len(terminals) > 1 else [],  # one terminal: no filter, no column (as before)
            states=[s.value for s in FlowState],
            filters=base | {"q": search},
            problems=problems,
            next_url=f"{PATH}/flows?{query(base | {'after': following.text()})}" if following else "",
            first_url=f"{PATH}/flows?{query(base)}" if after else "",
        )

    def load(flow_id: str) -> Any:
        try:
            return engine.get(flow_id)
        except NotFound:
            return None

    @router.get("/flows/{flow_id}")
    def flow(request: Request, flow_id: str) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        found = load(flow_id)
        if found is None:
            return console.refuse(request, session, 404, "No such flow", f"no flow {flow_id!r} (or it expired)")
        record = found.shown()  # card numbers masked wherever a merchant put them
        refunding = engine.refund_under_way(found)  # its late payment's refund, under way: linked, and no accept
        history = engine.store.history(flow_id)
        definition = engine.registry.get(record.kind)
        steps = [step.name for step in definition.steps] if definition else []
        stopped = record.state in STOPPED
        timeline = build(history, now=record.updated if stopped else engine.clock.now(), steps=steps)
        return console.page(
            request,
            "flow.html",
            session,
            title=f"Flow {record.id}",
            flow=record,
            facts=facts(record, refunding),
            definition=versions.recorded(record.kind, record.fields, engine.registry),
            reason=reason_of(record),
            timeline_svg=svg(timeline),
            calls=timeline.calls,
            acts=timeline.acts,
            spans=timeline.spans,
            input_json=json.dumps(redact(record.input, record.identifiers), indent=2, sort_keys=True),
            record_json=json.dumps(redact(record.summary(), record.identifiers), indent=2, sort_keys=True, default=str),
            history_json=json.dumps(history, indent=2, sort_keys=True),
            marks=engine.store.marks(flow_id),
            titles=TITLES,
            actions=engine.actions(found) if session.operator else [],
            labels=ACTIONS,  # the buttons say what the confirmation page's title says
            follow_ups=[kind for kind in follow_ups(found) if kind in engine.registry] if session.operator else [],
            follow_labels=FOLLOW_UPS,
            no_action=no_action_why(found),
            done=request.query_params.get("done", ""),
        )

    @router.get("/live/flows/{flow_id}")
    def live_flow(request: Request, flow_id: str) -> Response:
        """The flow's version and state: the page reloads itself when the version moves (one HMGET)."""
        if console.session(request) is None:
            return secured(JSONResponse({"error": "unauthorized"}, status_code=401))
        state, version = engine.redis.hmget(engine.keys.flow(flow_id), "state", "version")
        body = {"state": state.decode() if state else None, "version": int(version) if version else None}
        return secured(JSONResponse(body))

    @router.get("/flows/{flow_id}/confirm/{action}")
    def confirm(request: Request, flow_id: str, action: str) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        if not session.operator:
            return console.refuse(request, session, 403, "Read-only", READ_ONLY)
        record = load(flow_id)
        if record is None:
            return console.refuse(request, session, 404, "No such flow", f"no flow {flow_id!r}")
        why = engine.refusal(record, action) if action in ACTIONS else f"no action {action!r}"
        if why is not None:
            return console.refuse(request, session, 409, "Not possible now", why)
        return console.page(
            request,
            "confirm.html",
            session,
            title=f"Confirm: {ACTIONS[action]}",
            flow=record,
            action=action,
            label=ACTIONS[action],
            explanation=explain(record, action),
            seen=Seen.of(record).text(),  # posted back: the action is taken only on the flow as shown
        )

    @router.post("/flows/{flow_id}/{action}")
    async def act(request: Request, flow_id: str, action: str) -> Response:
        posted = await console.operator_post(request)
        if isinstance(posted, Response):
            return posted
        session, form = posted
        if action not in ACTIONS:
            return console.refuse(request, session, 404, "No such action", f"no action {action!r}")
        reason = (form.get("reason") or "").strip()[:500] or "cancelled from the console"
        try:
            # What the confirmation page showed (money invariant 8): acted on only if the flow is still so.
            seen = Seen.parse(str(form.get("seen") or ""), since="you looked")
        except ValueError:
            why = "this confirmation does not say which state of the flow it showed: open its page and confirm again"
            return console.refuse(request, session, 409, "Look again", why)
        run: dict[str, Callable[[], Any]] = {
            "retry": lambda: engine.retry(flow_id, by=session.by, seen=seen),
            "accept": lambda: engine.retry(flow_id, by=session.by, seen=seen),
            "cancel": lambda: engine.cancel(flow_id, reason, by=session.by, seen=seen),
            "refund": lambda: engine.refund_late_payment(flow_id, reason, by=session.by, seen=seen),
            "keep": lambda: engine.keep_late_payment(flow_id, by=session.by, seen=seen),
        }
        try:
            run[action]()
        except NotFound:
            return console.refuse(request, session, 404, "No such flow", f"no flow {flow_id!r}")
        except ChangedSince as exc:
            return console.refuse(request, session, 409, "Changed since you looked", f"{exc}: nothing was done; look again")
        except OperatorError as exc:
            return console.refuse(request, session, 409, "Not done", str(exc))
        return redirect(f"{PATH}/flows/{flow_id}?done={action}")

    return router


def _row(record: FlowRecord) -> dict[str, Any]:
    """One line of the flow list: the brief, why it stopped, and its amount as a person reads it."""
    return flow_brief(record) | {
        "reason": reason_of(record),
        "amount": money_text(record.outcome, record.input),
        "due": record.due,
    }
