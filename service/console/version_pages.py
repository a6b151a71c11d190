"""The console's Versions page: per flow kind and definition version, the flows counted (not finished,
or failed or cancelled and still kept: ``workflows.deploys.COUNTED``), the oldest, the latest business
deadline, and "drained" at zero (``workflows.deploys``, docs/deploys.md). A
previous version may be dropped from the code once drained; ``durapay deploy check`` says the same for a
build about to ship. Read-only."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from durapay.service.console.session import PATH
from durapay.service.console.web import Console, to_login
from durapay.workflows.deploys import versions_report
from durapay.workflows.engine import Engine
from durapay.workflows.schedules import Schedules


def version_router(console: Console, engine: Engine, schedules: Schedules | None) -> APIRouter:
    router = APIRouter(prefix=f"{PATH}/versions", include_in_schema=False)

    @router.get("")
    def versions_page(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        rows = versions_report(engine, schedules=schedules)
        return console.page(request, "versions.html", session, title="Versions", rows=rows)

    return router
