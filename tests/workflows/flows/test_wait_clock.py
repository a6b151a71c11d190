"""A wait's deadline and reads count from the wait's start (``waits.began``), not the flow's creation,
and its reads do not count toward the loop bound (``DURAPAY_ENGINE__MAX_STEP_RUNS``).

Found by the review of stop 46, each reproduced here first:

* a reservation's ``waitSeconds`` counted from the flow's start: after an operator's retry a day later,
  the new link was closed at its first read, five minutes after it was made;
* the reads of an open link came a tenth of the *flow's* age apart: a flow restarted weeks after its
  start read its new link days apart;
* each read of an open link was a claim that counted toward the loop bound: a link open for months
  stopped its flow for a person, with the customer still able to pay.

The real flows step by step on a manual clock, the simulator over HTTP, a real Valkey."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows.waits import began, watch
from tests.workflows.flows.session_engine import context_at, engine, link_input, session_engine, step_until
from tests.workflows.flows.test_reservations_retry import DECLINE, ENDED, advance, reservation_input
from tests.workflows.flows.test_reservations_retry import link_of as reservation_link
from tests.workflows.flows.test_waits import link_of, link_status

__all__ = ["engine"]

Parts = tuple[Engine, SimulatorServer]
DAY = 86400.0


def _declined_and_failed(flows: Engine, sim: SimulatorServer, reservation_id: str, **extra: Any) -> str:
    started = flows.start("reservation", {**reservation_input(reservation_id), **extra})
    first = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.complete_link(reservation_link(first), pan=DECLINE)
    advance(flows, sim, 601)
    failed = step_until(flows, started.id, ENDED)
    assert failed.state is FlowState.FAILED, failed.summary()
    return started.id


def test_a_reservation_retried_a_day_later_keeps_its_new_link_open_for_its_wait_seconds(engine: Parts) -> None:
    flows, sim = engine
    flow_id = _declined_and_failed(flows, sim, "res-late-retry")
    advance(flows, sim, DAY)  # the operator retries the next day
    retried_at = flows.clock.now()
    flows.retry(flow_id)
    waiting = step_until(flows, flow_id, {FlowState.WAITING})
    link_id = reservation_link(waiting)
    advance(flows, sim, waiting.due - flows.clock.now() + 0.001)  # its first read, five minutes on
    flows.run_step(flow_id, "payment")
    read = flows.get(flow_id)
    assert link_status(flows, link_id) == "ACTIVE", "the guest's new link is open for the wait's 600 s"
    assert read.state is FlowState.WAITING, read.summary()
    assert read.due is not None and read.due <= retried_at + 600 + 5, "the merchant's deadline counts from the link"
    paid = sim.admin.complete_link(link_id)  # the guest pays within the 600 s
    done = step_until(flows, flow_id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]


def test_a_link_made_weeks_after_its_flow_started_is_read_at_the_pace_of_its_own_age(engine: Parts) -> None:
    flows, sim = engine
    flow_id = _declined_and_failed(flows, sim, "res-weeks", waitSeconds=None)
    advance(flows, sim, 21 * DAY)
    flows.retry(flow_id)
    waiting = step_until(flows, flow_id, {FlowState.WAITING})
    made = flows.clock.now()
    advance(flows, sim, waiting.due - flows.clock.now() + 0.001)  # the first read
    flows.run_step(flow_id, "payment")
    read = flows.get(flow_id)
    assert read.state is FlowState.WAITING and read.due is not None, read.summary()
    pace = flows.settings.retry.read_pace_seconds
    assert read.due - flows.clock.now() <= max(pace, (flows.clock.now() - made) / 10) + 1, (
        f"next read in {(read.due - flows.clock.now()) / 3600:.1f} h: a tenth of the flow's age, not the link's"
    )


def test_watch_and_began_count_from_the_wait_start() -> None:
    ctx = context_at(now=40 * DAY, created=0.0)
    ctx.wait_since = 40 * DAY - 600
    assert began(ctx) == 40 * DAY - 600
    assert watch(ctx, until=43 * DAY) == pytest.approx(40 * DAY + 300), "the read pace: the wait is ten minutes old"
    ctx.wait_since = None  # a wait written by an earlier release: what it counted from
    assert began(ctx) == 0.0


@pytest.fixture
def bounded(redis_client: redis.Redis, key_prefix: str) -> Iterator[Parts]:
    """The engine with ``max_step_runs`` at its minimum (10)."""
    with session_engine(redis_client, key_prefix, max_step_runs=10) as made:
        yield made


def test_the_reads_of_a_link_open_for_weeks_do_not_reach_the_loop_bound(bounded: Parts) -> None:
    flows, sim = bounded
    request = link_input("clock-long-link")
    request["expirationDate"] = (datetime.now(UTC) + timedelta(days=60)).date().isoformat()
    started = flows.start("paybylink", request)
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    month = flows.clock.now() + 30 * DAY  # half the link's life: it is open throughout
    reads = 0
    for _ in range(200):
        record = flows.get(started.id)
        if record.state is not FlowState.WAITING or record.due is None or record.due > month:
            break
        advance(flows, sim, record.due - flows.clock.now() + 0.001)
        flows.run_step(started.id, "payment")
        reads += 1
    record = flows.get(started.id)
    assert reads > 10, f"only {reads} reads: the test must pass the bound of 10 runs"
    assert record.state is FlowState.WAITING, f"after {reads} reads: {record.summary()}"
    assert link_status(flows, link_of(waiting)) == "ACTIVE"


def test_a_wait_of_the_previous_release_counts_from_the_logs_entry_into_its_step() -> None:
    """A wait written with no ``since``: the latest entry into the step, a restart of a flow whose first
    step is the wait included; with no such entry left in the log, the record's last change (late, never
    early); never the flow's creation."""
    from types import SimpleNamespace

    from durapay.workflows.engine.protocol import RESTARTED, _wait_since

    record = SimpleNamespace(id="f1", wait={"step": "wait", "deadline": 900.0}, created=0.0, updated=800.0)
    first_is_wait = [
        {"t": 10.0, "step": "wait", "to": "ready", "what": "created"},
        {"t": 11.0, "step": "wait", "to": "waiting", "what": "waiting for paid"},
        {"t": 500.0, "step": "wait", "to": "failed", "what": "no payment by the deadline"},
        {"t": 600.0, "step": "wait", "to": "ready", "what": RESTARTED},
        {"t": 601.0, "step": "wait", "to": "waiting", "what": "waiting for paid"},
    ]
    assert _wait_since(record, "wait", 900.0, lambda _: first_is_wait) == 600.0  # type: ignore[arg-type]
    later = [{"t": 5.0, "step": "create", "to": "ready"}, {"t": 300.0, "step": "wait", "to": "ready"}]
    assert _wait_since(record, "wait", 900.0, lambda _: later) == 300.0  # type: ignore[arg-type]
    assert _wait_since(record, "wait", 900.0, lambda _: []) == 800.0, "trimmed: its last change"  # type: ignore[arg-type]
    record.wait = {**record.wait, "since": 42.0}
    assert _wait_since(record, "wait", 900.0, lambda _: first_is_wait) == 42.0  # type: ignore[arg-type]
