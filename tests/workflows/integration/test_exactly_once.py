"""Exactly once at the edges: fault sequences, "already done" answers, adopting the right operation.

Each test reproduces a way money went wrong in independent testing (a late commit followed by a 429;
a reconcile that adopted a later refund) against the real parts: Valkey, a Celery worker, the simulator
over HTTP. The invariant checked at the gateway's own ledger: money taken is reflected in the flow
(``succeeded``, or ``needs_attention`` naming it), and no step charges twice.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Claim, Engine, OrderIdTaken
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import STOPPED, FlowState
from durapay.workflows.engine.store import FlowRecord
from durapay.workflows.flows import REGISTRY
from tests.waiting import wait_until
from tests.workflows.integration.conftest import Stack, stack_settings
from tests.workflows.integration.test_flows import APPROVE, card, order, session, wait_for_state

#: Operations that take money (or verify a card) and are the flow's own payment.
PAYMENT_TYPES = {"AUTHORIZATION", "CAPTURE", "CARD_VERIFICATION"}
SUCCESS = {"AUTHORIZED", "EXECUTED"}


def payments(simulator: SimulatorServer, order_ids: list[str]) -> list[dict[str, Any]]:
    """Successful payment operations the gateway recorded on any of the orders (post-operations aside)."""
    found = []
    for order_id in order_ids:
        for op in simulator.admin.operations(order_id=order_id):
            if op["operationType"] in PAYMENT_TYPES and op["operationResult"] in SUCCESS and not op.get("parentOperationId"):
                found.append(op)
    return found


def inputs(kind: str) -> dict[str, Any]:
    if kind == "card_verification":
        return {"order": order(0), "card": card(APPROVE)}
    return {"order": order(), "card": card(APPROVE)}


def in_flight(simulator: SimulatorServer) -> int:
    return int(simulator.admin.health()["inFlight"])


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kind", "operation"),
    [
        ("moto", "create_moto_order"),
        ("card_verification", "card_verification"),
        ("svs", "svs_init_order"),
        ("svs", "svs_pay_operation"),
        ("three_steps", "three_steps_init"),
        ("three_steps", "three_steps_payment"),
    ],
)
def test_a_late_commit_then_a_429_ends_succeeded_and_charged_once(stack: Stack, kind: str, operation: str) -> None:
    """The first request commits after the client gave up (3 s against a 2 s timeout); the reconcile read
    finds nothing yet, the resend is answered 429, and the next resend hits the committed order. The
    mark "this call may have reached the gateway" must survive the 429, and "already used" / "already
    completed" must be read as "already done", not as a refusal."""
    sim = stack.simulator
    sim.admin.set_faults(mode="latency", operation=operation, count=1, latency_ms=3000)
    flow = stack.engine.start(kind, inputs(kind))
    wait_until(lambda: in_flight(sim) >= 1, what="the slow request to reach the gateway")
    sim.admin.set_faults(mode="error", operation=operation, count=1, status=429, retry_after=3)
    done = stack.engine.wait(flow.id, 60)
    history = stack.engine.history(flow.id)
    assert done.state is FlowState.SUCCEEDED, (done.summary(), history)
    charged = payments(sim, done.orders)
    assert len(charged) == 1, (charged, history)
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == charged[0]["operationId"]


@pytest.mark.integration
@pytest.mark.parametrize("post", ["refund", "capture"])
def test_reconcile_adopts_the_steps_own_payment_not_a_later_post_operation(stack: Stack, post: str) -> None:
    """A MOTO payment commits but its answer is lost; before the flow reads the order back, a refund (or
    a capture) is made on the payment. The read must adopt the payment the step made, not the order's
    latest operation."""
    sim = stack.simulator
    data = inputs("moto") | ({"captureType": "EXPLICIT"} if post == "capture" else {})
    sim.admin.set_faults(mode="hang", operation="create_moto_order", count=1, seconds=30, commit=True)
    flow = stack.engine.start("moto", data)
    order_id = data["order"]["orderId"]
    wait_until(lambda: payments(sim, [order_id]), what="the payment to commit at the gateway")
    payment = payments(sim, [order_id])[0]
    # Straight to the gateway (well inside the payment call's 2 s timeout, before the flow reads back).
    op = Catalogue.refund_operation if post == "refund" else Catalogue.capture_operation
    stack.engine.gateway().call(op, payment["operationId"], request={}, idempotency_key=f"test-{post}-{order_id}")
    done = stack.engine.wait(flow.id, 60)
    history = stack.engine.history(flow.id)
    assert done.state is FlowState.SUCCEEDED, (done.summary(), history)
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == payment["operationId"], history
    assert len(payments(sim, [order_id])) == 1


@pytest.mark.integration
def test_an_order_id_already_used_by_another_payment_is_never_adopted(stack: Stack) -> None:
    """A merchant starts a second MOTO flow naming an order id another flow paid: refused before anything
    is written or sent (the payment on it is the first flow's), whatever the amount."""
    first = stack.run("moto", inputs("moto"))
    assert first.state is FlowState.SUCCEEDED
    for amount in ("999", first.input["order"]["amount"]):
        other = {"order": {**first.input["order"], "amount": amount}, "card": card(APPROVE)}
        with pytest.raises(OrderIdTaken) as refused:
            stack.engine.start("moto", other)
        assert refused.value.field == "order.orderId" and first.id in refused.value.reason
    assert len(payments(stack.simulator, [first.order_id])) == 1


@pytest.mark.integration
def test_a_payment_on_the_first_page_after_a_restart_on_a_new_order_needs_a_person(clocked_stack: Stack) -> None:
    """A hosted-page flow failed (no payment by its deadline); the operator restarted it on ``<orderId>-2``;
    the customer, who still had the first page, pays there. That money is the flow's to account for."""
    stack = clocked_stack
    started = stack.engine.start("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 60})
    stack.pass_deadline(wait_for_state(stack, started.id, FlowState.WAITING).id)
    failed = stack.engine.wait(started.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    first_order = failed.order_id
    stack.engine.retry(started.id)
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    assert waiting.order_id != first_order and waiting.orders == [first_order, waiting.order_id]
    paid = stack.simulator.admin.complete_hpp(first_order)
    assert stack.engine.flow_for_order(first_order) == started.id, "the first order still routes to the flow"
    operation = {"orderId": first_order, "operationId": paid["operationId"], "operationResult": paid["operationResult"]}
    stack.engine.signal(started.id, "notification", {"operation": operation}, by="notification")
    done = stack.engine.wait(started.id, 20)
    assert done.state is FlowState.NEEDS_ATTENTION, (done.summary(), stack.engine.history(started.id))
    assert done.error is not None and done.error["type"] == "LatePayment"
    assert done.error["operation"]["operationId"] == paid["operationId"]


@pytest.mark.integration
def test_the_deadline_read_finds_a_payment_on_an_earlier_order(clocked_stack: Stack) -> None:
    """The same, but the notification of the first page is lost: the read at the deadline looks at every
    order the flow made. (The deadlines are passed by moving the engine's clock: the payment must be
    made before the second one however slow the machine.)"""
    stack = clocked_stack
    started = stack.engine.start("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 60})
    stack.pass_deadline(wait_for_state(stack, started.id, FlowState.WAITING).id)
    assert stack.engine.wait(started.id, 30).state is FlowState.FAILED
    first_order = stack.engine.get(started.id).order_id
    stack.engine.retry(started.id)
    wait_for_state(stack, started.id, FlowState.WAITING)
    paid = stack.simulator.admin.complete_hpp(first_order)
    stack.pass_deadline(started.id)
    done = stack.engine.wait(started.id, 30)
    assert done.state is FlowState.NEEDS_ATTENTION, (done.summary(), stack.engine.history(started.id))
    assert done.error is not None and done.error["operation"]["operationId"] == paid["operationId"]


# -- Redis losing its last writes ---------------------------------------------------------------------


class Snapshot:
    """A flow's record, log, due entry and state index as they were: restoring it is Redis losing every
    write made to the flow since (a host crash inside ``everysec``'s second, a failover to a replica
    that had not received them)."""

    def __init__(self, engine: Engine, flow_id: str) -> None:
        self.engine, self.flow_id = engine, flow_id
        keys = engine.keys
        self.dumps = {key: engine.redis.dump(key) for key in (keys.flow(flow_id), keys.log(flow_id))}
        self.due = engine.redis.zscore(keys.due_of(flow_id), flow_id)
        self.state = engine.get(flow_id).state

    def restore(self) -> None:
        engine, keys, flow_id = self.engine, self.engine.keys, self.flow_id
        for key, dumped in self.dumps.items():
            engine.redis.restore(key, 0, dumped, replace=True)
        partition = keys.partition(flow_id)
        for state in FlowState:
            engine.redis.zrem(keys.by_state(partition, state.value), flow_id)
        engine.redis.zadd(keys.by_state(partition, self.state.value), {flow_id: 0})
        if self.due is not None:
            engine.redis.zadd(keys.due_of(flow_id), {flow_id: self.due})


def drive(engine: Engine, clock: ManualClock, flow_id: str, *, until: frozenset[FlowState] = STOPPED) -> FlowRecord:
    """Run what is due (moving the clock to it) until the flow is in one of ``until``."""
    for _ in range(100):
        record = engine.get(flow_id)
        if record.state in until:
            return record
        due = record.lease_until if record.state is FlowState.RUNNING else record.due
        if due is not None and due > clock.now():
            clock.set(due + 0.001)
        engine.run_step(flow_id, record.step)
    raise AssertionError(f"flow {flow_id} did not get there: {engine.history(flow_id)[-5:]}")


@pytest.fixture
def bare_engine(redis_client: redis.Redis, key_prefix: str, simulator: SimulatorServer) -> Iterator[tuple[Engine, ManualClock]]:
    """An engine without Celery (steps run here, in order) against the simulator, on a manual clock."""
    clock = ManualClock()
    settings = stack_settings(key_prefix, simulator.base_url)
    engine = Engine(settings, redis_client, REGISTRY, clock=clock, rng=random.Random(3))
    yield engine, clock
    engine.gateway().close()


def run_to_the_end(engine: Engine, clock: ManualClock, simulator: SimulatorServer, flow_id: str) -> FlowRecord:
    """Run the flow; a hosted page is paid by the customer once it shows, and read at its deadline."""
    if engine.get(flow_id).kind == "hpp":
        waiting = drive(engine, clock, flow_id, until=frozenset({FlowState.WAITING}))
        simulator.admin.complete_hpp(waiting.order_id)
    return drive(engine, clock, flow_id)


@pytest.mark.integration
@pytest.mark.parametrize("lost", ["since the first claim", "since the start"])
@pytest.mark.parametrize("kind", ["three_steps", "moto", "svs", "hpp"])
def test_a_flow_whose_writes_redis_lost_runs_again_without_charging_twice(
    bare_engine: tuple[Engine, ManualClock], simulator: SimulatorServer, kind: str, lost: str
) -> None:
    """The flow succeeds and is charged; then Redis loses every write since its start (or since its first
    step was claimed). The step runs again: its call finds the order already there, reads the gateway
    and adopts this flow's payment, never moving on to a fresh order id to be charged again."""
    engine, clock = bare_engine
    data = {"order": order(), "paymentSession": session()} if kind == "hpp" else inputs(kind)
    flow = engine.start(kind, data)
    if lost == "since the first claim":
        assert isinstance(engine.claim(flow.id, flow.step), Claim)
    snapshot = Snapshot(engine, flow.id)
    done = run_to_the_end(engine, clock, simulator, flow.id)
    assert done.state is FlowState.SUCCEEDED, (done.summary(), engine.history(flow.id))
    assert len(payments(simulator, done.orders)) == 1
    snapshot.restore()
    again = drive(engine, clock, flow.id)
    history = engine.history(flow.id)
    assert again.state is FlowState.SUCCEEDED, (again.summary(), history)
    charged = payments(simulator, sorted(set(again.orders) | set(done.orders)))
    assert len(charged) == 1, (charged, history)


@pytest.mark.integration
def test_a_finalize_redis_forgot_is_read_back_when_the_gateway_refuses_it_again(
    bare_engine: tuple[Engine, ManualClock], simulator: SimulatorServer
) -> None:
    """Found by ``durapay chaos --lose-last-writes``: the embedded form's finalize charged the card, then
    Redis lost its claim and completion (a host crash inside ``everysec``'s second). The step runs again
    with no mark that it may have been sent, and the gateway refuses a second finalize ("session is in
    state PAYMENT_COMPLETE", not an "already" phrase). The refusal of a call that moves money is read
    back before the flow may fail: the payment is adopted."""
    engine, clock = bare_engine
    body = {"merchantUrl": "https://shop.example", "order": order(), "paymentSession": session(), "formSeconds": 5}
    flow = engine.start("build", body)
    waiting = drive(engine, clock, flow.id, until=frozenset({FlowState.WAITING}))
    simulator.admin.fill_build_form(waiting.outputs["create"]["sessionId"])
    ready = drive(engine, clock, flow.id, until=frozenset({FlowState.READY}))
    assert ready.step == "finalize", engine.history(flow.id)
    snapshot = Snapshot(engine, flow.id)
    first = drive(engine, clock, flow.id)
    assert first.state is FlowState.SUCCEEDED, (first.summary(), engine.history(flow.id))
    snapshot.restore()  # Redis lost the finalize's claim and completion: the step runs again unmarked
    again = drive(engine, clock, flow.id)
    history = engine.history(flow.id)
    assert again.state is FlowState.SUCCEEDED, (again.summary(), history)
    charged = payments(simulator, again.orders)
    assert len(charged) == 1, (charged, history)
    assert again.outcome is not None and again.outcome["operation"]["operationId"] == charged[0]["operationId"]
