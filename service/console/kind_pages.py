"""The console's page of one flow kind: what it does, its steps, and an example input that starts as is
against ``durapay dev`` (``workflows.flows.examples``), with the command and the request that start it,
so that a newcomer need not look the body up in docs/api.md. Read-only: a flow is started by the
merchant's backend (the API, ``durapay start``), not from the console."""

from __future__ import annotations

import json
import shlex

from fastapi import APIRouter, Request
from fastapi.responses import Response

from durapay.service.console.session import PATH
from durapay.service.console.web import Console, to_login
from durapay.workflows.engine import Engine
from durapay.workflows.flows.examples import MAKERS, example


def kind_router(console: Console, engine: Engine) -> APIRouter:
    router = APIRouter(prefix=f"{PATH}/kinds", include_in_schema=False)

    @router.get("/{kind}")
    def kind_page(request: Request, kind: str) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        definition = engine.registry.get(kind)
        if definition is None:
            return console.refuse(request, session, 404, "No such kind", f"no flow kind {kind!r}")
        made = example(kind) if kind in MAKERS else None
        body = json.dumps(made.data, indent=2) if made else ""
        compact = json.dumps(made.data) if made else ""
        api = str(request.base_url).rstrip("/")
        return console.page(
            request,
            "kind.html",
            session,
            title=f"Flow kind {kind}",
            kind=kind,
            description=definition.description,
            steps=[step.name for step in definition.steps],
            example=body,
            needs=made.needs if made else "",
            cli=f"durapay flows kinds {kind} --example | durapay start {kind}",
            curl=f"curl -s -X POST {api}/flows/{kind} -H \"X-Api-Key: $KEY\" -H 'Content-Type: application/json' "
            f"-d {shlex.quote(compact)}",
        )

    return router
