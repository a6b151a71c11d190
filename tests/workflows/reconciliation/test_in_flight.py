"""Money in flight: a flow that says its call may have taken effect shows the operation its call makes,
whatever fields the row carries (the simulator's ledger for chaos, ``GET /operations`` in production:
one answer, one rule); what a run leaves in flight is read again by id by the next runs until it is
judged; and reporting the same payment again (a run repeated, two runs at once) keeps it once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from durapay.workflows.reconciliation import IN_FLIGHT, MONEY_NOT_SHOWN, MONEY_WITHOUT_FLOW, Finding, Reconciler, money
from tests.workflows.flows.session_engine import session_engine, step_until
from tests.workflows.reconciliation.test_post_operations import STOPPED, lose_the_answer, run
from tests.workflows.reconciliation.test_run import catch_up, moto_input, pay_directly


@pytest.fixture
def flows(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with session_engine(redis_client, key_prefix) as made:
        yield made


def unsettled_payment(engine: Engine, sim: SimulatorServer, order_id: str) -> FlowRecord:
    lose_the_answer(sim, "create_moto_order")
    record = engine.start("moto", moto_input(order_id))
    stopped = step_until(engine, record.id, STOPPED, limit=30)
    assert stopped.state is FlowState.NEEDS_ATTENTION and stopped.unsettled, stopped.summary()
    sim.admin.clear_faults()
    return stopped


def test_a_payment_in_flight_shows_in_its_flow_for_chaos_and_production_alike(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, sim = flows
    since = engine.clock.now() - 60
    stopped = unsettled_payment(engine, sim, "lost-1")
    (ledger_row,) = sim.admin.operations(orderId="lost-1")
    gateway_row = engine.gateway().call(Catalogue.get_operation, ledger_row["operationId"]).model_dump(mode="json")
    assert money.shown(stopped, ledger_row) == money.shown(stopped, gateway_row) == "attention"
    report = Reconciler(engine).run(since, catch_up(engine, sim))
    assert [(f.category, f.flow) for f in report.findings] == [(IN_FLIGHT, stopped.id)], [f.what for f in report.findings]


def test_a_payment_reported_again_is_kept_once(flows: tuple[Engine, SimulatorServer], redis_client: redis.Redis) -> None:
    """Runs repeated over a day, and two runs that judged before either acted: one notification kept."""
    engine, sim = flows
    since = engine.clock.now() - 60
    record = run(engine, "moto", moto_input("failed-1"))
    partition = engine.keys.partition(record.id)
    redis_client.hset(engine.keys.flow(record.id), mapping={"state": "failed", "outcome": json.dumps({"reason": "planted"})})
    redis_client.zrem(engine.keys.by_state(partition, "succeeded"), record.id)
    redis_client.zadd(engine.keys.by_state(partition, "failed"), {record.id: engine.clock.now()})
    until = catch_up(engine, sim)
    first, second = Reconciler(engine), Reconciler(engine)
    acted = first.act

    def act_after_another_run(finding: Finding, report_id: str) -> None:
        second.run(since, until)
        acted(finding, report_id)

    first.act = act_after_another_run  # type: ignore[method-assign]
    first.run(since, until)
    Reconciler(engine).run(since, until)
    after = engine.get(record.id)
    assert after.state is FlowState.NEEDS_ATTENTION and after.error["type"] == "LatePayment"  # type: ignore[index]
    assert len(after.signals) == 1, after.signals


def test_what_is_in_flight_is_judged_by_a_later_run(flows: tuple[Engine, SimulatorServer]) -> None:
    """A stray payment PENDING when its day is read, EXECUTED after: the next day's run (whose window
    does not hold it) reads it again by id and reports it; then it is no longer carried."""
    engine, sim = flows
    first_start = engine.clock.now() - 60
    sim.admin.pend("create_moto_order", count=1, final="000")
    stray = pay_directly(engine, "stray-pending")
    assert stray["operationResult"] == "PENDING"
    first_end = catch_up(engine, sim)
    first = Reconciler(engine).run(first_start, first_end)
    assert [f.category for f in first.findings] == [IN_FLIGHT] and first.ok
    sim.admin.settle_pending()
    sim.admin.advance_clock(3600)
    second = Reconciler(engine).run(first_end, catch_up(engine, sim))
    assert second.operations == 0 and second.carried == 1
    assert [(f.category, (f.operation or {}).get("operationId")) for f in second.findings] == [
        (MONEY_WITHOUT_FLOW, stray["operationId"])
    ]
    third = Reconciler(engine).run(engine.clock.now() - 60, engine.clock.now())
    assert third.carried == 0 and third.findings == []


def test_a_flow_still_going_that_ends_failed_is_judged_by_a_later_run(
    flows: tuple[Engine, SimulatorServer], redis_client: redis.Redis
) -> None:
    engine, sim = flows
    first_start = engine.clock.now() - 60
    record = run(engine, "moto", moto_input("going-1"))
    redis_client.hset(engine.keys.flow(record.id), "state", "running")  # still going when its day is read
    first_end = catch_up(engine, sim)
    first = Reconciler(engine).run(first_start, first_end)
    assert [(f.category, f.flow) for f in first.findings] == [(IN_FLIGHT, record.id)]
    partition = engine.keys.partition(record.id)
    redis_client.hset(engine.keys.flow(record.id), mapping={"state": "failed", "outcome": json.dumps({"reason": "planted"})})
    redis_client.zrem(engine.keys.by_state(partition, "succeeded"), record.id)
    redis_client.zadd(engine.keys.by_state(partition, "failed"), {record.id: engine.clock.now()})
    sim.admin.advance_clock(3600)
    second = Reconciler(engine).run(first_end, catch_up(engine, sim))
    assert [(f.category, f.flow) for f in second.findings] == [(MONEY_NOT_SHOWN, record.id)]
