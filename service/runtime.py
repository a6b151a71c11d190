"""Wiring: from the settings to a running set of parts (Redis, Celery app, tasks, engine).

Every process (worker, scheduler, API, demo, tests) builds its parts here, so they agree on keys,
queues and flow kinds. With no ``DURAPAY_REDIS_URL`` an embedded Valkey is started under
``DURAPAY_DATA_DIR`` (AOF on); child processes are then given its URL explicitly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from config.celery import make_celery
from config.embedded import EmbeddedValkey
from config.settings import Settings
from gateway import GatewayClient
from tasks.celery_tasks import CelerySender, register_tasks
from workflows.clock import Clock
from workflows.engine import Engine
from workflows.flows import REGISTRY
from workflows.steps import FlowDefinition


@dataclass
class Runtime:
    settings: Settings
    redis_url: str
    redis: redis.Redis
    celery: Celery
    engine: Engine
    embedded: EmbeddedValkey | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        self.redis.close()
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def resolve_redis(settings: Settings) -> tuple[str, EmbeddedValkey | None]:
    """The configured Redis URL, or a started embedded Valkey and its URL."""
    if settings.redis_url:
        return settings.redis_url, None
    server = EmbeddedValkey(Path(settings.data_dir) / "valkey")
    server.start()
    return server.url, server


def build_runtime(
    settings: Settings,
    *,
    redis_url: str | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    flows: dict[str, FlowDefinition] | None = None,
) -> Runtime:
    """Build the parts. ``redis_url`` overrides the settings (tests, and children of the demo)."""
    embedded = None
    if redis_url is None:
        redis_url, embedded = resolve_redis(settings)
    client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)
    app = make_celery(settings, settings.broker_url or redis_url)
    registry = dict(REGISTRY)
    registry.update(flows or {})
    engine = Engine(settings, client, registry, sender=CelerySender(app), clock=clock, rng=rng)
    register_tasks(app, engine.run_step, lambda: GatewayClient(settings.gateway))
    return Runtime(settings, redis_url, client, app, engine, embedded)
