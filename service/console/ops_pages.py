"""The console's operator pages over many flows: the flow kinds with their pause and resume buttons
(``workflows.pauses``), and bulk retry and cancel (``workflows.bulk``): a form of the filter, its dry
run (the count, what would be skipped and why, a sample with each flow's money, the money at stake by
currency), a confirmed action on exactly the flows it listed, and its progress bar,
reloaded each second while it runs (a meta refresh: no script). Every action is a CSRF-protected POST
of an operator session, recorded as ``console`` (the API's rules: ``service.api_kinds``,
``service.api_bulk``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from durapay.gateway import describe_validation_error
from durapay.service.api_bulk import bulk_filter, given
from durapay.service.api_kinds import kind_views
from durapay.service.console.session import PATH
from durapay.service.console.web import Console, query, redirect, to_login
from durapay.service.ops_schemas import BulkRequest
from durapay.workflows.bulk import FILTERS, BulkActions, TooMany, Unconfirmable, UnknownBulk
from durapay.workflows.engine import Engine, FlowState
from durapay.workflows.pauses import NotPaused, UnknownKind

#: The form's fields besides the filter.
FIELDS = ("action", *FILTERS)


def _request(values: dict[str, str]) -> BulkRequest:
    """The form (or query) read as the API reads a body: empty fields left out. The confirmation's form
    carries its dry run's ``plan`` and its filter as asked: the action acts on that dry run's flows, each as
    shown; the same form sent twice is one action, a new dry run a new one, a plan with another action or
    filter is refused (409)."""
    names = (*FIELDS, "plan")
    return BulkRequest.model_validate({name: values[name].strip() for name in names if values.get(name, "").strip()})


def ops_router(console: Console, engine: Engine, bulk: BulkActions) -> APIRouter:
    router = APIRouter(prefix=PATH, include_in_schema=False)

    @router.get("/kinds")
    def kinds(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        return console.page(
            request,
            "kinds.html",
            session,
            title="Flow kinds",
            rows=kind_views(engine),
            log=engine.pauses.log(20),
            done=request.query_params.get("done", ""),
        )

    @router.post("/kinds/{kind}/{action}")
    async def pause_or_resume(request: Request, kind: str, action: str) -> Response:
        posted = await console.operator_post(request)
        if isinstance(posted, Response):
            return posted
        session, form = posted
        try:
            if action == "pause":
                reason = (form.get("reason") or "").strip()[:500]
                if not reason:
                    return console.refuse(request, session, 422, "Not paused", "reason: say why (it is shown to everyone)")
                engine.pauses.pause(kind, reason, by=session.by)
            elif action == "resume":
                engine.pauses.resume(kind, by=session.by)
            else:
                return console.refuse(request, session, 404, "No such action", f"no action {action!r}")
        except UnknownKind as exc:
            return console.refuse(request, session, 404, "No such kind", str(exc))
        except NotPaused as exc:
            return console.refuse(request, session, 409, "Not done", str(exc))
        return redirect(f"{PATH}/kinds?{query({'done': f'{action}:{kind}'})}")

    @router.get("/bulk")
    def bulk_home(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        values = {name: request.query_params.get(name, "") for name in FIELDS}
        plan = None
        if values["action"]:  # the form was sent: its dry run
            try:
                wanted = _request(values)
                plan = bulk.plan(wanted.action, bulk_filter(engine, wanted), asked=given(wanted)).view()
            except ValidationError as exc:
                field, reason = describe_validation_error(exc)
                return console.refuse(request, session, 422, "Dry run", f"{field}: {reason}")
            except (TooMany, ValueError) as exc:
                return console.refuse(request, session, 422, "Dry run", str(exc))
        return console.page(
            request,
            "bulk.html",
            session,
            title="Bulk retry and cancel",
            values=values,
            kinds=sorted(engine.registry),
            states=[state.value for state in FlowState],
            plan=plan,
            recent=bulk.list(20),
        )

    @router.post("/bulk")
    async def bulk_post(request: Request) -> Response:
        posted = await console.operator_post(request)
        if isinstance(posted, Response):
            return posted
        session, form = posted
        try:
            wanted = _request(form)
            record = bulk.post(wanted.action, bulk_filter(engine, wanted), by=session.by, given=given(wanted), plan=wanted.plan)
        except ValidationError as exc:
            field, reason = describe_validation_error(exc)
            return console.refuse(request, session, 422, "Not done", f"{field}: {reason}")
        except Unconfirmable as exc:  # a plan for another action or filter, or no longer kept
            return console.refuse(request, session, 409, "Not done", str(exc))
        except (TooMany, ValueError) as exc:
            return console.refuse(request, session, 422, "Not done", str(exc))
        return redirect(f"{PATH}/bulk/{record['id']}")

    @router.get("/bulk/{bulk_id}")
    def bulk_one(request: Request, bulk_id: str) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        try:
            record = bulk.get(bulk_id)
        except UnknownBulk:
            return console.refuse(request, session, 404, "No such bulk action", f"no bulk action {bulk_id!r}")
        return console.page(request, "bulk_one.html", session, title=f"Bulk {record['action']} {bulk_id}", b=_shown(record))

    return router


def _shown(record: dict[str, Any]) -> dict[str, Any]:
    handled = record["done"] + record["skipped"]
    return {
        **record,
        "handled": handled,
        "filter_text": ", ".join(f"{k}={v}" for k, v in record["filter"].items() if v is not None),
    }
