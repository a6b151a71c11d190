"""The console's reconciliation page: the newest report (or one by ``?id=``) with its findings by
category, each linked to its flow, the flows' attention marks, and the recent reports. Read-only: a run
is started with ``durapay reconcile``, ``POST /reconciliation/reports`` or the scheduler's daily run
(docs/operations.md, Reconciliation)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from durapay.service.console.session import PATH
from durapay.service.console.web import Console, to_login
from durapay.workflows.engine import Engine
from durapay.workflows.moments import moment_text
from durapay.workflows.reconciliation import CATEGORIES, Reconciler, Report
from durapay.workflows.reconciliation.daily import next_run

TITLES = {
    "money_without_flow": "Money without a flow",
    "flow_without_money": "A flow without its money",
    "money_not_shown": "Money the flow does not show",
    "in_flight": "In flight (not errors)",
}


def home_summary(reconciler: Reconciler) -> dict[str, Any] | None:
    """The home page's line: the standing report's verdict and counts (``Reports.standing``: a newer run
    clears a mismatch only by reading its window again; None: none kept)."""
    report = reconciler.reports.standing()
    if report is None:
        return None
    summary = report.wire()
    summary.pop("findings")
    summary["mismatches"] = sum(count for category, count in report.counts().items() if category != "in_flight")
    return summary


def daily_run(engine: Engine) -> dict[str, Any] | None:
    """When the scheduler's daily run next reads the gateway (``at``, by the one rule for times: in its own
    time zone, named) and how many hours it reads (``hours``); None when it is off. The pages say when,
    rather than to turn on what is on by default."""
    settings = engine.settings.reconcile
    moment = next_run(settings, engine.clock.now())
    if moment is None:
        return None
    return {"at": moment_text(moment, settings.time_zone), "hours": f"{settings.window_hours:g}"}


def _sections(report: Report) -> list[tuple[str, str, list[dict[str, Any]]]]:
    return [
        (category, TITLES[category], [f.wire() for f in report.findings if f.category == category]) for category in CATEGORIES
    ]


def reconcile_router(console: Console, engine: Engine) -> APIRouter:
    router = APIRouter(prefix=f"{PATH}/reconciliation", include_in_schema=False)
    reconciler = Reconciler(engine)

    @router.get("")
    def page(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        wanted = request.query_params.get("id", "")
        report = reconciler.reports.get(wanted) if wanted else reconciler.reports.latest()
        if wanted and report is None:
            return console.refuse(request, session, 404, "Reconciliation", f"no report {wanted!r} (or it expired)")
        return console.page(
            request,
            "reconciliation.html",
            session,
            title="Reconciliation",
            report=report.wire() if report else None,
            sections=_sections(report) if report else [],
            recent=reconciler.reports.recent(20),
            daily=daily_run(engine),
        )

    return router
