"""Webhooks on the session's Valkey: an engine with scripted steps and a manual clock, the webhooks
part on the same keys delivering inline (no Celery: ``send=None``), and a real HTTP receiver."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.config import load_settings
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.webhooks import Webhooks
from tests.workflows.engine_support import ScriptedStep, flow


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture
def hooks(make_engine: Any, clock: ManualClock) -> Callable[..., tuple[Engine, Webhooks]]:
    def make(**webhooks: Any) -> tuple[Engine, Webhooks]:
        engine, _ = make_engine(flow(ScriptedStep("pay")))
        settings = load_settings({"webhooks": {"allow_private": True, "timeout": 2.0, **webhooks}})
        return engine, Webhooks(engine.redis, engine.keys, settings.webhooks, now=clock.now, rng=random.Random(5))

    return make
