"""The whole machine for integration tests: runtime on a real Valkey, a real Celery worker (threads) in
process, any number of dispatchers ticking the schedules, the simulator over HTTP, a notification
receiver, and one shared manual clock that tests move (never sleep for).

::

    with Stack(redis_url, prefix, sim, receiver) as stack:
        stack.start_worker()
        stack.start_dispatchers(2)
        record = stack.schedules.create({...})
        stack.clock.set(...)
        stack.wait_until(lambda: ..., what="the first charge")

The receiver stands in for durapay's own: it checks the notification's security token against those
the engine kept for the order, then signals the waiting flow (docs/durability.md, Notifications).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import uvicorn
from celery.contrib.testing.worker import start_worker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from durapay.config import load_settings
from durapay.gateway import Catalogue, GatewayClient, GatewayError, parse_notification, verify_security_token
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.schedules import Attempt, Schedules, ScheduleState, policy
from tests.waiting import wait_until

T = TypeVar("T")
APPROVE_PAN = "4349940199004549"


class Receiver:
    """A notification endpoint that checks the token and signals the flow of the order."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.accepted: list[dict[str, Any]] = []
        self.refused = 0
        app = Starlette(routes=[Route("/notifications", self._notify, methods=["POST"])])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="receiver", daemon=True)

    async def _notify(self, request: Request) -> JSONResponse:
        body = await request.body()
        engine = self.engine
        try:
            notification = parse_notification(body)
            order_id = notification.order_id or ""
            flow_id = engine.flow_for_order(order_id) if engine else None
            if engine is None or flow_id is None:
                raise LookupError(f"no flow waits for order {order_id!r}")
            verify_security_token(notification, engine.tokens_for_order(order_id))
        except (GatewayError, LookupError) as exc:
            self.refused += 1
            return JSONResponse({"outcome": "KO", "error": str(exc)}, status_code=400)
        engine.signal(flow_id, "notification", json.loads(body), by="notification")
        self.accepted.append(json.loads(body))
        return JSONResponse({"outcome": "OK"})

    def start(self) -> Receiver:
        self._thread.start()
        wait_until(lambda: self._server.started, timeout=10, what="the receiver to start")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/notifications"


class Stack:
    """Runtime, worker, dispatchers and clock for one test; stops everything it started on exit."""

    def __init__(
        self,
        redis_url: str,
        key_prefix: str,
        sim: SimulatorServer,
        receiver: Receiver,
        *,
        clock: ManualClock | None = None,
        data_dir: Path | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.sim = sim
        self.receiver = receiver
        self.clock = clock or ManualClock(time.time())
        overrides: dict[str, Any] = {
            "redis_url": redis_url,
            "engine": {"key_prefix": key_prefix, "partitions": 4, "lease_seconds": 30, "dispatch_interval": 0.02},
            "gateway": {"base_url": sim.base_url, "timeout": 5.0},
            "receiver": {"public_url": receiver.url},
            "retry": {"base_seconds": 0.05, "cap_seconds": 1.0, "max_attempts": 5, "reconcile_attempts": 5},
        }
        if data_dir is not None:
            overrides["data_dir"] = str(data_dir)
        for name, value in (settings or {}).items():  # more settings (a cluster's); groups are merged
            overrides[name] = {**overrides.get(name, {}), **value} if isinstance(value, dict) else value
        self.settings = load_settings(overrides)
        self.runtime: Runtime = build_runtime(self.settings, redis_url=redis_url, clock=self.clock)
        self.engine = self.runtime.engine
        self.schedules = Schedules(self.engine)
        receiver.engine = self.engine
        self.dispatchers: list[Dispatcher] = []
        self.others: list[Runtime] = []
        self._exits = contextlib.ExitStack()
        self._ids = itertools.count(1)

    # -- parts ----------------------------------------------------------------------------------------

    def start_worker(self) -> None:
        self._exits.enter_context(
            start_worker(self.runtime.celery, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=20)
        )

    def stop_worker(self) -> None:
        self._exits.close()
        self._exits = contextlib.ExitStack()

    def start_dispatchers(self, count: int = 1, schedules: list[Schedules] | None = None) -> None:
        for number in range(count):
            ticking = schedules[number] if schedules else self.schedules
            self.dispatchers.append(Dispatcher(ticking.engine, tickers=[ticking.tick], interval=0.02, name=f"d{number}").start())

    def another_scheduler(self, batch: int = 500) -> Schedules:
        """Schedules on a second runtime (its own engine, Redis connections and Celery app): a second process."""
        runtime = build_runtime(self.settings, redis_url=self.redis_url, clock=self.clock)
        self.others.append(runtime)
        return Schedules(runtime.engine, batch=batch)

    def stop_dispatchers(self) -> None:
        for dispatcher in self.dispatchers:
            dispatcher.stop()
        self.dispatchers = []

    def close(self) -> None:
        self.stop_dispatchers()
        self.stop_worker()
        for runtime in [*self.others, self.runtime]:
            runtime.close()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- helpers ----------------------------------------------------------------------------------------

    def wait_until(self, probe: Callable[[], T], *, timeout: float = 30.0, what: str = "condition") -> T:
        return wait_until(probe, timeout=timeout, what=what)

    def settle(self, moment: float) -> None:
        """Move the clock to ``moment`` and wait until every dispatcher has ticked at least once after it."""
        self.clock.set(moment)
        heartbeat = self.engine.keys.heartbeat("scheduler")
        for _ in range(2):  # the first beat may come from a tick that began before the move
            self.engine.redis.delete(heartbeat)
            self.wait_until(lambda: self.engine.redis.get(heartbeat) == repr(moment).encode(), what="a dispatcher tick")

    def move(self, moment: float) -> None:
        """Move durapay's clock and the simulator's to ``moment`` (a contract's days are the simulator's)."""
        self.sim.admin.set_clock(datetime.fromtimestamp(moment, UTC))
        self.clock.set(moment)

    def gateway(self) -> GatewayClient:
        return GatewayClient(self.settings.gateway)

    def contract(self, *, frequency: str | None = None) -> str:
        """A MIT_SCHEDULED contract made by a first payment (three steps, frictionless card), with
        ``contractFrequency`` when given (the simulator then refuses a charge sooner, counted from that
        first payment: set its clock first, :meth:`move`)."""
        contract_id = f"ctr-{next(self._ids)}-{int(time.monotonic() * 1000) % 100000}"
        order = {"orderId": f"first-{contract_id}", "amount": "100", "currency": "EUR"}
        card = {"pan": APPROVE_PAN, "expiryDate": "1230", "cvv": "123"}
        recurrence = {"action": "CONTRACT_CREATION", "contractId": contract_id, "contractType": "MIT_SCHEDULED"}
        if frequency is not None:
            recurrence["contractFrequency"] = frequency
        with self.gateway() as client:
            init = client.call(Catalogue.three_steps_init, request={"order": order, "card": card, "recurrence": recurrence})
            client.call(
                Catalogue.three_steps_payment,
                request={"operationId": init.operation.operationId, "order": order, "card": card, "recurrence": recurrence},
            )
        return contract_id

    def mit_operations(self, prefix: str = "") -> list[dict[str, Any]]:
        """MIT payments the simulator recorded (oldest first), optionally for order ids starting with ``prefix``."""
        found = self.sim.admin.operations(operation="create_mit_order")
        return [op for op in found if str(op.get("orderId", "")).startswith(prefix)]


def stop_on_a_gone_flow(schedules: Schedules, schedule_id: str) -> Attempt:
    """Leave a schedule where an expired flow leaves it, through the policy and the store (no clock to
    move, no flow started): its first occurrence fired, its flow seen to exist and then expired before
    the schedule read its outcome, so the look that found it gone stopped the schedule in
    ``needs_attention``. Returns that occurrence's open attempt."""
    record = schedules.get(schedule_id)
    assert record.next_at is not None
    fired = policy.advance(record, record.next_at, {}, schedules.flow_kind, schedules.caps)
    for attempt in fired.record.open:
        attempt.created = True
    looked = policy.advance(fired.record, record.next_at + schedules.caps.check_seconds, {}, schedules.flow_kind, schedules.caps)
    assert looked.record.state is ScheduleState.NEEDS_ATTENTION, looked.record.reason
    assert schedules.store.update(record, looked.record, [*fired.events, *looked.events], schedules.engine.clock.now())
    (attempt,) = looked.record.open
    return attempt


@contextlib.contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()
