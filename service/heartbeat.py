"""Heartbeats: how ``/readyz`` knows a worker is alive without asking Celery.

Why not ``celery inspect ping``: it costs a broadcast round trip of a second or more per probe and
does not work the same on every broker (RabbitMQ may carry the tasks). Instead each worker writes
``<prefix>:alive:worker`` (and ``...:alive:worker:<hostname>``) every ``interval`` seconds with a TTL
of a few intervals (a worker delivering webhooks, ``durapay worker --webhooks``, writes
``alive:webhooks``; one consuming both queues, the test harness's, writes both); the dispatcher writes
``<prefix>:alive:scheduler`` on every tick. A key present means alive; a crashed process's key expires
by itself.

The worker's heartbeat is a Celery bootstep installed on the app by ``build_runtime``, so it runs in
``durapay worker`` and in the test harness's in-process worker alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from typing import Any

import redis
from celery import Celery, bootsteps

from durapay.config.connect import open_redis
from durapay.workflows.engine import Keys, RedisWatch

log = logging.getLogger("durapay.heartbeat")

INTERVAL_SECONDS = 2.0
TTL_SECONDS = 10


class Heartbeat:
    """Writes ``keys.heartbeat(role)`` (and ``role:name``) every ``interval`` seconds from a thread."""

    def __init__(
        self,
        redis_url: str,
        keys: Keys,
        role: str,
        name: str,
        *,
        interval: float = INTERVAL_SECONDS,
        cluster: bool = False,
    ) -> None:
        self.redis_url = redis_url
        self.cluster = cluster
        self.keys = keys
        self.role = role
        self.name = name
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, client: Any) -> None:
        value = json.dumps({"name": self.name, "pid": os.getpid(), "t": time.time()})
        pipe = client.pipeline(transaction=False)
        pipe.set(self.keys.heartbeat(self.role), value, ex=TTL_SECONDS)
        pipe.set(self.keys.heartbeat(f"{self.role}:{self.name}"), value, ex=TTL_SECONDS)
        pipe.execute()

    def _run(self) -> None:
        client = open_redis(self.redis_url, cluster=self.cluster, socket_timeout=5, socket_connect_timeout=2)
        watch = RedisWatch(f"{self.role} heartbeat", log, self.interval)
        try:
            while not self._stop.is_set():
                try:
                    self.beat(client)
                    watch.ok()
                except redis.RedisError as exc:  # Redis restarting: keep trying, say so once
                    if not watch.failed(exc):
                        log.warning("%s heartbeat not written: %s", self.role, exc)
                self._stop.wait(self.interval)
            with contextlib.suppress(redis.RedisError):
                client.delete(self.keys.heartbeat(f"{self.role}:{self.name}"))
        finally:
            client.close()

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name=f"{self.role}-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def worker_roles(app: Celery) -> list[str]:
    """The heartbeat roles of a worker of ``app``, by the queues it consumes: ``worker`` for the steps'
    queue, ``webhooks`` for the deliveries' (``config.celery``)."""
    from durapay.config.celery import QUEUE, WEBHOOK_QUEUE

    queues = app.amqp.queues
    consumed = set(queues.consume_from or queues)
    return [role for role, queue in (("worker", QUEUE), ("webhooks", WEBHOOK_QUEUE)) if queue in consumed]


def install_worker_heartbeat(app: Celery, redis_url: str, keys: Keys, *, cluster: bool = False) -> None:
    """Add a bootstep to ``app``'s workers that keeps their heartbeats (:func:`worker_roles`) while they run."""

    class WorkerHeartbeat(bootsteps.StartStopStep):  # type: ignore[misc]
        requires = {"celery.worker.components:Pool"}

        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.heartbeats: list[Heartbeat] = []

        def start(self, parent: Any) -> None:
            name = getattr(parent, "hostname", None) or f"{socket.gethostname()}-{os.getpid()}"
            self.heartbeats = [Heartbeat(redis_url, keys, role, name, cluster=cluster).start() for role in worker_roles(app)]

        def stop(self, parent: Any) -> None:
            for heartbeat in self.heartbeats:
                heartbeat.stop()
            self.heartbeats = []

        # A cold shutdown calls terminate, not stop; both must end the thread.
        terminate = stop
        shutdown = stop

    app.steps["worker"].add(WorkerHeartbeat)
