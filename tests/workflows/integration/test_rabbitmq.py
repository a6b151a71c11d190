"""RabbitMQ as the Celery broker (opt-in: set ``DURAPAY_TEST_AMQP_URL``, e.g.
``amqp://guest:guest@127.0.0.1:5672//``; skipped otherwise, so the suite needs no RabbitMQ).

Only the step messages go through RabbitMQ; the flows stay in Valkey. Shown: the flow kinds of the
3-step family succeed, 50 flows started at once all succeed, each charged once, and a flow whose message
was never consumed (sent while no worker ran, then purged) is sent again by the dispatcher.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from celery.contrib.testing.worker import start_worker

from durapay.config.celery import QUEUE
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from tests.workflows.integration import test_flows as flows
from tests.workflows.integration.conftest import Stack, stack_settings
from tests.workflows.integration.test_exactly_once import payments

AMQP_URL = os.environ.get("DURAPAY_TEST_AMQP_URL", "")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not AMQP_URL, reason="set DURAPAY_TEST_AMQP_URL to run the RabbitMQ tests"),
]


@pytest.fixture
def amqp_stack(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Stack]:
    simulator.admin.clear_faults()
    settings = stack_settings(key_prefix, simulator.base_url, broker_url=AMQP_URL)
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(19))
    assert runtime.celery.conf.broker_url.startswith(("amqp", "pyamqp"))
    dispatcher = Dispatcher(runtime.engine, interval=0.05)
    with ExitStack() as stack:
        stack.callback(runtime.close)
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=4, perform_ping_check=False))
        dispatcher.start()
        stack.callback(dispatcher.stop)
        yield Stack(runtime, simulator, dispatcher)


def test_flows_run_with_rabbitmq_as_the_broker(amqp_stack: Stack) -> None:
    flows.test_moto_success_and_decline(amqp_stack)
    flows.test_three_steps_frictionless_challenge_and_failures(amqp_stack)
    engine = amqp_stack.engine
    started = [engine.start("moto", {"order": flows.order(), "card": flows.card()}).id for _ in range(50)]
    done = [engine.wait(flow_id, 60) for flow_id in started]
    assert [record.state for record in done] == [FlowState.SUCCEEDED] * 50
    assert all(len(payments(amqp_stack.simulator, record.orders)) == 1 for record in done)


def test_a_message_lost_in_rabbitmq_is_sent_again_by_the_dispatcher(
    redis_url: str, key_prefix: str, simulator: SimulatorServer
) -> None:
    settings = stack_settings(key_prefix, simulator.base_url, broker_url=AMQP_URL)
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(23))
    try:
        started = runtime.engine.start("moto", {"order": flows.order(), "card": flows.card()})
        with runtime.celery.connection_for_write() as connection:
            connection.default_channel.queue_purge(QUEUE)  # the message is gone
        dispatcher = Dispatcher(runtime.engine, interval=0.05).start()
        with start_worker(runtime.celery, pool="threads", concurrency=2, perform_ping_check=False):
            done = runtime.engine.wait(started.id, 60)
        dispatcher.stop()
        assert done.state is FlowState.SUCCEEDED, done.summary()
        assert len(payments(simulator, done.orders)) == 1
    finally:
        runtime.close()
