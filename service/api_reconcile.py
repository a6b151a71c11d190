"""``/reconciliation``: the gateway's operations against the flows (docs/operations.md, Reconciliation).

``POST /reconciliation/reports`` starts a run in the background and answers 202 with the report as it
stands (``running``); while a run goes (in this process, or in another whose run holds its lease:
``workflows.reconciliation.lease``) another is refused, 409 naming the running report (a run reads a
whole window from the gateway: minutes for a busy day, too long for one request; answering the other
run's report would pass it off as the window asked for). A run whose process died reads as interrupted
once its lease runs out, and no longer refuses one. The kept reports are read with ``GET``;
``/reconciliation/reports/latest`` is the newest.
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path
from fastapi.responses import JSONResponse

from durapay.gateway import StrictInput
from durapay.service.errors import ERRORS, conflict, invalid, not_found
from durapay.service.reconcile_schemas import ReconciliationList, ReconciliationReport, ReconciliationRun
from durapay.service.timeparse import parse_since
from durapay.workflows.engine import Engine, UnknownTerminal
from durapay.workflows.reconciliation import Reconciler, Report
from durapay.workflows.reconciliation.lease import Lease

log = logging.getLogger("durapay.reconcile")

ReportId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_]+$")]


class Background:
    """At most one run at a time in this process, in a thread of its own."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.lock = threading.Lock()
        self.current: Report | None = None

    def start(self, report: Report) -> Report:
        """Start ``report``'s run; the report already running (not started) when there is one, in this
        process or another (one whose run holds its lease: a dead run's report reads as interrupted)."""
        with self.lock:
            if self.current is not None:
                return self.current
            elsewhere = self.reconciler.reports.live()
            if elsewhere is not None:
                return elsewhere
            self.current = report
        lease = self.reconciler.reports.hold(report)  # kept as running before the answer names it
        threading.Thread(target=self._run, args=(report, lease), name="reconcile", daemon=True).start()
        return report

    def _run(self, report: Report, lease: Lease) -> None:
        try:
            base = self.reconciler
            own = base if report.terminal == base.terminal else Reconciler(base.engine, base.settings, terminal=report.terminal)
            own.complete(report, lease)  # with the report's terminal's carried operations, key and gate
        except Exception:
            log.exception("reconciliation %s failed", report.id)
        finally:
            with self.lock:
                self.current = None


def reconcile_router(engine: Engine) -> APIRouter:
    router = APIRouter(prefix="/reconciliation", tags=["reconciliation"], responses=ERRORS)
    reconciler = Reconciler(engine)
    background = Background(reconciler)

    @router.get("/reports", response_model=ReconciliationList, summary="The newest reports (without findings)")
    def list_reports() -> dict[str, Any]:
        return {"reports": reconciler.reports.recent(20)}

    @router.get("/reports/latest", response_model=ReconciliationReport, summary="The newest report")
    def latest_report() -> dict[str, Any]:
        report = reconciler.reports.latest()
        if report is None:
            raise not_found("no reconciliation report is kept")
        return report.wire()

    @router.get("/reports/{report_id}", response_model=ReconciliationReport, summary="One report")
    def get_report(report_id: ReportId) -> dict[str, Any]:
        report = reconciler.reports.get(report_id)
        if report is None:
            raise not_found(f"no reconciliation report {report_id!r} (kept {reconciler.settings.retention_days:g} days)")
        return report.wire()

    @router.post(
        "/reports",
        status_code=202,
        response_model=ReconciliationReport,
        summary="Reconcile a window against the gateway (in the background)",
    )
    def run_report(body: Annotated[ReconciliationRun, StrictInput(), Body()]) -> JSONResponse:
        now = engine.clock.now()
        try:
            since = parse_since(body.since, now=now)
        except ValueError as exc:
            raise invalid("since", str(exc)) from None
        try:
            until = parse_since(body.until, now=now) if body.until else None
        except ValueError as exc:
            raise invalid("until", str(exc)) from None
        if body.terminal not in engine.terminals.names:
            raise invalid("terminal", str(UnknownTerminal(body.terminal, engine.terminals.names)))
        try:
            report = Reconciler(engine, terminal=body.terminal).begin(since, until, by="api")
        except ValueError as exc:
            raise invalid("until" if body.until else "since", str(exc)) from None
        started = background.start(report)
        if started is not report:
            raise conflict(
                f"reconciliation {started.id} is running (since {started.since:.0f}, until {started.until:.0f}): "
                f"wait for it (GET /reconciliation/reports/{started.id}) and ask again"
            )
        return JSONResponse(started.wire(), status_code=202, headers={"Location": f"/reconciliation/reports/{started.id}"})

    return router
