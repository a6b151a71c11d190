"""Notifications: POST ``{eventId, eventTime, securityToken, operation}`` to the merchant, at least once.

Each outcome of an order whose creation carried ``notificationUrl`` becomes one event. A background
sender delivers it; while the receiver does not answer 2xx it retries with exponential backoff and
seeded jitter, up to ``notify_max_attempts`` tries, then gives up (the gateway "does not verify the
outcome of the notification", docs/gateway.md). Notification faults can drop, delay, duplicate an
event or send it with a wrong token. Every attempt is logged for ``/_sim/notifications``.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from durapay.simulator._clock import Clock, iso
from durapay.simulator._config import SimulatorConfig
from durapay.simulator._faults import Faults
from durapay.simulator._scheduler import Scheduler

log = logging.getLogger("simulator")
USER_AGENT = "durapay-simulator (Apache-HttpClient/4.5.13 compatible)"


@dataclass
class Delivery:
    """One event and every attempt to deliver it."""

    eventId: str
    url: str
    orderId: str
    operationId: str
    operationResult: str
    createdBy: str
    body: dict[str, Any]
    state: str = "pending"  # pending | delivered | failed | dropped
    deliveries: int = 0
    duplicate: bool = False
    wrongToken: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)


class Notifier:
    """Sends notifications from a small thread pool; attempts are started by the scheduler."""

    def __init__(self, config: SimulatorConfig, clock: Clock, faults: Faults, scheduler: Scheduler) -> None:
        self._config = config
        self._clock = clock
        self._faults = faults
        self._scheduler = scheduler
        self._lock = threading.Lock()
        self._rng = random.Random(config.seed)
        self._log: dict[str, Delivery] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._http: httpx.Client | None = None

    def start(self) -> None:
        self._http = httpx.Client(timeout=self._config.notify_timeout_seconds, headers={"User-Agent": USER_AGENT})
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="simulator-notify")

    def stop(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        if self._http is not None:
            self._http.close()
            self._http = None

    def reset(self) -> None:
        with self._lock:
            self._log.clear()
            self._rng = random.Random(self._config.seed)

    def notify(self, url: str, security_token: str, operation: dict[str, Any], created_by: str) -> str:
        """Queue one event; returns its ``eventId``. Cheap: safe to call under the state's lock."""
        faults = self._faults.for_notification(created_by)
        with self._lock:
            # Random, not seeded: receivers drop repeated event ids, so one must never come back after a
            # reset or a restart.
            event_id = str(uuid.uuid4())
            token = security_token
            if faults.wrong_token:
                token = f"{self._rng.getrandbits(128):032x}"
            body = {"eventId": event_id, "eventTime": iso(self._clock.now()), "securityToken": token, "operation": operation}
            delivery = Delivery(
                eventId=event_id,
                url=url,
                orderId=str(operation.get("orderId")),
                operationId=str(operation.get("operationId")),
                operationResult=str(operation.get("operationResult")),
                createdBy=created_by,
                body=body,
                duplicate=faults.duplicate,
                wrongToken=faults.wrong_token,
            )
            if faults.drop:
                delivery.state = "dropped"
            self._log[event_id] = delivery
        if not faults.drop:
            self._later(faults.delay_seconds, event_id, duplicate=False)
        return event_id

    def deliveries(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(delivery) for delivery in self._log.values()]

    def _later(self, delay: float, event_id: str, *, duplicate: bool) -> None:
        def submit() -> None:
            executor = self._executor
            if executor is not None:
                executor.submit(self._attempt, event_id, duplicate)

        self._scheduler.call_later(delay, submit)

    def _backoff(self, attempt: int) -> float:
        base = self._config.notify_backoff_ms / 1000.0
        cap = self._config.notify_backoff_cap_ms / 1000.0
        with self._lock:
            jitter = 0.5 + self._rng.random() / 2
        delay: float = min(cap, base * 2.0 ** (attempt - 1)) * jitter
        return delay

    def _attempt(self, event_id: str, duplicate: bool) -> None:
        with self._lock:
            delivery = self._log.get(event_id)
            if delivery is None or (delivery.state != "pending" and not duplicate):
                return
            number = len(delivery.attempts) + 1
            url, body = delivery.url, delivery.body
        http = self._http
        status: int | None = None
        error = ""
        if http is None:
            return
        try:
            status = http.post(url, json=body).status_code
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        success = status is not None and 200 <= status < 300
        retry = False
        with self._lock:
            delivery.attempts.append(
                {"attempt": number, "time": iso(self._clock.now()), "status": status, "error": error, "duplicate": duplicate}
            )
            if success:
                delivery.deliveries += 1
                if not duplicate:
                    delivery.state = "delivered"
            elif not duplicate:
                if number < self._config.notify_max_attempts:
                    retry = True
                else:
                    delivery.state = "failed"
            send_duplicate = success and not duplicate and delivery.duplicate
        if retry:
            self._later(self._backoff(number), event_id, duplicate=False)
        if send_duplicate:
            self._later(0.05, event_id, duplicate=True)
