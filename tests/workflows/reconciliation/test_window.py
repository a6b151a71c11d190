"""A window larger than the gateway's per-request limits is read completely (issue 25's acceptance):
more operations than ``maxRecords`` in one span, and a window longer than the one-month span, each query
within the limits, every operation once; and what the reader says when it cannot page past an instant."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from durapay.gateway import parse_gateway_time
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.reconciliation.window import GatewayReads, read_window
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
