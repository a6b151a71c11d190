"""Fixtures for the HTTP surface: a runtime on the test Valkey, the app served by uvicorn on a free port.

Receiver and API tests need flows that *wait for a notification* without a gateway: the ``notified``
kind below keeps a security token from its input (as a gateway create step would from its answer)
and then waits for ``notification``. Its steps are run in the test process with ``engine.run_step``;
nothing is sent to Celery (``engine.sender`` is None), so a resumed flow stays ``ready`` and each
resume is visible exactly once in its log.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from durapay.config import Settings, load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.gateway import Catalogue
from durapay.service.app import create_app
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.tasks.outcomes import Advance, Finish, Outcome
from durapay.tasks.runner import StepContext
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import Call, CallStep, FlowDefinition, WaitStep

API_KEY = "test-api-key-0123456789"


class NotifiedInput(BaseModel):
    orderId: str
    token: str


class _KeepToken(CallStep):
    """Stands in for a gateway create step: its output carries the order's security token."""

    def execute(self, ctx: StepContext) -> Outcome:
        return Advance({"securityToken": ctx.input.token, "hostedPage": f"https://pay.example/{ctx.input.orderId}"})


NOTIFIED = FlowDefinition(
    "notified",
    NotifiedInput,
    (
        # A POST that opens nothing at the gateway: this stand-in tests the HTTP surface and the receiver; the
        # rule for waits on a real page or link (money in flight until the gateway says it is over, a cancel
        # that closes first) is tested on the real flows (tests/workflows/flows/test_waits.py).
        _KeepToken("create", Catalogue.create_reservation, lambda ctx: Call(), customer_url=lambda out: out.get("hostedPage")),
        WaitStep(
            "payment",
            ("notification", "paid"),
            lambda ctx, name, payload: Finish(not payload.get("fail"), "notified", {"notification": payload}),
            lambda ctx: Finish(False, "no notification by the deadline"),
            timeout=lambda ctx: 3600.0,
        ),
    ),
    lambda data, outputs: {"orderId": data.orderId},
    lambda data: str(data.orderId),
    "test flow: keeps a token, waits for a notification",
    order_field="orderId",
)


def service_settings(key_prefix: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "api": {"key": API_KEY, "start_wait_seconds": 2.0},
        "gateway": {"timeout": 3.0, "connect_timeout": 1.0},
        "engine": {"key_prefix": key_prefix, "partitions": 2, "lease_seconds": 5.0},
        "receiver": {"max_body_bytes": 4096},
    }
    for group, value in overrides.items():
        values[group] = {**values.get(group, {}), **value} if isinstance(value, dict) else value
    return load_settings(values)


@pytest.fixture(scope="session")
def api_document(redis_url: str) -> dict[str, Any]:
    """The app's OpenAPI document (the same for every test's runtime here: built once, a few seconds)."""
    built = build_runtime(service_settings("apidoc"), redis_url=redis_url, flows={"notified": NOTIFIED})
    built.engine.sender = None
    try:
        return create_app(built).openapi()
    finally:
        built.close()


def service_runtime(redis_url: str, key_prefix: str) -> Iterator[Runtime]:
    built = build_runtime(service_settings(key_prefix), redis_url=redis_url, flows={"notified": NOTIFIED})
    built.engine.sender = None
    yield built
    built.close()


@pytest.fixture
def runtime(redis_url: str, key_prefix: str) -> Iterator[Runtime]:
    yield from service_runtime(redis_url, key_prefix)


@pytest.fixture(scope="module")
def own_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey of one test file's own, for a test that reads the whole store after each of thousands of
    requests: on the session's shared server every SCAN also walks each earlier test's keys (in the suite,
    minutes instead of seconds). ``DURAPAY_REDIS_URL``, when set, is used as given."""
    configured = os.environ.get("DURAPAY_REDIS_URL")
    if configured:
        yield configured
        return
    server = EmbeddedValkey(Path(tmp_path_factory.mktemp("own-valkey")))
    server.start()
    yield server.url
    server.stop()


@dataclass
class Served:
    runtime: Runtime
    server: ApiServer
    http: httpx.Client

    @property
    def engine(self) -> Engine:
        return self.runtime.engine

    @property
    def url(self) -> str:
        return self.server.url

    def counter(self, name: str) -> int:
        return int(self.engine.redis.get(self.engine.keys.counter(f"notifications_{name}")) or 0)


@pytest.fixture
def served(runtime: Runtime) -> Iterator[Served]:
    with ApiServer(create_app(runtime)) as server, httpx.Client(base_url=server.url, timeout=10.0) as http:
        yield Served(runtime, server, http)


def waiting_flow(engine: Engine, order_id: str, token: str) -> str:
    """A ``notified`` flow waiting for its notification, with ``token`` kept for ``order_id``."""
    record = engine.start("notified", {"orderId": order_id, "token": token})
    assert engine.run_step(record.id, "create") == FlowState.READY.value
    assert engine.run_step(record.id, "payment") == FlowState.WAITING.value
    return record.id


def notification(order_id: str, token: str | None, event_id: str = "ev-1", result: str = "EXECUTED") -> dict[str, Any]:
    body: dict[str, Any] = {
        "eventId": event_id,
        "eventTime": "2026-01-01T10:00:00.000Z",
        "operation": {"orderId": order_id, "operationId": f"op-{order_id}", "operationResult": result},
    }
    if token is not None:
        body["securityToken"] = token
    return body


def signals_in_log(engine: Engine, flow_id: str, name: str = "notification") -> int:
    return sum(1 for entry in engine.history(flow_id) if entry.get("what") == f"signal {name}")


@pytest.fixture
def live(redis_url: str, key_prefix: str) -> Iterator[Served]:
    """The app over HTTP with a real Celery worker (threads pool) running the flows' steps."""
    from celery.contrib.testing.worker import start_worker

    built = build_runtime(service_settings(key_prefix), redis_url=redis_url, flows={"notified": NOTIFIED})
    with (
        start_worker(built.celery, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10),
        ApiServer(create_app(built)) as server,
        httpx.Client(base_url=server.url, timeout=10.0, headers={"X-Api-Key": API_KEY}) as http,
    ):
        yield Served(built, server, http)
    built.close()
