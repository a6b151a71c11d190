"""The console's Webhooks page: each endpoint with its latest attempt and when the next one comes, and,
for an operator, "Deliver pending now" (``Webhooks.deliver_now``, the same call as
``POST /webhooks/{id}/deliver-now`` and ``durapay webhooks deliver``): after a receiver's outage its
deliveries waiting out a backoff of minutes or hours are made due at once. Endpoints are added, rotated
and removed with the API or the CLI (their secrets are never shown here)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from durapay.service.console.session import PATH
from durapay.service.console.web import Console, query, redirect, to_login
from durapay.workflows.webhooks import Endpoint, Webhooks

#: Endpoints listed on the page (the API lists them all).
SHOWN = 200


def _row(webhooks: Webhooks, endpoint: Endpoint) -> dict[str, Any]:
    latest = webhooks.attempts(endpoint.id, limit=1)
    return endpoint.view() | {"latest": latest[0] if latest else None}


def webhook_router(console: Console, webhooks: Webhooks) -> APIRouter:
    router = APIRouter(prefix=f"{PATH}/webhooks", include_in_schema=False)

    @router.get("")
    def page(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return to_login(request)
        endpoints = webhooks.endpoints.all()[:SHOWN]
        done = request.query_params.get("due_now", "")
        return console.page(
            request,
            "webhooks.html",
            session,
            title="Webhooks",
            rows=[_row(webhooks, endpoint) for endpoint in endpoints],
            pending=webhooks.pending(),
            done=int(done) if done.isdigit() else None,
            endpoint=request.query_params.get("endpoint", ""),
        )

    @router.post("/{endpoint_id}/deliver-now")
    async def deliver_now(request: Request, endpoint_id: str) -> Response:
        posted = await console.operator_post(request)
        if isinstance(posted, Response):
            return posted
        session, _ = posted
        if webhooks.endpoints.get(endpoint_id) is None:
            return console.refuse(request, session, 404, "No such endpoint", f"no webhook endpoint {endpoint_id!r}")
        moved = webhooks.deliver_now(endpoint_id)
        return redirect(f"{PATH}/webhooks?{query({'endpoint': endpoint_id, 'due_now': moved})}")

    return router
