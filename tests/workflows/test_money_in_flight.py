"""Money in flight: operators, notifications and money already moving at the gateway meet.

Each test replays one finding of the review of cancels, retries, derived orders, notifications and events,
on the flow model's world (the real engine, the simulator over HTTP, a Valkey whose tail can be cut,
messages delivered when the test says). What must hold: a flow never ends ``cancelled`` or ``failed`` while
money it sent may be at the gateway; only a read of the gateway decides (docs/durability.md, "Money in
flight").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.tasks.outcomes import Poll
from durapay.workflows.engine import NotFound, OperatorError, OrderIdTaken
from durapay.workflows.engine.signals import RECEIVER
from durapay.workflows.engine.states import FlowState
from tests.workflows.aof_tail import AofTail
from tests.workflows.engine_support import ScriptedStep
from tests.workflows.engine_support import flow as scripted_flow
from tests.workflows.flow_model import APPROVE, FlowWorld, card


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=910)
    yield built
    built.close()


def run_all(world: FlowWorld) -> None:
    while world.messages.chains:
        world.deliver(0)


def moto_payment(world: FlowWorld, order_id: str, amount: str = "1500") -> dict[str, Any]:
    """A payment made outside any flow (what a refund or capture flow acts on)."""
    order = {"orderId": order_id, "amount": amount, "currency": "EUR"}
    answer = world.engine.gateway().call(Catalogue.create_moto_order, request={"order": order, "card": card(APPROVE)})
    return answer.operation.wire()


def page_payment(world: FlowWorld, order_id: str) -> dict[str, Any]:
    """A customer's payment on a hosted page of ``order_id`` (what a notification reports as a payment)."""
    body = {key: value for key, value in world.hpp_input(order_id).items() if key != "waitSeconds"}
    world.engine.gateway().call(Catalogue.create_hpp_order, request=body)
    paid = world.sim.admin.complete_hpp(order_id)
    return world.engine.gateway().call(Catalogue.get_operation, paid["operationId"]).wire()


# -- 1. a cancel after the money call, before its read-back ----------------------------------------


def test_a_cancel_while_a_pending_payment_is_read_reads_it_to_the_end(world: FlowWorld) -> None:
    """MOTO answered PENDING, in its settle step; the merchant cancels; the gateway then executes it."""
    world.sim.admin.pend("create_moto_order", final="000")
    flow = world.start("moto", "approve")
    world.deliver(0)
    record = world.record(flow)
    assert record is not None and record.step == "settle" and record.unsettled, world.describe(flow)
    cancelled = world.engine.cancel(flow.flow_id, "the merchant cancels")
    assert cancelled.state is not FlowState.CANCELLED and cancelled.cancel_requested, "a cancel with money in flight is a request"
    world.sim.admin.settle_pending()
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    assert "flow.cancelled" not in [event.type for event, _ in world.engine.events()]
    world.check_settled()


def test_a_cancel_while_a_pending_payment_is_read_cancels_when_it_is_declined(world: FlowWorld) -> None:
    world.sim.admin.pend("create_moto_order", final="116")
    flow = world.start("moto", "approve")
    world.deliver(0)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    world.sim.admin.settle_pending()
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.CANCELLED, world.describe(flow)
    assert not done.unsettled


def test_a_refund_accepted_by_the_gateway_is_not_cancelled_before_its_result_is_read(world: FlowWorld) -> None:
    paid = moto_payment(world, "k910r")
    flow = world.start_flow("refund", {"operationId": paid["operationId"]}, key="refund-1")
    world.deliver(0)  # post: answered {operationId}
    record = world.record(flow)
    assert record is not None and record.step == "result", world.describe(flow)
    world.engine.cancel(flow.flow_id, "too late")
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    assert (done.outcome or {}).get("operation", {}).get("operationResult") in {"REFUNDED", "VOIDED"}


# -- 11. a cancel after an ambiguous answer to a keyed money call ------------------------------------


def test_a_cancel_after_a_keyed_refund_lost_its_answer_reads_what_the_gateway_did(world: FlowWorld) -> None:
    paid = moto_payment(world, "k910s")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    flow = world.start_flow("refund", {"operationId": paid["operationId"]}, key="refund-2")
    world.deliver(0)
    retrying = world.record(flow)
    assert retrying is not None and retrying.state is FlowState.RETRYING, world.describe(flow)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    world.settle()
    done = world.record(flow)
    refunds = [op for op in world.sim.admin.operations() if op.get("parentOperationId") == paid["operationId"]]
    assert len(refunds) == 1, refunds
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    assert refunds[0]["operationId"] in (done.outcome or {}).get("operationIds", [])


def test_a_cancel_after_a_keyed_mit_lost_its_answer_reads_the_order(world: FlowWorld) -> None:
    data = {"order": {"orderId": "m910mit", "amount": "1500", "currency": "EUR"}, "contractId": world.contract}
    world.sim.admin.set_faults(mode="commit_then_fail", operation="create_mit_order", count=1)
    flow = world.start_flow("mit", data, key="mit-1")
    world.deliver(0)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    world.check_settled()


# -- 3. a flow ends failed inside the window where its call may still commit -------------------------


def test_a_flow_does_not_fail_while_a_lost_call_may_still_commit(world: FlowWorld) -> None:
    """The first POST acts late (answered 500); the next tries read 404, post again and get 429 until the
    attempts run out. The late request then commits."""
    world.sim.admin.set_faults(
        rules=[
            {"mode": "late", "operation": "create_moto_order", "count": 1},
            {"mode": "error", "operation": "create_moto_order", "status": 429, "count": 5},
        ]
    )
    flow = world.start("moto", "approve")
    for _ in range(6):
        run_all(world)
        record = world.record(flow)
        assert record is not None
        if record.state is not FlowState.RETRYING:
            break
        world.clock.advance(11)  # past the backoff, not world.advance: the late request has not acted yet
        world.sim.admin.advance_clock(11)
        world.engine.dispatch_due()
    record = world.record(flow)
    assert record is not None and record.state is not FlowState.FAILED, world.describe(flow)
    assert world.sim.admin.release_late() == [200]
    world.sim.admin.clear_faults()
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state in {FlowState.SUCCEEDED, FlowState.NEEDS_ATTENTION}, world.describe(flow)
    world.check_settled()


def test_a_flow_whose_lost_call_never_committed_fails_after_the_read(world: FlowWorld) -> None:
    world.sim.admin.set_faults(
        rules=[
            {"mode": "late", "operation": "create_moto_order", "count": 1},
            {"mode": "error", "operation": "create_moto_order", "status": 429, "count": 5},
        ]
    )
    flow = world.start("moto", "approve")
    world.settle(release=False)  # the late request never acts (its client gave up; the gateway dropped it)
    done = world.record(flow)
    assert done is not None and done.state is FlowState.FAILED, world.describe(flow)
    history = world.engine.history(flow.flow_id)
    assert "the gateway is read before the flow fails" in history[-5]["what"], history
    assert "no money moved" in history[-1]["what"] and history[-1]["call"]["reconcile"], history[-1]


# -- 2. derived order ids collide; adoption needs proof -------------------------------------------------


def test_two_flows_whose_order_ids_differ_late_never_share_a_derived_order(world: FlowWorld) -> None:
    stem = "o" * 16  # with 2 more: the gateway's limit (18), the derived -2 cut to share 15
    first = world.start_flow("hpp", world.hpp_input(stem + "a1"), key="hpp-a")
    second = world.start_flow("hpp", world.hpp_input(stem + "b1"), key="hpp-b")
    run_all(world)
    for flow in (first, second):
        record = world.record(flow)
        assert record is not None
        world.sim.admin.complete_hpp(record.order_id, cancel=True)
    world.settle()
    for flow in (first, second):
        record = world.record(flow)
        assert record is not None and record.state is FlowState.FAILED, world.describe(flow)
    world.engine.retry(first.flow_id)
    run_all(world)
    first_order = world.record(first).order_id  # type: ignore[union-attr]
    world.sim.admin.complete_hpp(first_order)
    world.settle()
    world.engine.retry(second.flow_id)
    world.settle()
    a, b = world.record(first), world.record(second)
    assert a is not None and b is not None
    assert a.order_id != b.order_id and len(b.order_id) <= 18
    assert a.state is FlowState.SUCCEEDED
    assert b.state is not FlowState.SUCCEEDED, world.describe(second)
    assert not set(a.orders) & set(b.orders)


def test_a_start_naming_an_order_another_flow_paid_is_refused(world: FlowWorld) -> None:
    flow = world.start("moto", "approve")
    world.settle()
    record = world.record(flow)
    assert record is not None and record.state is FlowState.SUCCEEDED
    data = {"order": {"orderId": flow.base, "amount": "1500", "currency": "EUR"}, "card": card(APPROVE)}
    with pytest.raises(OrderIdTaken) as refused:
        world.engine.start("moto", data, key="another")
    assert refused.value.field == "order.orderId" and record.id in refused.value.reason


def test_a_payment_older_than_the_flow_is_never_adopted(world: FlowWorld) -> None:
    """The order id was paid long ago (its flow and lookups expired); a new flow names it, its create is
    refused as "already used": the old payment is not this flow's."""
    moto_payment(world, "m910old")
    world.advance(40 * 86400)
    data = {"order": {"orderId": "m910old", "amount": "1500", "currency": "EUR"}, "card": card(APPROVE)}
    flow = world.start_flow("moto", data, key="old-order")
    world.settle()
    record = world.record(flow)
    assert record is not None and record.state is not FlowState.SUCCEEDED, world.describe(flow)


# -- 5. closing a second payment keeps the first as the outcome -------------------------------------------


def test_a_second_payment_is_refunded_and_the_first_stays_the_outcome(world: FlowWorld) -> None:
    flow = world.start("moto", "approve")
    world.settle()
    first = world.record(flow)
    assert first is not None and first.state is FlowState.SUCCEEDED
    first_id = first.outcome["operation"]["operationId"]  # type: ignore[index]
    second = page_payment(world, f"{flow.base}-2")
    world.engine.orders.point(f"{flow.base}-2", flow.flow_id)
    world.engine.signal(flow.flow_id, "notification", {"operation": second}, by=RECEIVER)
    late = world.record(flow)
    assert late is not None and late.state is FlowState.NEEDS_ATTENTION
    with pytest.raises(OperatorError):
        world.engine.retry(flow.flow_id)  # a retry would make the second payment the outcome
    assert world.engine.refund_late_payment(flow.flow_id).state is FlowState.NEEDS_ATTENTION  # until refunded
    world.settle()  # the refund flow refunds it, and its end closes the flow
    closed = world.record(flow)
    assert closed is not None and closed.state is FlowState.SUCCEEDED, world.describe(flow)
    assert closed.outcome is not None and closed.outcome["operation"]["operationId"] == first_id
    assert second["operationId"] in closed.outcome["operationIds"]
    refunds = [op for op in world.sim.admin.operations() if op.get("parentOperationId") == second["operationId"]]
    assert len(refunds) == 1
    succeeded = [event for event, _ in world.engine.events(types=["flow.succeeded"]) if event.body["flow"] == flow.flow_id]
    assert succeeded and all(event.body["data"]["operation"]["operationId"] == first_id for event in succeeded)


# -- 6. and 9. packed records -------------------------------------------------------------------------------


def test_events_after_compaction_keep_the_order_and_step(world: FlowWorld) -> None:
    flow = world.start("moto", "decline")
    world.settle()
    world.engine.store  # noqa: B018
    world.compact()
    record = world.record(flow)
    assert record is not None and record.packed and record.state is FlowState.FAILED
    late = page_payment(world, f"{flow.base}-2")
    assert world.engine.signal(flow.flow_id, "notification", {"operation": late}, by=RECEIVER) == "late_payment"
    events = [event.body for event, _ in world.engine.events() if event.body["flow"] == flow.flow_id]
    assert [event["type"] for event in events[-2:]] == ["payment.late", "flow.needs_attention"]
    for event in events[-2:]:
        assert event["orderId"] == flow.base, event
    assert events[-1]["data"]["step"] == "pay", events[-1]


def test_a_signal_to_a_packed_flow_keeps_the_signals_it_had(world: FlowWorld) -> None:
    flow = world.start("moto", "decline")
    pending = {"operation": {"orderId": flow.base, "operationId": "1", "operationResult": "PENDING"}}
    world.engine.signal(flow.flow_id, "notification", pending, by=RECEIVER)
    world.settle()
    world.compact()
    packed = world.record(flow)
    assert packed is not None and packed.packed and len(packed.signals) == 1
    late = page_payment(world, f"{flow.base}-2")
    world.engine.signal(flow.flow_id, "notification", {"operation": late}, by=RECEIVER)
    record = world.record(flow)
    assert record is not None and len(record.signals) == 2, record.signals


def test_the_compactor_does_not_expire_the_lookups_of_a_flow_a_late_payment_brought_back(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = world.start("moto", "decline")
    world.settle()
    late = page_payment(world, f"{flow.base}-2")
    compactor = world.compactor()
    expire = compactor.orders.expire

    def signal_then_expire(lookups: Any, seconds: int) -> None:
        world.engine.signal(flow.flow_id, "notification", {"operation": late}, by=RECEIVER)
        expire(lookups, seconds)

    monkeypatch.setattr(compactor.orders, "expire", signal_then_expire)
    compactor.run(now=world.clock.now() + 10)
    record = world.record(flow)
    assert record is not None and record.state is FlowState.NEEDS_ATTENTION
    assert world.engine.redis.ttl(world.engine.keys.order(flow.base)) == -1


# -- 9. cancels racing completions --------------------------------------------------------------------


def test_a_cancel_racing_a_completion_into_waiting_takes_effect_at_once(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = world.start("hpp", "approve")
    world.deliver(0)  # create: the page is shown, the payment step is next
    assert world.begin_step(flow) == "held"  # the payment step is about to wait for the customer
    real = world.engine.store.request_cancel

    def completion_first(*args: Any, **kwargs: Any) -> Any:
        world.finish_step(0)  # the step completes between the cancel's read and its write
        return real(*args, **kwargs)

    monkeypatch.setattr(world.engine.store, "request_cancel", completion_first)
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    monkeypatch.undo()
    run_all(world)
    world.engine.dispatch_due()
    run_all(world)
    record = world.record(flow)
    assert record is not None and record.state is FlowState.CANCELLED, world.describe(flow)


def test_a_cancel_of_a_flow_that_expired_writes_nothing(world: FlowWorld) -> None:
    assert world.engine.store.request_cancel("f-gone", 1) is False
    assert world.engine.redis.exists(world.engine.keys.flow("f-gone")) == 0
    with pytest.raises(NotFound):
        world.engine.cancel("f-gone")


def test_a_wait_woken_before_it_began_still_announces_the_real_wait(world: FlowWorld) -> None:
    """The payment step is about to wait when a (PENDING) notification arrives: the move into ``waiting``
    becomes ``ready`` to read it; the step reads it and then really waits. That wait is announced."""
    flow = world.start("hpp", "approve")
    world.deliver(0)  # create only: the flow is ready for its payment step
    assert world.begin_step(flow) == "held"  # the payment step finds no signal: it will wait
    pending = {"operation": {"orderId": flow.base, "operationId": "1", "operationResult": "PENDING"}}
    world.engine.signal(flow.flow_id, "notification", pending, by=RECEIVER)
    world.finish_step(0)  # a signal is there: ready instead of waiting
    run_all(world)  # the step reads the PENDING note and now really waits
    record = world.record(flow)
    assert record is not None and record.state is FlowState.WAITING, world.describe(flow)
    waits = [event for event, _ in world.engine.events(types=["flow.waiting"]) if event.body["flow"] == flow.flow_id]
    assert len(waits) == 1, waits


def test_a_cancel_of_a_flow_stopped_with_its_claims_used_up_still_reads_the_gateway(make_engine: Any) -> None:
    """A money step claimed until its claims ran out (``TooManyRuns``) stops for a person with its money in
    flight; the merchant cancels: the cancel's read must still be claimed (its claims counted afresh), or
    the flow would stop again without ever reading, and the cancel could never end it."""
    step = ScriptedStep("pay", outcomes=[Poll(1.0)] * 20)
    engine, _ = make_engine(scripted_flow(step), engine={"max_step_runs": 10})
    clock = engine.clock
    record = engine.start("demo", {"amount": 5})
    for _ in range(12):
        engine.run_step(record.id, "pay")
        clock.advance(2)
    stopped = engine.get(record.id)
    assert stopped.state is FlowState.NEEDS_ATTENTION and stopped.unsettled, stopped.summary()
    assert engine.cancel(record.id, "the merchant cancels").state is FlowState.READY
    clock.advance(121)  # past the late window: a read finding nothing is believed
    engine.run_step(record.id, "pay")
    done = engine.get(record.id)
    assert done.state is FlowState.CANCELLED and step.reconciled, (done.summary(), engine.history(record.id))


def test_a_read_that_keeps_failing_while_money_is_in_flight_backs_off_and_stops_for_a_person(world: FlowWorld) -> None:
    """A refund accepted (its id answered) whose result the gateway will not show (404 on every read):
    each failed read was an owed failure made due at once again, a hot loop up to the claims' bound. The
    reads back off, bounded, and the flow stops for a person naming the refund."""
    paid = moto_payment(world, "k910t")
    flow = world.start_flow("refund", {"operationId": paid["operationId"]}, key="refund-3")
    world.deliver(0)
    world.sim.admin.set_faults(mode="error", operation="get_operation", status=404, count=1000)
    world.settle(limit=200)
    done = world.record(flow)
    assert done is not None and done.state is FlowState.NEEDS_ATTENTION and done.unsettled, world.describe(flow)
    claims = [entry for entry in world.engine.history(flow.flow_id) if entry["to"] == "running"]
    assert len(claims) <= 8, f"{len(claims)} claims: {world.engine.history(flow.flow_id)}"
