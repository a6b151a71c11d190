"""Webhook deliveries run apart from payment steps (issue 37, finding 3): their own queue and workers.

Deliveries used to share the flows' Celery queue and threads: an endpoint that trickles its answer, or
never answers, held a worker thread per delivery (past the lease another thread took the delivery
again), until no thread was left for a payment step. Here the steps run on a worker consuming the
steps' queue (``config.celery``: ``QUEUE``) and the deliveries on a real ``durapay worker --webhooks``
process (``WEBHOOK_QUEUE``), as deployed: a payment finishes while slow endpoints hold every delivery
thread, and a deliveries worker asked to stop while they hold its threads stops once each attempt's
deadline (connect + timeout, ``gateway._deadline``) ends it.

The deliveries' worker is a process of its own, never a second in-process Celery worker: two workers in
one process share kombu's event loop (``kombu.asynchronous.get_event_loop``) and Celery's worker state,
so that one's consumer read the other's sockets and hung (the flakiness this test once had).
"""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from bench._slow_receiver import SlowReceiver
from durapay.config import Settings
from durapay.config.celery import QUEUE
from durapay.service.heartbeat import worker_roles
from durapay.service.processes import Child, settings_env
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_flows import APPROVE, card, order

pytestmark = pytest.mark.integration

#: Threads of the deliveries worker: the slow endpoints hold them all.
THREADS = 2
#: Bounds on waiting (a child process starting on a loaded 2-core machine, a payment beside it).
START_WAIT = 120.0
PAY_WAIT = 90.0


def deliveries_worker(settings: Settings, redis_url: str, logs: Path) -> Child:
    """``durapay worker --webhooks`` with :data:`THREADS` threads, on the test's settings and store."""
    env = settings_env(settings, redis_url=redis_url)
    extra = ["--webhooks", "--concurrency", str(THREADS), "--loglevel", "warning", "--hostname", "webhooks-test@%h"]
    return Child("worker", "webhooks", env, logs, extra)


def stopped(worker: Child, bound: float) -> int:
    """SIGTERM (a warm shutdown: running tasks end first), then the exit status once it has exited."""
    assert worker.process is not None
    worker.process.send_signal(signal.SIGTERM)
    wait_until(lambda: not worker.alive, bound, "the deliveries worker to exit after SIGTERM")
    code = worker.returncode
    assert code is not None
    return code


def held(*receivers: SlowReceiver) -> int:
    return sum(receiver.held for receiver in receivers)


def requests(*receivers: SlowReceiver) -> int:
    return sum(receiver.requests for receiver in receivers)


@pytest.fixture
def runtimes(redis_url: str) -> Iterator[list[Runtime]]:
    built: list[Runtime] = []
    yield built
    for runtime in built:
        runtime.close()


def _runtime(runtimes: list[Runtime], settings: Settings, redis_url: str, seed: int) -> Runtime:
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(seed))
    runtimes.append(runtime)
    return runtime


def test_a_payment_flow_finishes_while_every_delivery_thread_is_held_by_slow_endpoints(
    redis_url: str, key_prefix: str, simulator: SimulatorServer, tmp_path: Path, runtimes: list[Runtime]
) -> None:
    # Each attempt may last its whole deadline (61 s): the endpoints hold their threads until released.
    hooks: dict[str, Any] = {"allow_private": True, "timeout": 60.0, "connect_timeout": 1.0, "lease_seconds": 150.0}
    settings = stack_settings(key_prefix, simulator.base_url, webhooks=hooks)
    steps = _runtime(runtimes, settings, redis_url, 3)
    with (
        SlowReceiver("trickle", every=0.5, length=100_000) as trickling,
        SlowReceiver("silent", every=0.05) as silent,
        ExitStack() as stack,
    ):
        deliveries = deliveries_worker(settings, redis_url, tmp_path).start()
        stack.callback(deliveries.stop)  # (callbacks run last first: released, then stopped)
        stack.enter_context(start_worker(steps.celery, pool="threads", concurrency=2, perform_ping_check=False, queues=[QUEUE]))
        assert worker_roles(steps.celery) == ["worker"]  # the steps' queue only
        dispatcher = Dispatcher(steps.engine, interval=0.05, tickers=[steps.webhooks.tick]).start()
        stack.callback(dispatcher.stop)
        stack.callback(silent.release)
        stack.callback(trickling.release)
        engine = steps.engine
        steps.webhooks.endpoints.add(trickling.url)
        steps.webhooks.endpoints.add(silent.url)

        first = engine.wait(engine.start("moto", {"order": order(), "card": card(APPROVE)}).id, PAY_WAIT)
        assert first.state is FlowState.SUCCEEDED
        # Its events go to both endpoints, a task per endpoint (and per tick): every delivery thread held.
        wait_until(lambda: held(trickling, silent) == THREADS, START_WAIT, "every delivery thread held by a slow endpoint")
        assert requests(trickling, silent) == THREADS

        second = engine.wait(engine.start("moto", {"order": order(), "card": card(APPROVE)}).id, PAY_WAIT)
        assert second.state is FlowState.SUCCEEDED, second.summary()
        # The same two attempts held their threads all along (no attempt ended, none began).
        assert held(trickling, silent) == THREADS and requests(trickling, silent) == THREADS

        dispatcher.stop()
        trickling.release()
        silent.release()
        assert stopped(deliveries, 60.0) == 0


def test_a_deliveries_worker_stops_while_slow_endpoints_hold_its_threads_each_attempt_ends_at_its_deadline(
    redis_url: str, key_prefix: str, simulator: SimulatorServer, tmp_path: Path, runtimes: list[Runtime]
) -> None:
    """Nothing releases the endpoints here: the worker, asked to stop (a deploy, a scale-down), waits
    for its running deliveries, and each ends at its deadline, failed and due again, never sent twice."""
    hooks: dict[str, Any] = {"allow_private": True, "timeout": 4.0, "connect_timeout": 0.5, "lease_seconds": 60.0}
    settings = stack_settings(key_prefix, simulator.base_url, webhooks=hooks)
    side = _runtime(runtimes, settings, redis_url, 5)  # starts the flow and hands deliveries out; runs no step
    webhooks = side.webhooks
    with (
        SlowReceiver("trickle", every=0.2, length=100_000) as trickling,
        SlowReceiver("silent", every=0.05) as silent,
        ExitStack() as stack,
    ):
        deliveries = deliveries_worker(settings, redis_url, tmp_path).start()
        stack.callback(deliveries.stop)
        endpoints = [webhooks.endpoints.add(trickling.url), webhooks.endpoints.add(silent.url)]
        side.engine.start("moto", {"order": order(), "card": card(APPROVE)})  # its flow.created event

        def handed_out_and_held() -> bool:
            webhooks.tick()  # fan the event out, send the due deliveries (each taken for the lease)
            return held(trickling, silent) == THREADS

        wait_until(handed_out_and_held, START_WAIT, "both deliveries held by their slow endpoints")
        assert stopped(deliveries, 60.0) == 0, deliveries.log_path.read_text()[-2000:]

        # Each endpoint saw its client give up (the attempt's deadline), and each attempt is recorded
        # failed by timeout, due again later: the worker stopped once its attempts had ended.
        wait_until(lambda: trickling.cut == 1 and silent.cut == 1, 30, "both endpoints to see the client give up")
        assert requests(trickling, silent) == THREADS and trickling.finished == 0
        for endpoint in endpoints:
            [attempt] = webhooks.attempts(endpoint.id)
            assert not attempt["ok"] and attempt["outcome"] == "retry", attempt
            assert attempt["error"].startswith(("TimeoutError", "DeadlinePassed")), attempt
        assert webhooks.pending() == THREADS  # one event, its two deliveries due again: nothing lost
