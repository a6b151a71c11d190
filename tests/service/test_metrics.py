"""Step timings: summed by the worker in memory and added to Redis in one batch."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.config.settings import FairnessSettings
from durapay.service.metrics import StepMetrics, render
from durapay.service.runtime import Runtime
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from tests.waiting import wait_until


def test_step_timings_are_summed_in_memory_and_added_in_one_batch(runtime: Runtime) -> None:
    engine = runtime.engine
    metrics = StepMetrics(engine, interval=3600.0)  # the background flush never comes in this test
    for _ in range(6):
        metrics.record("notified", "create", 0.02, FlowState.READY.value)
    metrics.record("notified", "payment", 7.0, FlowState.RETRYING.value)
    metrics.record("notified", "payment", 0.01, "leased")  # did not run here: not a step timing
    text = render(engine)
    assert 'durapay_step_duration_seconds_count{kind="notified",step="create"}' not in text, "nothing written yet"

    assert metrics.flush() == 7
    assert metrics.flush() == 0, "each timing is added once"
    lines = render(engine).splitlines()
    assert 'durapay_step_duration_seconds_count{kind="notified",step="create"} 6' in lines
    assert 'durapay_step_duration_seconds_bucket{kind="notified",step="create",le="0.025"} 6' in lines
    total = next(line for line in lines if line.startswith('durapay_step_duration_seconds_sum{kind="notified",step="create"}'))
    assert abs(float(total.split()[-1]) - 0.12) < 1e-9
    assert 'durapay_step_duration_seconds_bucket{kind="notified",step="payment",le="5.0"} 0' in lines
    assert 'durapay_step_duration_seconds_bucket{kind="notified",step="payment",le="10.0"} 1' in lines
    assert 'durapay_step_retries_total{kind="notified",step="payment"} 1' in lines


def test_the_engine_tells_the_metrics_of_each_step_it_runs(runtime: Runtime) -> None:
    engine = runtime.engine
    seen: list[tuple[str, str, str]] = []
    engine.protocol.observer = lambda kind, step, seconds, result: seen.append((kind, step, result))
    record = engine.start("notified", {"orderId": "ord-obs", "token": "t" * 32})
    assert engine.run_step(record.id, "create", follow=4) == "waiting"
    assert engine.run_step(record.id, "create") == "not-current"
    assert seen == [("notified", "create", "ready"), ("notified", "payment", "waiting")], "a step not run is not told"


def test_the_flusher_outlives_a_failure_that_is_not_a_redis_error(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster client that lost its nodes raises its own exceptions (RedisClusterException, even an
    AttributeError from inside redis-py), not RedisError: one of them ended the flusher's thread, and
    with it every later step timing of the process. Such a failure cannot be made to order with a real
    client, so the pipeline is made to raise once here."""
    engine = runtime.engine
    metrics = StepMetrics(engine, interval=0.01)
    real_pipeline = engine.redis.pipeline
    calls: list[int] = []

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise AttributeError("'NoneType' object has no attribute 'redis_connection'")
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(engine.redis, "pipeline", pipeline)
    metrics.record("notified", "create", 0.02, FlowState.READY.value)  # starts the flusher; this flush fails
    wait_until(lambda: calls, 10, "the failing flush")
    metrics.record("notified", "create", 0.02, FlowState.READY.value)
    count = 'durapay_step_duration_seconds_count{kind="notified",step="create"} 1'
    wait_until(lambda: count in render(engine).splitlines(), 10, "the next second's timings recorded")


def test_a_paused_kind_has_a_series_of_when_its_pause_began(runtime: Runtime) -> None:
    engine = runtime.engine
    assert "durapay_kind_paused_since_seconds{" not in render(engine), "no series while every kind runs"
    pause = engine.pauses.pause("notified", "window", by="api")
    assert f'durapay_kind_paused_since_seconds{{kind="notified"}} {pause.at!r}' in render(engine).splitlines()
    engine.pauses.resume("notified", by="api")
    assert "durapay_kind_paused_since_seconds{" not in render(engine)


def test_a_capped_fairness_key_has_its_held_and_running_series(runtime: Runtime) -> None:
    """Issue 40, item 2: the flows a key's cap holds back are counted in /metrics, per capped key only."""
    assert "durapay_fairness_held" not in render(runtime.engine), "no series with fairness off"
    fairness = FairnessSettings(enabled=True, caps={"default/bulk": 1})
    engine = Engine(
        runtime.settings.model_copy(update={"fairness": fairness}), runtime.redis, runtime.engine.registry, sender=Queued()
    )
    for index in range(3):
        engine.start("notified", {"orderId": f"fair-metrics-{index}", "token": "t" * 32}, tenant="bulk")
    lines = render(engine).splitlines()
    assert 'durapay_fairness_held{key="default/bulk"} 2' in lines
    assert 'durapay_fairness_running{key="default/bulk"} 1' in lines


class Queued:
    """A sender taking a queue (fairness on), sending nowhere."""

    def send(self, task_name: str, flow_id: str, step: str) -> None:
        pass

    def send_chain(self, flow_id: str, links: list[tuple[str, str]], *, queue: str = "") -> None:
        pass
