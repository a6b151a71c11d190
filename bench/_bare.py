"""The baseline: a bare Celery chain making the same gateway calls as a durable 3-step flow, with no record.

init → payment, two tasks, as the durable flow runs for a frictionless card (its challenge wait, 3DS
validation and settle read are skipped, so it too sends two tasks); the last task pushes its finish time
to a Redis list so the benchmark can time it. No claims, no record, no idempotency.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery

from durapay.config import Settings
from durapay.config.celery import make_celery
from durapay.gateway import THREEDS_NOT_NEEDED, Catalogue, GatewayClient

DONE = "bare:done"


def make_bare_app(settings: Settings) -> Celery:
    app = make_celery(settings, settings.broker_url or settings.redis_url)  # the durable side's broker, as it is
    app.conf.task_default_queue = "bare"
    holder: dict[str, Any] = {}

    def client() -> GatewayClient:
        if "client" not in holder:
            holder["client"] = GatewayClient(settings.gateway)
            holder["redis"] = redis.Redis.from_url(settings.redis_url)
        gateway: GatewayClient = holder["client"]
        return gateway

    @app.task(name="bare.init", shared=False)  # type: ignore[untyped-decorator]
    def init(body: dict[str, Any]) -> dict[str, Any]:
        answer = client().call(Catalogue.three_steps_init, request=body)
        return {"body": body, "operationId": answer.operation.operationId, "challenge": answer.threeDSAuthRequest}

    @app.task(name="bare.payment", shared=False)  # type: ignore[untyped-decorator]
    def payment(state: dict[str, Any]) -> None:
        if state["challenge"] and state["challenge"] != THREEDS_NOT_NEEDED:
            raise RuntimeError("the baseline only runs frictionless cards")
        body = state["body"]
        request = {"operationId": state["operationId"], "order": body["order"], "card": body["card"]}
        client().call(Catalogue.three_steps_payment, request=request)
        holder["redis"].rpush(DONE, f"{body['order']['orderId']} {time.time()!r}")

    return app


def bare_chain(app: Celery, body: dict[str, Any]) -> None:
    from celery import chain

    chain(
        app.signature("bare.init", args=(body,), queue="bare"),
        app.signature("bare.payment", queue="bare"),
    ).apply_async()
