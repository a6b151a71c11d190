"""The target rule itself (``workflows.engine.targets``): who holds a gateway target, when it is let go, and every
path by which it could be taken twice.

Real refund flows on the flow model's world (the real engine and scripts, the simulator over HTTP, a Valkey
of its own), and the scripts alone where a path can only be reached by placing a record exactly so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.targets import hold_of
from tests.workflows.aof_tail import AofTail
from tests.workflows.engine.test_shared_targets import STOPPED, each_names_its_own, made_by, mine, named, run, sale
from tests.workflows.flow_model import FlowWorld
from tests.workflows.model_kinds import ModelFlow


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=937)
    yield built
    built.close()


def refund(world: FlowWorld, payment: str, key: str) -> ModelFlow:
    return world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key=key)


def holder(world: FlowWorld, order_id: str) -> dict[str, str]:
    raw = world.engine.redis.hgetall(world.engine.keys.target(order_id))
    return {key.decode(): value.decode() for key, value in raw.items()}


def test_two_flows_racing_to_one_target_send_one_call_at_a_time(world: FlowWorld) -> None:
    """Both refunds are claimed before either completes: the one that takes the order sends; the other's
    claim finds it held and waits, and never sends while the first's call is unanswered."""
    payment = sale(world, "k937p1", 3000)
    first, second = refund(world, payment, "a1"), refund(world, payment, "a2")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    assert world.begin_step(first) == "held"  # claimed, order taken, refund sent (its answer lost), not completed
    assert holder(world, "k937p1")["flow"] == first.flow_id
    assert world.begin_step(second) == "held"
    world.finish_step(1)  # the second's completion: it waits
    waiting = world.record(second)
    assert waiting is not None and waiting.state is FlowState.RETRYING and waiting.error["type"] == "TargetHeld"  # type: ignore[index]
    assert made_by(world, second) == []
    world.finish_step(0)
    world.settle()
    each_names_its_own(world, first, second)
    assert holder(world, "k937p1") == {}, "let go once resolved"


def test_a_worker_killed_holding_the_target_keeps_it_until_its_call_is_read_back(world: FlowWorld) -> None:
    """The first refund's worker dies after the gateway refunded: its record says its call is unanswered,
    so the order stays its, whatever the lease. The step is taken up after the lease, reads its refund back
    by its snapshot, and lets the order go."""
    payment = sale(world, "k937p2", 3000)
    first = refund(world, payment, "b1")
    assert world.kill_mid_step(first) == "killed"
    second = refund(world, payment, "b2")
    run(world, second, {FlowState.RETRYING})
    world.advance(31.0)  # past the dead worker's lease
    world.engine.dispatch_due()
    waiting = world.record(second)
    assert waiting is not None and waiting.error is not None and waiting.error["holder"] == first.flow_id
    world.settle()
    each_names_its_own(world, first, second)


def test_a_key_left_by_a_holder_that_resolved_is_taken_over(world: FlowWorld) -> None:
    """A worker that died between its completion and its release leaves the key naming a flow whose call
    is resolved: the next flow asks that flow's record, takes the order over, and refunds."""
    payment = sale(world, "k937p3", 3000)
    first = refund(world, payment, "c1")
    world.engine.targets.release = lambda claim: None  # type: ignore[method-assign]  # the worker dies there
    world.settle()
    assert holder(world, "k937p3")["flow"] == first.flow_id
    del world.engine.targets.release
    second = refund(world, payment, "c2")
    world.settle()
    each_names_its_own(world, first, second)


def test_a_cancel_of_a_waiting_flow_ends_it_at_once_and_of_the_holder_reads_first(world: FlowWorld) -> None:
    """The waiting flow sent nothing: a cancel ends it. The holder's call is unanswered: its cancel reads
    the order back by its snapshot and ends it succeeded, its refund named."""
    payment = sale(world, "k937p4", 3000)
    first, second = refund(world, payment, "d1"), refund(world, payment, "d2")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    run(world, first, {FlowState.RETRYING})
    run(world, second, {FlowState.RETRYING})
    assert world.engine.cancel(second.flow_id, "not needed").state is FlowState.CANCELLED
    assert world.engine.cancel(first.flow_id, "too late").cancel_requested
    world.settle()
    done = world.record(first)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(first)
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == made_by(world, first)[0]["operationId"]
    assert made_by(world, second) == []


def test_an_operators_retry_of_the_holder_reads_back_by_its_first_snapshot(world: FlowWorld) -> None:
    """The holder's reads cannot tell, bounded: it stops for a person, still holding the order. A person's
    retry keeps the hold and its snapshot (the first try's, from before its call was sent), so a refund
    made outside durapay meanwhile (nothing keeps a target there: docs/durability.md) is a second
    candidate the read-back cannot tell from its own: a person looks, nothing is adopted by resemblance."""
    payment = sale(world, "k937p5", 3000)
    first = refund(world, payment, "e1")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    run(world, first, {FlowState.RETRYING})
    before = hold_of(world.record(first), "post")  # type: ignore[arg-type]
    assert before is not None and isinstance(before.get("before"), list)
    world.sim.admin.set_faults(mode="error", status=404, operation="get_order", count=40)
    for _ in range(12):
        world.advance(world.engine.retry_policy.cap_seconds + 1)
        world.engine.dispatch_due()
        while mine(world, first):
            world.deliver(mine(world, first)[0])
        if world.record(first).state is FlowState.NEEDS_ATTENTION:  # type: ignore[union-attr]
            break
    world.sim.admin.clear_faults()
    body = {"amount": "1000", "currency": "EUR"}
    outside = world.engine.gateway().call(Catalogue.refund_operation, payment, request=body, idempotency_key="back-office")
    world.engine.retry(first.flow_id)
    world.settle()
    after = world.record(first)
    assert after is not None and after.state is FlowState.NEEDS_ATTENTION, world.describe(first)
    held = hold_of(after, "post")
    assert held is not None and held["token"] == before["token"] and held["before"] == before["before"]
    assert after.error is not None and after.error["reason"] == "ambiguous", after.error
    ours = made_by(world, first)[0]["operationId"]
    assert sorted(after.error["operationIds"]) == sorted([ours, outside.operationId])


def test_a_hold_left_by_a_try_whose_money_was_settled_is_not_the_snapshot_of_the_next_call(world: FlowWorld) -> None:
    """The refund's first try is refused (429: not acted, its mark settled, the order let go); the back
    office refunds the same amount; the next try's call is answered 500 without acting. That try took its
    hold again from the first (the same token and snapshot, from before the back office's refund) and its
    read-back adopted the back office's refund as its own. A hold is the call's only under the mark it was
    written after: the try takes a hold and a snapshot of its own, finds nothing new, and refunds."""
    payment = sale(world, "k937p9", 3000)
    flow = refund(world, payment, "s1")
    world.sim.admin.set_faults(mode="error", status=429, operation="refund_operation", count=1)
    run(world, flow, {FlowState.RETRYING})
    first = hold_of(world.record(flow), "post")  # type: ignore[arg-type]
    assert first is not None and world.record(flow).unsettled is None, world.describe(flow)  # type: ignore[union-attr]
    body = {"amount": "1000", "currency": "EUR"}
    world.engine.gateway().call(Catalogue.refund_operation, payment, request=body, idempotency_key="back-office-s")
    world.sim.admin.set_faults(mode="error", status=500, operation="refund_operation", count=1)
    world.advance(world.engine.retry_policy.cap_seconds + 1)
    world.engine.dispatch_due()
    while mine(world, flow):
        world.deliver(mine(world, flow)[0])
    assert world.record(flow).reconcile, world.describe(flow)  # type: ignore[union-attr]  # the 500: read first
    second = hold_of(world.record(flow), "post")  # type: ignore[arg-type]
    assert second is not None and second["token"] != first["token"], (first, second)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    (own,) = made_by(world, flow)
    assert named(world, flow) == own["operationId"], "it named the back office's refund"


# -- the scripts alone -----------------------------------------------------------------------------


def place(world: FlowWorld, flow_id: str, **fields: Any) -> None:
    client = world.engine.redis
    client.hset(world.engine.keys.flow(flow_id), mapping={"id": flow_id, **{k: str(v) for k, v in fields.items()}})


def test_a_take_over_fences_a_claim_that_had_not_recorded_its_hold(world: FlowWorld) -> None:
    """A flow running a claim whose hold is not recorded under the key's token is free to take over; the
    fence makes sure that claim, if its worker is still alive, can no longer record that hold (and so never
    sends)."""
    targets = world.engine.targets
    place(world, "fa", state="running", version="7", lease_owner="w", step="post", kind="refund")
    assert targets._check("fa", {"target": "o1", "token": "t1"}, fence=True)[0] == "free"
    args = ["intent", "7", "w", json.dumps({"step": "post", "target": "o1", "token": "t1", "t": 1})]
    assert targets._flow(keys=[world.engine.keys.flow("fa")], args=args)[0] == b"lost"
    args[3] = json.dumps({"step": "post", "target": "o1", "token": "t2", "t": 1})
    assert targets._flow(keys=[world.engine.keys.flow("fa")], args=args)[0] == b"ok", "another token is its own"


def test_a_holder_is_held_only_while_its_call_is_unanswered(world: FlowWorld) -> None:
    targets = world.engine.targets
    hold = json.dumps({"step": "post", "target": "o2", "token": "t1", "t": 1, "before": []})
    unanswered = json.dumps({"step": "post", "op": "refund_operation", "t": 1})
    place(world, "fb", state="needs_attention", step="post", kind="refund", hold=hold, unsettled=unanswered)
    assert targets._check("fb", {"target": "o2", "token": "t1"}, fence=True)[:2] == ["held", "needs_attention"]
    assert targets._check("fb", {"target": "o2", "token": "t9"})[0] == "free", "another token is another hold"
    told = json.dumps({"step": "post", "op": "refund_operation", "t": 1, "operationId": "op-1"})
    place(world, "fb", unsettled=told)
    assert targets._check("fb", {"target": "o2", "token": "t1"})[0] == "free", "its operation is named: resolved"
    assert targets._check("gone", {"target": "o2", "token": "t1"})[0] == "free", "a record gone ended long ago"


def test_a_take_sent_again_answers_as_the_first(world: FlowWorld) -> None:
    """Resend-safe (a failover between the take and its answer): the same token finds its own take."""
    targets = world.engine.targets
    assert targets._take_key("o3", "fc", "t1") == ["ok"]
    assert targets._take_key("o3", "fc", "t1") == ["ok"]
    assert targets._take_key("o3", "fd", "t2") == ["held", "fc", "t1"]
    assert targets._take_key("o3", "fd", "t2", "t1") == ["ok"], "taken over from the token it found let go"
    waiters = world.engine.redis.zrange(world.engine.keys.target_waiters("o3"), 0, -1)
    assert waiters == [], "the waiter that took it is no longer listed"


def test_waiting_flows_are_woken_when_the_target_is_let_go(world: FlowWorld) -> None:
    payment = sale(world, "k937p6", 5000)
    first = refund(world, payment, "f1")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    run(world, first, {FlowState.RETRYING})
    waiting = [refund(world, payment, f"f{n}") for n in range(2, 5)]
    for flow in waiting:
        run(world, flow, {FlowState.RETRYING})
    listed = world.engine.redis.zrange(world.engine.keys.target_waiters("k937p6"), 0, -1)
    assert sorted(item.decode() for item in listed) == sorted(flow.flow_id for flow in waiting)
    world.advance(world.engine.retry_policy.cap_seconds + 1)
    world.engine.dispatch_due()
    run(world, first, STOPPED)
    now = world.clock.now()
    for flow in waiting:
        record = world.record(flow)
        assert record is not None and record.due is not None and record.due <= now, world.describe(flow)
    world.settle()
    each_names_its_own(world, first, *waiting)
