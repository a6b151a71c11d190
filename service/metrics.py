"""Metrics in the Prometheus text format, kept in Redis so that every process contributes.

Why Redis and not a client library's registry: steps run in worker processes on many machines and the
API that answers ``/metrics`` is another process; a per-process registry would show one worker's
share. Workers add to per-partition hashes (one Lua call per step, in the flow's own hash slot);
``/metrics`` sums them. Nothing here needs ``prometheus_client``.

Series:

* ``durapay_flows{kind,state}`` - flows by kind and state (finished flows count until retention ends)
* ``durapay_step_duration_seconds{kind,step}`` - histogram of a step's claim-run-complete time
* ``durapay_step_retries_total{kind,step}`` - steps that ended in a technical retry
* ``durapay_notifications_total{outcome}`` and ``durapay_notifications_rejected_total``
* ``durapay_worker_up``, ``durapay_scheduler_up`` - a heartbeat is present
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import redis

from service.receiver import COUNTERS, counter_key
from tasks.celery_tasks import StepRunner
from workflows.engine import Engine
from workflows.states import FlowState

log = logging.getLogger("durapay.metrics")

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: run_step results that mean the step did not run here (a duplicate or early delivery).
NOT_RUN = frozenset({"missing", "not-current", "leased", "stopped", "early", "lost-race", "not-durable"})

_RECORD = """
local kind = redis.call('HGET', KEYS[1], 'kind')
if not kind then return 0 end
local base = kind .. '|' .. ARGV[1]
redis.call('HINCRBY', KEYS[2], base .. '|b|' .. ARGV[2], 1)
redis.call('HINCRBYFLOAT', KEYS[2], base .. '|sum', ARGV[3])
redis.call('HINCRBY', KEYS[2], base .. '|count', 1)
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[2], base .. '|retries', 1) end
return 1
"""


def _bucket(seconds: float) -> str:
    for bound in BUCKETS:
        if seconds <= bound:
            return repr(bound)
    return "+Inf"


def steps_key(engine: Engine, partition: int) -> str:
    return f"{engine.keys.tag(partition)}:metrics:steps"


class StepMetrics:
    """Times every step a worker runs; ``wrap(engine.run_step)`` is what the Celery tasks call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._record = engine.redis.register_script(_RECORD)

    def record(self, flow_id: str, step: str, seconds: float, result: str) -> None:
        partition = self.engine.keys.partition(flow_id)
        try:
            self._record(
                keys=[self.engine.keys.flow(flow_id), steps_key(self.engine, partition)],
                args=[step, _bucket(seconds), repr(seconds), "1" if result == FlowState.RETRYING.value else "0"],
            )
        except redis.RedisError as exc:  # metrics never fail a step
            log.warning("step metrics not recorded: %s", exc)

    def wrap(self, run_step: StepRunner) -> StepRunner:
        def timed(flow_id: str, step: str, /, *, worker: str, chained_next: str | None, money: bool | None) -> str:
            began = time.perf_counter()
            result = run_step(flow_id, step, worker=worker, chained_next=chained_next, money=money)
            if result not in NOT_RUN:
                self.record(flow_id, step, time.perf_counter() - began, result)
            return result

        return timed


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items()) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _flow_counts(engine: Engine) -> list[str]:
    kinds = sorted(engine.registry)
    pipe = engine.redis.pipeline(transaction=False)
    combos: list[tuple[str, FlowState]] = []
    for kind in kinds:
        for state in FlowState:
            combos.append((kind, state))
            for partition in range(engine.keys.partitions):
                pipe.zintercard(2, [engine.keys.by_state(partition, state.value), engine.keys.by_kind(partition, kind)])
    answers: list[Any] = pipe.execute()
    per = engine.keys.partitions
    lines = ["# HELP durapay_flows Flows by kind and state.", "# TYPE durapay_flows gauge"]
    for index, (kind, state) in enumerate(combos):
        total = sum(int(n) for n in answers[index * per : (index + 1) * per])
        lines.append(f"durapay_flows{_labels(kind=kind, state=state.value)} {total}")
    return lines


def _step_series(engine: Engine) -> list[str]:
    merged: dict[str, float] = defaultdict(float)
    for partition in range(engine.keys.partitions):
        raw: dict[bytes, bytes] = engine.redis.hgetall(steps_key(engine, partition))
        for name, value in raw.items():
            merged[name.decode()] += float(value)
    series: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for label, total in merged.items():
        kind, step, what = label.split("|", 2)
        series[(kind, step)][what] = total
    hist = [
        "# HELP durapay_step_duration_seconds Time of one step: claim, gateway call, complete.",
        "# TYPE durapay_step_duration_seconds histogram",
    ]
    retries = [
        "# HELP durapay_step_retries_total Steps that ended in a technical retry.",
        "# TYPE durapay_step_retries_total counter",
    ]
    for (kind, step), values in sorted(series.items()):
        running = 0.0
        for bound in [*(repr(b) for b in BUCKETS), "+Inf"]:
            running += values.get(f"b|{bound}", 0.0)
            hist.append(f"durapay_step_duration_seconds_bucket{_labels(kind=kind, step=step, le=bound)} {_number(running)}")
        hist.append(f"durapay_step_duration_seconds_sum{_labels(kind=kind, step=step)} {_number(values.get('sum', 0.0))}")
        hist.append(f"durapay_step_duration_seconds_count{_labels(kind=kind, step=step)} {_number(values.get('count', 0.0))}")
        retries.append(f"durapay_step_retries_total{_labels(kind=kind, step=step)} {_number(values.get('retries', 0.0))}")
    return hist + retries


def _notification_series(engine: Engine) -> list[str]:
    values: list[Any] = engine.redis.mget([counter_key(engine, name) for name in COUNTERS])
    counts = {name: int(value or 0) for name, value in zip(COUNTERS, values, strict=True)}
    lines = [
        "# HELP durapay_notifications_total Notifications received, by outcome.",
        "# TYPE durapay_notifications_total counter",
    ]
    lines += [f"durapay_notifications_total{_labels(outcome=name)} {count}" for name, count in counts.items()]
    lines += [
        "# HELP durapay_notifications_rejected_total Notifications refused: wrong, missing or foreign token, unknown order.",
        "# TYPE durapay_notifications_rejected_total counter",
        f"durapay_notifications_rejected_total {counts['rejected']}",
    ]
    return lines


def _up_series(engine: Engine, roles: Iterable[str]) -> list[str]:
    lines: list[str] = []
    for role in roles:
        alive = bool(engine.redis.exists(engine.keys.heartbeat(role)))
        lines += [
            f"# HELP durapay_{role}_up A {role} heartbeat is present.",
            f"# TYPE durapay_{role}_up gauge",
            f"durapay_{role}_up {int(alive)}",
        ]
    return lines


def render(engine: Engine) -> str:
    """The whole ``/metrics`` page."""
    lines = (
        _flow_counts(engine) + _step_series(engine) + _notification_series(engine) + _up_series(engine, ("worker", "scheduler"))
    )
    return "\n".join(lines) + "\n"
