"""``/healthz``, ``/readyz``, ``/metrics``: what orchestrators and Prometheus ask.

* ``/healthz`` - the process answers (liveness). Open, like the receiver: it says nothing but "ok".
* ``/readyz`` - Redis answers, a worker heartbeat, a deliveries worker's (``webhooks``: without one
  no webhook is ever sent) and a scheduler heartbeat are present (see ``heartbeat``). 503 with the
  failing checks otherwise. Needs the API key.
* ``/metrics`` - Prometheus text (see ``metrics``). Needs the API key (``X-Api-Key`` or a bearer token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from fastapi import APIRouter
from fastapi.params import Depends
from fastapi.responses import JSONResponse, PlainTextResponse

from durapay.service.errors import ERRORS
from durapay.service.metrics import render
from durapay.service.schemas import Health, Readiness
from durapay.workflows.engine import Engine

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def readiness(engine: Engine) -> dict[str, bool]:
    checks = {"redis": False, "worker": False, "webhooks": False, "scheduler": False}
    try:
        checks["redis"] = bool(engine.redis.ping())
        for role in ("worker", "webhooks", "scheduler"):
            checks[role] = bool(engine.redis.exists(engine.keys.heartbeat(role)))
    except redis.RedisError:
        pass
    return checks


def ops_router(engine: Engine, protected: Sequence[Depends]) -> APIRouter:
    router = APIRouter(tags=["operations"])

    # Refusals of the gate are JSON, also on /metrics (whose own answer is text: FastAPI would document
    # every answer of the route in its media type).
    guarded: dict[int | str, dict[str, Any]] = {
        status: {**ERRORS[status], "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        for status in (401, 413, 429)
    }

    @router.get("/healthz", response_model=Health, summary="Liveness: the process answers (no key needed)")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/readyz",
        response_model=Readiness,
        responses={**guarded, 503: {"model": Readiness, "description": "not ready: the failing checks are false"}},
        summary="Readiness: Redis, a worker, a deliveries worker and a scheduler are alive",
        dependencies=list(protected),
    )
    def readyz() -> JSONResponse:
        checks = readiness(engine)
        ready = all(checks.values())
        body: dict[str, Any] = {"ready": ready, "checks": checks}
        return JSONResponse(body, status_code=200 if ready else 503)

    @router.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
        responses={**guarded, 200: {"content": {PROMETHEUS_TEXT: {"schema": {"type": "string"}}}}},
        dependencies=list(protected),
    )
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(render(engine), media_type=PROMETHEUS_TEXT)

    return router
