"""Metrics in the Prometheus text format, kept in Redis so that every process contributes.

Why Redis and not a client library's registry: steps run in worker processes on many machines and the
API that answers ``/metrics`` is another process; a per-process registry would show one worker's
share. Workers add to per-partition hashes; ``/metrics`` sums them.
Nothing here needs ``prometheus_client``.

A worker keeps its step timings in memory and adds them to Redis once a second (``FLUSH_SECONDS``), in
one round trip for all of them: a Redis call per step was a quarter of what durability cost a step.
The price: a worker killed outright loses its last second of timings (counts, never money).

Series:

* ``durapay_flows{kind,state}`` - flows by kind and state (finished flows count until retention ends)
* ``durapay_step_duration_seconds{kind,step}`` - histogram of a step's claim-run-complete time
* ``durapay_step_retries_total{kind,step}`` - steps that ended in a technical retry
* ``durapay_notifications_total{outcome}`` (``service.receiver.COUNTERS``: accepted, duplicate, rejected,
  malformed, oversized, unrouted, unverified, failed, late_payment; and unknown_order, the rejected ones
  whose order no flow holds, with unknown_order_capped, those of them whose merchant event the minute's
  cap left unwritten) and ``durapay_notifications_rejected_total``
* ``durapay_auth_failures_total`` - wrong keys presented to the API or the console's sign-in;
  ``durapay_auth_refusals_total`` - attempts answered 429 for too many of them (``service.throttle``)
* ``durapay_worker_up``, ``durapay_scheduler_up`` - a heartbeat is present
* ``durapay_reconciliation_mismatches{category}``, ``durapay_reconciliation_ok`` - the standing
  reconciliation (``Reports.standing``: a newer run clears a mismatch only by reading its window again);
  ``durapay_reconciliation_finished_seconds`` - when the newest finished (none kept: no series)
* ``durapay_gateway_breaker{terminal,state}`` - 1 for the gate's breaker state (closed, open, half_open),
  ``durapay_gateway_deferred_total`` (calls not sent: breaker open or another probing),
  ``durapay_gateway_rate_limited_total`` (429s seen), ``durapay_gateway_limiter_waits_total`` (calls given
  a later slot), ``durapay_gateway_breaker_opened_total``, ``durapay_gateway_probes_total``
  (``workflows.engine.gate``)
* ``durapay_kind_paused_since_seconds{kind}`` - when each paused flow kind's pause began (POSIX
  seconds; no series for a kind that runs: alert on ``time() - x`` past the maintenance window)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import redis

from durapay.service.receiver import COUNTERS, counter_key
from durapay.service.throttle import FAILURES, REFUSALS
from durapay.workflows.engine import Engine, FlowState

log = logging.getLogger("durapay.metrics")

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: run_step results that mean the step did not run here (a duplicate or early delivery).
NOT_RUN = frozenset({"missing", "not-current", "leased", "stopped", "early", "lost-race", "not-durable"})

#: Seconds a worker keeps step timings before adding them to Redis.
FLUSH_SECONDS = 1.0


def _bucket(seconds: float) -> str:
    for bound in BUCKETS:
        if seconds <= bound:
            return repr(bound)
    return "+Inf"


def steps_key(engine: Engine, partition: int) -> str:
    return f"{engine.keys.tag(partition)}:metrics:steps"


class StepMetrics:
    """Times every step a worker runs: ``record`` is the engine's step observer
    (``StepProtocol.observer``), told of each step with its flow kind.

    Timings are summed in memory and a thread of this process adds the sums to Redis every
    ``interval`` seconds in one round trip (started at the first timing, so that each process of a
    prefork pool has its own). Each process writes to one partition's hash, chosen by its pid, so
    that many workers spread over a cluster; ``/metrics`` sums them all."""

    def __init__(self, engine: Engine, *, interval: float = FLUSH_SECONDS) -> None:
        self.engine = engine
        self.interval = interval
        self._pending: dict[str, float] = defaultdict(float)
        self._steps = 0
        self._lock = threading.Lock()
        self._flusher_pid = 0

    def record(self, kind: str, step: str, seconds: float, result: str) -> None:
        if result in NOT_RUN:
            return
        base = f"{kind}|{step}"
        with self._lock:
            self._pending[f"{base}|b|{_bucket(seconds)}"] += 1
            self._pending[f"{base}|sum"] += seconds
            self._pending[f"{base}|count"] += 1
            if result == FlowState.RETRYING.value:
                self._pending[f"{base}|retries"] += 1
            self._steps += 1
            if self._flusher_pid != os.getpid():  # none yet in this process (a forked pool child has none)
                self._flusher_pid = os.getpid()
                threading.Thread(target=self._flush_forever, name="durapay-step-metrics", daemon=True).start()

    def flush(self) -> int:
        """Add the sums held so far to Redis in one round trip; returns how many steps they count."""
        with self._lock:
            pending, self._pending = self._pending, defaultdict(float)
            steps, self._steps = self._steps, 0
        if not pending:
            return 0
        key = steps_key(self.engine, os.getpid() % self.engine.keys.partitions)
        pipe = self.engine.redis.pipeline(transaction=False)
        for field, amount in pending.items():
            if field.endswith("|sum"):
                pipe.hincrbyfloat(key, field, amount)
            else:
                pipe.hincrby(key, field, int(amount))
        try:
            pipe.execute()
        except redis.RedisError as exc:  # metrics never fail a step; a Redis outage loses these counts
            log.warning("%d step timings not recorded: %s", steps, exc)
            return 0
        return steps

    def _flush_forever(self) -> None:
        """Flush once per interval for the life of the process: no failure ends it (a cluster client
        that cannot reach a node raises its own exceptions, not RedisError; the counts of that second
        are lost, the next second's are recorded)."""
        while True:
            time.sleep(self.interval)
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - see above
                log.warning("step timings not recorded: %s: %s", type(exc).__name__, exc)


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


def step_totals(engine: Engine) -> dict[tuple[str, str], dict[str, float]]:
    """Per (kind, step), the summed counters of every partition: ``count``, ``sum`` (seconds),
    ``retries``, and ``b|<bound>`` per histogram bucket (also read by the console's home page)."""
    merged: dict[str, float] = defaultdict(float)
    for partition in range(engine.keys.partitions):
        raw: dict[bytes, bytes] = engine.redis.hgetall(steps_key(engine, partition))
        for name, value in raw.items():
            merged[name.decode()] += float(value)
    series: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for label, total in merged.items():
        kind, step, what = label.split("|", 2)
        series[(kind, step)][what] = total
    return series


def _step_series(engine: Engine) -> list[str]:
    series = step_totals(engine)
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
    pipe = engine.redis.pipeline(transaction=False)  # not MGET: on a cluster the counters sit in several slots
    for name in COUNTERS:
        pipe.get(counter_key(engine, name))
    values: list[Any] = pipe.execute()
    counts = {name: int(value or 0) for name, value in zip(COUNTERS, values, strict=True)}
    lines = [
        "# HELP durapay_notifications_total Notifications received, by outcome.",
        "# TYPE durapay_notifications_total counter",
    ]
    lines += [f"durapay_notifications_total{_labels(outcome=name)} {count}" for name, count in counts.items()]
    lines += [
        "# HELP durapay_notifications_rejected_total Notifications refused: wrong, missing or foreign token, unknown order, "
        "another order's operation.",
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


def _reconciliation_series(engine: Engine) -> list[str]:
    from durapay.workflows.reconciliation import MISMATCHES, Reconciler

    reports = Reconciler(engine).reports
    report, newest = reports.standing(), reports.latest(finished=True)
    if report is None or newest is None:
        return []
    counts = report.counts()
    lines = [
        "# HELP durapay_reconciliation_mismatches Mismatches of the standing reconciliation (docs/operations.md), by category.",
        "# TYPE durapay_reconciliation_mismatches gauge",
        *(f'durapay_reconciliation_mismatches{{category="{category}"}} {counts[category]}' for category in MISMATCHES),
        "# HELP durapay_reconciliation_ok 1 when the standing reconciliation found nothing wrong.",
        "# TYPE durapay_reconciliation_ok gauge",
        f"durapay_reconciliation_ok {int(report.ok)}",
        "# HELP durapay_reconciliation_finished_seconds When the newest reconciliation finished (POSIX seconds).",
        "# TYPE durapay_reconciliation_finished_seconds gauge",
        f"durapay_reconciliation_finished_seconds {newest.finished:.3f}",
    ]
    return lines


def _auth_series(engine: Engine) -> list[str]:
    pipe = engine.redis.pipeline(transaction=False)
    for name in (FAILURES, REFUSALS):
        pipe.get(engine.keys.counter(name))
    failures, refusals = (int(value or 0) for value in pipe.execute())
    return [
        "# HELP durapay_auth_failures_total Wrong keys presented to the API or the console's sign-in.",
        "# TYPE durapay_auth_failures_total counter",
        f"durapay_auth_failures_total {failures}",
        "# HELP durapay_auth_refusals_total Attempts answered 429: too many failed authentications in the window.",
        "# TYPE durapay_auth_refusals_total counter",
        f"durapay_auth_refusals_total {refusals}",
    ]


#: The gate's counters and their series (``workflows.engine.gate.GateStatus.counters``).
GATE_COUNTERS = (
    ("deferred", "durapay_gateway_deferred_total", "Gateway calls not sent: the breaker was open (or another call probed)."),
    ("limited", "durapay_gateway_rate_limited_total", "429 answers seen from the gateway."),
    ("waits", "durapay_gateway_limiter_waits_total", "Gateway calls the shared rate limiter gave a later slot."),
    ("opened_total", "durapay_gateway_breaker_opened_total", "Times the gateway's circuit breaker opened."),
    ("probes", "durapay_gateway_probes_total", "Probe calls sent while the breaker was half open."),
)


def _gate_series(engine: Engine) -> list[str]:
    """Every terminal's gate (``workflows.engine.terminals``): its breaker's state and its counters, labelled by terminal."""
    statuses = [engine.terminals.gate(name).status() for name in engine.terminals.names]
    lines = [
        "# HELP durapay_gateway_breaker The gateway's circuit breaker: 1 for its state (closed, open, half_open).",
        "# TYPE durapay_gateway_breaker gauge",
        *(
            f'durapay_gateway_breaker{{terminal="{_escape(status.terminal)}",state="{state}"}} {int(status.state == state)}'
            for status in statuses
            for state in ("closed", "open", "half_open")
        ),
    ]
    for name, series, text in GATE_COUNTERS:
        lines += [
            f"# HELP {series} {text}",
            f"# TYPE {series} counter",
            *(f'{series}{{terminal="{_escape(status.terminal)}"}} {status.counters[name]}' for status in statuses),
        ]
    return lines


def _pause_series(engine: Engine) -> list[str]:
    series = "durapay_kind_paused_since_seconds"
    return [
        f"# HELP {series} When the pause of a paused flow kind began (workflows.pauses); none for a kind that runs.",
        f"# TYPE {series} gauge",
        *(f'{series}{{kind="{_escape(kind)}"}} {_number(pause.at)}' for kind, pause in sorted(engine.pauses.paused().items())),
    ]


def _fairness_series(engine: Engine) -> list[str]:
    """Per capped fairness key (``workflows.engine.fairness.Caps``): its flows held back, and its places taken.
    None for a key without a cap (or with fairness off): nothing is counted for it."""
    caps = engine.caps
    if not caps.caps:
        return []
    keys = sorted(caps.caps)
    pipe = engine.redis.pipeline(transaction=False)
    for key in keys:
        pipe.zcard(engine.keys.fair_held(key))
        pipe.zcard(engine.keys.fair_running(key))
    counts = pipe.execute()
    held, running = "durapay_fairness_held", "durapay_fairness_running"
    return [
        f"# HELP {held} Flows a capped fairness key holds back in its list (DURAPAY_FAIRNESS__CAPS).",
        f"# TYPE {held} gauge",
        *(f'{held}{{key="{_escape(key)}"}} {int(counts[2 * index])}' for index, key in enumerate(keys)),
        f"# HELP {running} Steps of a capped fairness key sent or running (lapsed ones until the next dispatcher pass).",
        f"# TYPE {running} gauge",
        *(f'{running}{{key="{_escape(key)}"}} {int(counts[2 * index + 1])}' for index, key in enumerate(keys)),
    ]


def render(engine: Engine) -> str:
    """The whole ``/metrics`` page."""
    lines = (
        _flow_counts(engine)
        + _step_series(engine)
        + _notification_series(engine)
        + _auth_series(engine)
        + _up_series(engine, ("worker", "webhooks", "scheduler"))
        + _reconciliation_series(engine)
        + _gate_series(engine)
        + _pause_series(engine)
        + _fairness_series(engine)
    )
    return "\n".join(lines) + "\n"
