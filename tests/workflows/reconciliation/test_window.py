"""A window larger than the gateway's per-request limits is read completely (issue 25's acceptance):
more operations than ``maxRecords`` in one span, and a window longer than the one-month span, each query
within the limits, every operation once; and what the reader says when it cannot page past an instant."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from durapay.gateway import RateLimited, ServerError, parse_gateway_time
from durapay.simulator import SimulatorServer
from durapay.tasks.retry import RetryPolicy
from durapay.workflows.engine import Engine
from durapay.workflows.engine.gate import Gate
from durapay.workflows.reconciliation import Reconciler
from durapay.workflows.reconciliation.window import GatewayHeld, GatewayReads, read_window
from tests.workflows.engine.test_gate import T0, Time, make_gate
from tests.workflows.flows.session_engine import session_engine
from tests.workflows.reconciliation.test_run import pay_directly


@pytest.fixture
def flows(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with session_engine(redis_client, key_prefix) as made:
        yield made


def test_more_operations_than_max_records_over_more_than_a_month(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, sim = flows
    start = sim.admin.now() - timedelta(minutes=1)
    made = [pay_directly(engine, f"early-{n}")["operationId"] for n in range(520)]
    sim.admin.advance_clock(40 * 86400)
    made += [pay_directly(engine, f"late-{n}")["operationId"] for n in range(10)]
    end = sim.admin.now() + timedelta(minutes=1)

    reads = GatewayReads(engine.gateway, engine.retry_policy, max_calls=100)
    queries: list[Mapping[str, Any]] = []

    def listed(query: Mapping[str, Any]) -> list[dict[str, Any]]:
        queries.append(query)
        return reads.list_operations(query)

    read = read_window(listed, start, end, max_records=500, span=timedelta(days=28))

    assert sorted(read.operations) == sorted(made) and not read.gaps
    assert read.pages == len(queries) == reads.calls == 3  # the late span; the early one in two pages
    for query in queries:
        span = parse_gateway_time(query["toTime"]) - parse_gateway_time(query["fromTime"])
        assert query["maxRecords"] <= 500 and timedelta(0) <= span <= timedelta(days=28), query


def test_an_instant_with_more_than_max_records_is_said_not_read() -> None:
    """More operations in one millisecond than a page holds cannot be paged past by time: the reader steps
    back a millisecond, goes on, and says what may be missing (the report then cannot be clean)."""
    at = "2026-03-01 10:00:00.000"
    crowd = [{"operationId": str(n), "operationTime": at} for n in range(5)]
    older = [{"operationId": "old", "operationTime": "2026-03-01 09:00:00.000"}]

    def listed(query: Mapping[str, Any]) -> list[dict[str, Any]]:
        upto = parse_gateway_time(query["toTime"])
        return [op for op in crowd + older if parse_gateway_time(op["operationTime"]) <= upto][:3]

    start = datetime(2026, 3, 1, 7, tzinfo=UTC)
    read = read_window(listed, start, start + timedelta(hours=3), max_records=3, span=timedelta(days=28))
    assert sorted(read.operations) == ["0", "1", "2", "old"]
    assert len(read.gaps) == 1 and "more than 3 operations at 2026-03-01 10:00:00.000" in read.gaps[0]


def _naive_gateway(
    ops: list[tuple[str, datetime]], zone: timezone, max_records: int
) -> Callable[[Mapping[str, Any]], list[dict[str, Any]]]:
    """A gateway that filters by the true moment and writes times without an offset in ``zone``."""

    def listed(query: Mapping[str, Any]) -> list[dict[str, Any]]:
        low, high = parse_gateway_time(query["fromTime"]), parse_gateway_time(query["toTime"])
        found = sorted((op for op in ops if low <= op[1] <= high), key=lambda op: op[1], reverse=True)[:max_records]
        return [{"operationId": i, "operationTime": t.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S.000")} for i, t in found]

    return listed


def test_what_the_gateway_answers_is_kept_whatever_zone_its_times_are_in() -> None:
    """Times without an offset written in summer time (UTC+02:00, not the +01:00 durapay reads them in):
    two consecutive days read every operation between them."""
    day = datetime(2026, 7, 1, 1, 0, tzinfo=UTC)
    ops = [(f"op{h}", day + timedelta(hours=h, minutes=30)) for h in range(48)]
    listed = _naive_gateway(ops, timezone(timedelta(hours=2)), 500)
    first = read_window(listed, day, day + timedelta(hours=24), max_records=500, span=timedelta(days=28))
    second = read_window(listed, day + timedelta(hours=24), day + timedelta(hours=48), max_records=500, span=timedelta(days=28))
    assert set(first.operations) | set(second.operations) == {i for i, _ in ops}


def test_a_full_page_without_readable_times_is_a_gap() -> None:
    ops = [{"operationId": str(n), "operationTime": "n/a"} for n in range(3)]
    start = datetime(2026, 3, 1, tzinfo=UTC)
    read = read_window(lambda query: ops, start, start + timedelta(hours=1), max_records=3, span=timedelta(days=28))
    assert len(read.operations) == 3 and len(read.gaps) == 1 and "readable operationTime" in read.gaps[0]


class Answers:
    """A gateway client for the reads: raises the errors it is given, in order, then answers an operation."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def call(self, op: Any, *path: str, request: Any = None) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return SimpleNamespace(model_dump=lambda mode: {"operationId": path[0]})


def gated(client: Answers, gate: Gate, time: Time, **options: Any) -> GatewayReads:
    def sleep(seconds: float) -> None:
        time.t += seconds

    return GatewayReads(
        lambda: client, RetryPolicy(base_seconds=0.1, rng=random.Random(1)), max_calls=20, sleep=sleep, gate=gate, **options
    )


def unavailable() -> ServerError:
    return ServerError("get_operation: HTTP 503", status_code=503, operation="get_operation")


def test_a_reads_5xx_opens_the_shared_breaker_and_the_read_waits_it_out(redis_client: redis.Redis, key_prefix: str) -> None:
    """Issue 25: the reconciliation's reads pass the gateway's gate like any call (the breaker, the limiter,
    a 429's hold), and what they meet counts there: a run neither hammers a gateway that is down nor
    leaves the flows' breaker blind to it."""
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, failures=2, open_seconds=20)
    client = Answers(unavailable(), unavailable())
    reads = gated(client, gate, time)
    assert reads.get_operation("op-1") == {"operationId": "op-1"}
    assert client.calls == 3  # two 503s (the second opened the breaker), then the probe, after its end
    assert gate.status().counters["opened_total"] == 1 and gate.status().state == "closed"  # the probe's success
    assert reads.held >= 20 and time.t - T0 >= 20


def test_a_reads_429_holds_every_caller(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time)
    client = Answers(RateLimited("HTTP 429", retry_after=3, status_code=429, operation="get_operation"))
    assert gated(client, gate, time).get_operation("op-1") == {"operationId": "op-1"}
    assert client.calls == 2 and time.t - T0 >= 3
    assert gate.status().counters["limited"] == 1


def test_a_read_held_past_its_bound_ends_the_run_naming_the_outage(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, failures=1, open_seconds=20)
    gate.failed(unavailable())
    client = Answers(*[unavailable()] * 10)
    with pytest.raises(GatewayHeld, match="circuit breaker is open"):
        gated(client, gate, time, held_seconds=50).get_operation("op-1")
    assert client.calls == 2  # only the probes the breaker let through, each failing


def test_a_run_whose_reads_the_breaker_holds_ends_saying_so(flows: tuple[Engine, SimulatorServer]) -> None:
    """Not a silently partial report: the run stops with the reason, its report not clean."""
    engine, _ = flows
    for _ in range(engine.settings.gateway_health.failures):
        engine.gate.failed(unavailable())
    now = engine.clock.now()
    report = Reconciler(engine, sleep=lambda seconds: None).run(now - 3600, now)
    assert report.error is not None and "circuit breaker is open" in report.error, report.error
    assert report.calls == 0 and not report.ok
