"""Two flows on one gateway target: money by identity, and a check that holds when the money moves
(issue 36, findings 1 to 4).

Refunds and captures act on a payment's order, reservation charges on a reservation: the read-back after a
lost answer sees the target's operations, which say nothing of whose call made them. Each test runs the
real flows on the flow model's world (the real engine, the simulator over HTTP, a Valkey of its own,
messages delivered when the test says) and judges by the gateway's own record of which ``Idempotency-Key``
made each operation: an operation is the flow's whose key made it, never one that merely fits its type,
amount, currency and time (docs/durability.md, "One money call at a time per target").
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.keys import step_idempotency_key
from durapay.workflows.engine.states import FlowState
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import APPROVE, FlowWorld, card
from tests.workflows.model_kinds import ModelFlow

STOPPED = {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION}
#: The step whose call makes each kind's money, and the operation type it makes.
MONEY_STEP = {"refund": "post", "capture": "post", "no_show": "charge", "incremental": "charge", "delay_charge": "charge"}


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=936)
    yield built
    built.close()


def sale(world: FlowWorld, order_id: str, amount: int) -> str:
    """A card payment made outside any flow (what refund flows act on): its operation id."""
    order = {"orderId": order_id, "amount": str(amount), "currency": "EUR"}
    paid = world.engine.gateway().call(Catalogue.create_moto_order, request={"order": order, "card": card(APPROVE)})
    return str(paid.operation.operationId)


def reservation(world: FlowWorld, reservation_id: str, amount: int, **extra: Any) -> str:
    """A reservation of ``amount`` whose guest paid it on its link, outside any flow: its original operation."""
    client = world.engine.gateway()
    body = {"reservationId": reservation_id, "amount": str(amount), "currency": "EUR", **extra}
    client.call(Catalogue.create_reservation, request={"reservation": body})
    link = client.call(Catalogue.create_reservation_paybylink, reservation_id, request={})
    return world.sim.admin.complete_link(str(link.paymentLink.linkId), pan=APPROVE)["operationId"]


def charge(reservation_id: str, amount: int, **extra: Any) -> dict[str, Any]:
    return {"reservationId": reservation_id, "amount": amount, "currency": "EUR", **extra}


def made_by(world: FlowWorld, flow: ModelFlow) -> list[dict[str, Any]]:
    """The operations the gateway made for the flow's money call: those its step's key made."""
    key = step_idempotency_key(flow.flow_id, MONEY_STEP[flow.kind])
    return [op for op in world.sim.admin.operations() if op.get("idempotencyKey") == key]


def named(world: FlowWorld, flow: ModelFlow) -> str | None:
    record = world.record(flow)
    assert record is not None
    return ((record.outcome or {}).get("operation") or {}).get("operationId")


def run(world: FlowWorld, flow: ModelFlow, until: set[FlowState], limit: int = 20) -> Any:
    """Deliver the flow's messages (and dispatch) until it is in one of ``until``; time does not move."""
    for _ in range(limit):
        record = world.record(flow)
        assert record is not None
        if record.state in until:
            return record
        mine = [index for index, (flow_id, _) in enumerate(world.messages.chains) if flow_id == flow.flow_id]
        if mine:
            world.deliver(mine[0])
        else:
            world.engine.dispatch_due()
            if not [flow_id for flow_id, _ in world.messages.chains if flow_id == flow.flow_id]:
                world.advance(1.0)
    raise AssertionError(world.describe(flow))


def mine(world: FlowWorld, flow: ModelFlow) -> list[int]:
    """The positions of the flow's messages."""
    return [index for index, (flow_id, _) in enumerate(world.messages.chains) if flow_id == flow.flow_id]


def to_step(world: FlowWorld, flow: ModelFlow, step: str, limit: int = 20) -> None:
    """Deliver the flow's messages until its ``step`` is ready to be claimed (not yet run)."""
    for _ in range(limit):
        record = world.record(flow)
        assert record is not None
        if record.step == step and record.state is FlowState.READY:
            return
        mine = [index for index, (flow_id, _) in enumerate(world.messages.chains) if flow_id == flow.flow_id]
        if mine:
            world.deliver(mine[0])
        elif not world.engine.dispatch_due():
            world.advance(1.0)
    raise AssertionError(world.describe(flow))


def each_names_its_own(world: FlowWorld, *flows: ModelFlow) -> None:
    """Invariant 6 over one target: every flow succeeded naming the one operation its own key made."""
    seen = set()
    for flow in flows:
        record = world.record(flow)
        assert record is not None and record.state is FlowState.SUCCEEDED, world.describe(flow)
        (own,) = made_by(world, flow)
        assert named(world, flow) == own["operationId"], (own, world.describe(flow))
        seen.add(own["operationId"])
    assert len(seen) == len(flows)


# -- finding 1: a lost charge answer took another flow's charge as its own --------------------------


@pytest.mark.parametrize("kind", ["incremental", "delay_charge"])
def test_a_charge_whose_answer_was_lost_never_adopts_another_flows_charge(world: FlowWorld, kind: str) -> None:
    """The first charge is answered 500 without the gateway acting; a second flow charges the same amount
    on the same reservation while the first waits out its backoff. The first's read-back took any charge of
    that type, amount and currency not in the list it read at its first step: it ended succeeded naming the
    second's charge, and never charged."""
    reservation(world, "k936r1", 20000)
    later = (datetime.fromtimestamp(world.clock.now(), UTC) + timedelta(minutes=10)).isoformat()
    extra = {"runAt": later} if kind == "delay_charge" else {}
    first = world.start_flow(kind, charge("k936r1", 3000, **extra), key="first")
    second = world.start_flow(kind, charge("k936r1", 3000, **extra), key="second")
    if kind == "delay_charge":
        run(world, first, {FlowState.SLEEPING})
        run(world, second, {FlowState.SLEEPING})
        world.advance(601.0)
        world.engine.dispatch_due()
    world.sim.admin.set_faults(mode="error", status=500, operation=f"create_{kind}", count=1)
    assert run(world, first, {FlowState.RETRYING}).step == "charge"
    run(world, second, STOPPED | {FlowState.RETRYING})
    world.settle()
    each_names_its_own(world, first, second)


# -- finding 2: a lost refund answer adopted another refund of the same payment ---------------------


def test_a_refund_whose_answer_was_lost_never_adopts_another_refund_of_the_payment(world: FlowWorld) -> None:
    """Two partial refunds of 1000 of one payment: the first answered 500 without the gateway acting, the
    second refunds, and the first's read-back (no list at all) adopted it: both succeeded naming one
    refund, the customer got 1000 back and the books said 2000."""
    payment = sale(world, "k936p1", 3000)
    first = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="r1")
    second = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="r2")
    world.sim.admin.set_faults(mode="error", status=500, operation="refund_operation", count=1)
    assert run(world, first, {FlowState.RETRYING}).step == "post"
    run(world, second, STOPPED | {FlowState.RETRYING})
    world.settle()
    each_names_its_own(world, first, second)
    refunded = [op for op in world.sim.admin.operations(operation_type="REFUND") if op["orderId"] == "k936p1"]
    assert sum(int(op["amount"]) for op in refunded) == 2000


def test_a_second_call_on_a_held_target_waits_visibly_without_using_an_attempt(world: FlowWorld) -> None:
    """While the first refund's answer is lost the payment's order is its: the second refund's step waits
    (retrying, saying for which flow, no attempt used), and goes on as soon as the first is resolved."""
    payment = sale(world, "k936p2", 3000)
    first = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="r3")
    second = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="r4")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    run(world, first, {FlowState.RETRYING})
    waiting = run(world, second, {FlowState.RETRYING})
    assert waiting.step == "post" and waiting.attempt == 0, world.describe(second)
    assert waiting.error is not None and waiting.error["type"] == "TargetHeld", waiting.error
    assert waiting.error["holder"] == first.flow_id and waiting.error["target"] == "k936p2", waiting.error
    assert first.flow_id in world.engine.history(second.flow_id)[-1]["what"]
    assert made_by(world, second) == [], "nothing sent while the first refund's answer is unknown"
    world.advance(world.engine.retry_policy.cap_seconds + 1)  # the first reads its refund back and goes on
    world.engine.dispatch_due()
    run(world, first, STOPPED)
    woken = world.record(second)
    assert woken is not None and woken.due is not None and woken.due <= world.clock.now() + 1, "woken when the target was let go"
    world.settle()
    each_names_its_own(world, first, second)


def test_a_target_held_by_a_flow_stopped_for_a_person_stays_held(world: FlowWorld) -> None:
    """The first refund's answers are lost every time and its reads cannot tell: it stops for a person,
    its money unresolved, and the payment stays its. The second waits, saying so; a person's retry of the
    first resolves it, and the second goes on."""
    payment = sale(world, "k936p3", 3000)
    first = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="r5")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    run(world, first, {FlowState.RETRYING})
    world.sim.admin.set_faults(mode="error", status=404, operation="get_order", count=40)
    for _ in range(12):
        world.advance(world.engine.retry_policy.cap_seconds + 1)
        world.engine.dispatch_due()
        while mine(world, first):
            world.deliver(mine(world, first)[0])
        if world.record(first).state is FlowState.NEEDS_ATTENTION:  # type: ignore[union-attr]
            break
    assert world.record(first).state is FlowState.NEEDS_ATTENTION, world.describe(first)  # type: ignore[union-attr]
    world.sim.admin.clear_faults()
    second = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="r6")
    waiting = run(world, second, {FlowState.RETRYING})
    assert waiting.error is not None and waiting.error["holder"] == first.flow_id, waiting.error
    assert "needs_attention" in waiting.error["reason"], waiting.error
    world.advance(3600.0)
    world.engine.dispatch_due()
    assert run(world, second, {FlowState.RETRYING}).error["type"] == "TargetHeld", "still held: its money is unresolved"
    world.engine.retry(first.flow_id)
    world.settle()
    each_names_its_own(world, first, second)


# -- finding 3: a delayed charge checked when it starts and charged when it wakes -----------------


def test_two_delayed_charges_started_one_after_the_other_stay_within_the_reservation(world: FlowWorld) -> None:
    """Two 15000 delayed charges of a 20000 reservation, started one after the other: both were checked
    before their sleep (no charge yet), and both charged when they woke: 30000 against a bound of 20000."""
    reservation(world, "k936r2", 20000)
    run_at = (datetime.fromtimestamp(world.clock.now(), UTC) + timedelta(hours=1)).isoformat()
    first = world.start_flow("delay_charge", charge("k936r2", 15000, runAt=run_at), key="d1")
    run(world, first, {FlowState.SLEEPING})
    second = world.start_flow("delay_charge", charge("k936r2", 15000, runAt=run_at), key="d2")
    run(world, second, {FlowState.SLEEPING})
    world.advance(3601.0)
    world.settle()
    charged = [op for op in world.sim.admin.operations(operation_type="DELAY_CHARGE") if op["orderId"] == "k936r2"]
    assert sum(int(op["amount"]) for op in charged) <= 20000, charged
    states = sorted(world.record(flow).state.value for flow in (first, second))  # type: ignore[union-attr]
    assert states == ["failed", "succeeded"], [world.describe(flow) for flow in (first, second)]
    failed = next(world.record(flow) for flow in (first, second) if world.record(flow).state is FlowState.FAILED)  # type: ignore[union-attr]
    assert failed is not None and failed.error is not None and failed.error["field"] == "amount", failed.error


@pytest.mark.parametrize("change", ["check-out moved", "cancelled"])
def test_a_delayed_charge_checks_the_reservation_again_when_it_charges(world: FlowWorld, change: str) -> None:
    """The reservation changes after the charge was checked: its check-out moved past the charge's time
    while the charge slept, or the reservation was cancelled after the gateway's validation, just before
    the charge. Nothing read it again before the charge, and the simulator, like the gateway's public
    material, does not refuse a charge of a cancelled reservation."""
    now = datetime.fromtimestamp(world.clock.now(), UTC)
    reservation(world, "k936r3", 20000, checkOutDate=now.date().isoformat())
    run_at = (now + timedelta(hours=1)).isoformat()
    flow = world.start_flow("delay_charge", charge("k936r3", 5000, runAt=run_at), key="d3")
    run(world, flow, {FlowState.SLEEPING})
    state = world.sim.simulator.state
    if change == "check-out moved":
        with state.lock:
            state.reservations["k936r3"]["checkOutDate"] = (now + timedelta(days=3)).date().isoformat()
    world.advance(3601.0)
    world.engine.dispatch_due()
    to_step(world, flow, "charge")
    if change == "cancelled":
        with state.lock:
            state.reservations["k936r3"]["status"] = "CANCELED"
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.FAILED, world.describe(flow)
    assert done.error is not None and done.error["type"] == "InputError", done.error
    assert [op for op in world.sim.admin.operations(operation_type="DELAY_CHARGE") if op["orderId"] == "k936r3"] == []


# -- finding 4: a cancel after a lost answer to a no-show charge -----------------------------------


@pytest.mark.parametrize("lost", ["answer", "worker"])
def test_a_cancel_after_a_lost_no_show_answer_never_ends_cancelled_over_the_charge(world: FlowWorld, lost: str) -> None:
    """The gateway commits the no-show and its answer is lost (a 500, or the worker killed before it wrote
    it); the merchant cancels. The cancel's read-back judged by resemblance, among them that the charge was
    made no earlier than a minute before the flow started by the gateway's clock: with the gateway's clock
    two minutes behind durapay's it found nothing it recognised, waited out the late window and ended the
    flow cancelled, the guest charged. The call's operation is known by what the reservation did not hold
    when the call was claimed."""
    world.clock.advance(120.0)  # durapay's clock (the Redis server's) two minutes ahead of the gateway's
    reservation(world, "k936r4", 20000)
    flow = world.start_flow("no_show", charge("k936r4", 5000), key="n1")
    to_step(world, flow, "charge")
    if lost == "answer":
        world.sim.admin.set_faults(mode="commit_then_fail", operation="create_no_show", count=1)
        run(world, flow, {FlowState.RETRYING})
    else:
        assert world.kill_mid_step(flow) == "killed"
    assert len(made_by(world, flow)) == 1, "the gateway charged the guest"
    world.engine.cancel(flow.flow_id, "the merchant cancels")
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    assert named(world, flow) == made_by(world, flow)[0]["operationId"]


# -- cost: the gateway reads a post-operation pays for its target -----------------------------------


def reads_before_call(world: FlowWorld, flow: ModelFlow, op: str) -> list[str]:
    """The gateway calls the flow's money step made before its call ``op`` (its history's record of it)."""
    (call,) = [
        entry["call"] for entry in world.engine.history(flow.flow_id) if (entry.get("call") or {}).get("op", "").endswith(op)
    ]
    return str(call["op"]).split(" then ")[:-1]


@pytest.mark.parametrize("amount", [None, 1000])
def test_a_full_refund_pays_one_gateway_read_for_its_target_as_documented(world: FlowWorld, amount: int | None) -> None:
    """Cost (docs/durability.md, "One money call at a time per target", Cost). A refund of a payment a flow of
    durapay made knows its order (the payment's answer named it): the order's read is its snapshot and its
    partial refund's check, one gateway read before the refund. It read the payment's operation first on
    every refund, capture and cancel of a capture: two. A payment made outside durapay is named only by the
    operation's read: two, as documented."""
    order = {"orderId": "k936p9", "amount": "3000", "currency": "EUR"}
    paid = world.start_flow("moto", {"order": order, "card": card(APPROVE)}, key="m9")
    world.settle()
    payment = named(world, paid)
    assert payment is not None
    part = {} if amount is None else {"amount": amount, "currency": "EUR"}
    flow = world.start_flow("refund", {"operationId": payment, **part}, key=f"rv4-{amount}")
    world.settle()
    assert world.record(flow).state is FlowState.SUCCEEDED, world.describe(flow)  # type: ignore[union-attr]
    assert reads_before_call(world, flow, "refund_operation") == ["get_order"]
    outside = world.start_flow("refund", {"operationId": sale(world, "k936p10", 3000), **part}, key=f"rv5-{amount}")
    world.settle()
    assert world.record(outside).state is FlowState.SUCCEEDED, world.describe(outside)  # type: ignore[union-attr]
    assert reads_before_call(world, outside, "refund_operation") == ["get_operation", "get_order"]
