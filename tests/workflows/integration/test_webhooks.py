"""Webhooks end to end: flows on the simulator, a real Celery worker delivering from the due set to a
real receiver on 127.0.0.1 (checking signatures with the ``standardwebhooks`` package)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from celery.contrib.testing.worker import start_worker

from bench._webhook_receiver import WebhookReceiver
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_flows import APPROVE, DECLINE, card, order

pytestmark = pytest.mark.integration


@pytest.fixture
def hooked(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Runtime]:
    settings = stack_settings(key_prefix, simulator.base_url, webhooks={"allow_private": True, "lease_seconds": 30.0})
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(3))
    with ExitStack() as stack:
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=4, perform_ping_check=False))
        dispatcher = Dispatcher(runtime.engine, interval=0.05, tickers=[runtime.webhooks.tick]).start()
        stack.callback(dispatcher.stop)
        yield runtime
    runtime.close()


def test_a_worker_delivers_each_event_of_real_flows_signed(hooked: Runtime) -> None:
    with WebhookReceiver() as receiver:
        endpoint = hooked.webhooks.endpoints.add(receiver.url)
        receiver.secrets = [endpoint.secret]
        engine = hooked.engine
        ok = engine.start("moto", {"order": order(), "card": card(APPROVE)})
        declined = engine.start("moto", {"order": order(), "card": card(DECLINE)})
        for record in (ok, declined):
            engine.wait(record.id, 30)
        expected = {event.id: event.wire() for event, _ in engine.events()}
        wait_until(lambda: set(receiver.applied) == set(expected), 30, "every event delivered")
        assert receiver.refused == 0 and receiver.applied == expected
        types = {(body["flow"], body["type"]) for body in receiver.applied.values()}
        assert {(ok.id, "flow.succeeded"), (declined.id, "flow.failed")} <= types
        failed = next(body for body in receiver.applied.values() if body["type"] == "flow.failed")
        assert failed["orderId"] and failed["data"]["decline"] in ("soft", "hard")
        assert all(APPROVE not in str(body) and DECLINE not in str(body) for body in receiver.applied.values())
        wait_until(lambda: hooked.webhooks.pending() == 0, 10, "no delivery left")
