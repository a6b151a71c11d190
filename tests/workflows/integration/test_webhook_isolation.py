"""Webhook deliveries run apart from payment steps (issue 37, finding 3): their own queue and pool.

Deliveries used to share the flows' Celery queue and threads: an endpoint that trickles its answer, or
never answers, held a worker thread per delivery (past the lease another thread took the delivery
again), until no thread was left for a payment step. Here the steps' worker and the deliveries' worker
consume a queue each (``config.celery``: ``QUEUE``, ``WEBHOOK_QUEUE``), as ``durapay worker`` and
``durapay worker --webhooks`` do, and a payment finishes while slow endpoints hold every delivery thread.
"""

from __future__ import annotations

import random
from contextlib import ExitStack

import pytest
from celery.contrib.testing.worker import start_worker

from bench._slow_receiver import SlowReceiver
from durapay.config.celery import QUEUE, WEBHOOK_QUEUE
from durapay.service.heartbeat import worker_roles
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.dispatcher import Dispatcher
from durapay.workflows.states import FlowState
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_flows import APPROVE, card, order

pytestmark = pytest.mark.integration


def test_a_payment_flow_finishes_while_every_delivery_thread_is_held_by_slow_endpoints(
    redis_url: str, key_prefix: str, simulator: SimulatorServer
) -> None:
    # Each attempt may last its whole deadline (61 s): far longer than a payment takes.
    hooks_settings = {"allow_private": True, "timeout": 60.0, "connect_timeout": 1.0, "lease_seconds": 150.0}
    settings = stack_settings(key_prefix, simulator.base_url, webhooks=hooks_settings)
    steps = build_runtime(settings, redis_url=redis_url, rng=random.Random(3))
    deliveries = build_runtime(settings, redis_url=redis_url, rng=random.Random(4))
    with (
        SlowReceiver("trickle", every=0.5, length=100_000) as trickling,
        SlowReceiver("silent", every=0.05) as silent,
        ExitStack() as stack,
    ):
        stack.callback(steps.close)
        stack.callback(deliveries.close)
        stack.enter_context(start_worker(steps.celery, pool="threads", concurrency=2, perform_ping_check=False, queues=[QUEUE]))
        stack.enter_context(
            start_worker(
                deliveries.celery,
                pool="threads",
                concurrency=2,
                perform_ping_check=False,
                queues=[WEBHOOK_QUEUE],
                shutdown_timeout=30,
            )
        )
        # (Callbacks run last first: the endpoints let go before the workers are asked to stop.)
        stack.callback(silent.release)
        stack.callback(trickling.release)
        assert worker_roles(steps.celery) == ["worker"] and worker_roles(deliveries.celery) == ["webhooks"]
        dispatcher = Dispatcher(steps.engine, interval=0.05, tickers=[steps.webhooks.tick]).start()
        stack.callback(dispatcher.stop)
        engine = steps.engine
        steps.webhooks.endpoints.add(trickling.url)
        steps.webhooks.endpoints.add(silent.url)

        first = engine.wait(engine.start("moto", {"order": order(), "card": card(APPROVE)}).id, 30)
        assert first.state is FlowState.SUCCEEDED
        # Its events go to both endpoints, one task each: both delivery threads are held.
        wait_until(lambda: trickling.held == 1 and silent.held == 1, 30, "every delivery thread held by a slow endpoint")

        second = engine.wait(engine.start("moto", {"order": order(), "card": card(APPROVE)}).id, 20)
        assert second.state is FlowState.SUCCEEDED, second.summary()
        assert trickling.held == 1 and silent.held == 1, "the payment ran while the slow endpoints still held their threads"
