"""Money steps with no snapshot of their target (``workflows.engine.targets``): known from what the record says,
never from a hold missing.

* A flow of this release whose hold was never written (its target's first read failed, its worker died
  after its claim, its claim was not durable in time) sent nothing under its mark: it takes its target and
  its snapshot as any, and never adopts an operation it did not make.
* A flow whose call an earlier release sent with no hold (its mark carries no format, ``inflight.sent_unheld``)
  takes its target again under the same token on every try, and adopts nothing on its own: a person decides
  (``ForeignOperation``, ``legacy``), their retry taking the one operation listed, their cancel none.

Real flows on the flow model's world (the real engine and scripts, the simulator over HTTP, a Valkey of its
own; review of issue 36, findings 1 and 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Claim
from durapay.workflows.engine.durability import NotDurable
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.targets import hold_of
from tests.workflows.aof_tail import AofTail, FloorDurability
from tests.workflows.engine.test_shared_targets import STOPPED, charge, made_by, mine, named, reservation, run, sale, to_step
from tests.workflows.flow_model import FlowWorld
from tests.workflows.model_kinds import ModelFlow


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=3601)
    yield built
    built.close()


def refund(world: FlowWorld, payment: str, key: str) -> ModelFlow:
    return world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key=key)


def as_an_earlier_release_wrote_it(world: FlowWorld, flow: ModelFlow, target: str) -> None:
    """The flow's call unanswered, as a release before target holds left it: no hold on its record, no key,
    and its mark of money in flight without this release's format."""
    client, keys = world.engine.redis, world.engine.keys
    mark = json.loads(client.hget(keys.flow(flow.flow_id), "unsettled") or b"{}")
    assert mark.get("v") == 2, mark
    del mark["v"]
    client.hset(keys.flow(flow.flow_id), "unsettled", json.dumps(mark))
    client.hdel(keys.flow(flow.flow_id), "hold")
    client.delete(keys.target(target))


def forget_keys(world: FlowWorld) -> None:
    state = world.sim.simulator.state
    with state.lock:
        state.idempotency.clear()


def waiting_on_a_person(world: FlowWorld) -> Any:
    """``FlowWorld.settle``'s ``stalled``: every live flow waits for a holder stopped for a person."""

    def stalled(live: list[ModelFlow]) -> bool:
        records = [world.record(flow) for flow in live]
        held = [r is not None and r.state is FlowState.RETRYING and (r.error or {}).get("type") == "TargetHeld" for r in records]
        return all(held)

    return stalled


# -- a flow of this release that never wrote its hold --------------------------------------------------


def test_a_refund_stopped_before_its_hold_never_adopts_a_refund_it_did_not_make(world: FlowWorld) -> None:
    """Invariants 6 and 3. The refund's first read (the payment's operation, to name its target) is answered
    401: it stops for a person before any hold or call. The back office then refunds the same amount. The
    person's retry sets ``reconcile``: taken for a flow "whose call an earlier release sent" (no hold, a read
    first, money in flight), it took no snapshot and adopted the back office's refund by resemblance, and its
    own refund was never sent. Its mark says it is of this release: it takes a snapshot, and refunds."""
    payment = sale(world, "k3601p1", 3000)
    flow = refund(world, payment, "rv1")
    world.sim.admin.set_faults(mode="error", status=401, operation="get_operation", count=1)
    stopped = run(world, flow, STOPPED)
    assert stopped.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert made_by(world, flow) == [], "nothing was sent"
    body = {"amount": "1000", "currency": "EUR"}
    world.engine.gateway().call(Catalogue.refund_operation, payment, request=body, idempotency_key="back-office-1")
    world.sim.admin.clear_faults()
    world.engine.retry(flow.flow_id)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    own = made_by(world, flow)
    assert len(own) == 1, f"its refund was never sent: it names {named(world, flow)}, the back office's"
    assert named(world, flow) == own[0]["operationId"]


@pytest.mark.parametrize("missing", ["worker killed after its claim", "claim not durable in time"])
def test_a_delayed_charge_whose_hold_was_never_written_never_adopts_an_expired_flows_charge(
    world: FlowWorld, missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 6 (a charge reported taken that never was). A delayed charge of 3000 sleeps 40 days; another
    of 3000 on the same reservation charges and ends, and its record (with its ``op:`` lookup) expires. The
    sleeper's charge step is claimed (durably, or its durability wait times out) and its worker dies before
    it writes its hold. Its next try, uncertain with no hold, took the other flow's charge by resemblance;
    its mark says no call was sent under it: it takes its snapshot and charges."""
    reservation(world, "k3601r1", 20000)
    now = datetime.fromtimestamp(world.clock.now(), UTC)
    sleeper = world.start_flow("delay_charge", charge("k3601r1", 3000, runAt=(now + timedelta(days=40)).isoformat()), key="dv1")
    run(world, sleeper, {FlowState.SLEEPING})
    other = world.start_flow("delay_charge", charge("k3601r1", 3000, runAt=(now + timedelta(hours=1)).isoformat()), key="dv2")
    run(world, other, {FlowState.SLEEPING})
    world.advance(3601.0)
    world.engine.dispatch_due()
    run(world, other, STOPPED)
    assert world.record(other).state is FlowState.SUCCEEDED  # type: ignore[union-attr]
    assert len(made_by(world, other)) == 1
    world.expire_retention()  # 30 days and a minute: the other flow's record and lookups are gone
    assert world.record(other) is None
    world.advance(10 * 86400.0)  # past the sleeper's runAt
    world.engine.dispatch_due()
    to_step(world, sleeper, "charge")
    if missing == "worker killed after its claim":
        claim = world.engine.protocol.claim(sleeper.flow_id, "charge", worker="doomed", money=True)
        assert isinstance(claim, Claim), claim
    else:  # the claim's WAITAOF times out: "runs after the lease, reading first"

        def not_durable(self: Any, pinned: Any, what: str) -> None:
            raise NotDurable(f"{what}: not durable in time")

        with monkeypatch.context() as patch:
            patch.setattr(FloorDurability, "wait", not_durable)
            assert world.engine.run_step(sleeper.flow_id, "charge", worker="w1", money=True) == "not-durable"
        world.messages.chains[:] = [chain for chain in world.messages.chains if chain[0] != sleeper.flow_id]
    world.advance(world.engine.lease + 1)
    world.settle()
    done = world.record(sleeper)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(sleeper)
    own = made_by(world, sleeper)
    assert len(own) == 1, f"the sleeper never charged: it names {named(world, sleeper)}, the other flow's charge"
    assert named(world, sleeper) == own[0]["operationId"]


# -- a call an earlier release sent with no hold --------------------------------------------------------


def test_a_refund_an_earlier_release_sent_is_adopted_only_by_a_persons_decision(world: FlowWorld) -> None:
    """Its call was sent before any hold existed: a snapshot taken now would hide its refund (sent again: a
    second refund once the gateway forgot the key), and what the order holds says nothing of whose each
    refund is. It takes the order, adopts nothing on its own and stops for a person, naming its candidate;
    the person's retry (the candidate is the flow's) ends it succeeded with it, and nothing is sent again."""
    payment = sale(world, "k3601p7", 3000)
    flow = refund(world, payment, "g1")
    world.sim.admin.set_faults(mode="commit_then_fail", operation="refund_operation", count=1)
    run(world, flow, {FlowState.RETRYING})
    as_an_earlier_release_wrote_it(world, flow, "k3601p7")
    forget_keys(world)
    world.settle()
    (own,) = made_by(world, flow)
    stopped = world.record(flow)
    assert stopped is not None and stopped.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert stopped.error is not None and stopped.error["reason"] == "legacy", stopped.error
    assert stopped.error["operationIds"] == [own["operationId"]]
    assert world.engine.actions(stopped) == ["retry", "cancel"]
    world.engine.retry(flow.flow_id, by="person")
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    assert named(world, flow) == own["operationId"]
    assert len(made_by(world, flow)) == 1


def test_a_persons_cancel_of_an_earlier_releases_refund_takes_none_of_what_it_saw(world: FlowWorld) -> None:
    """The candidate is the back office's (the person looked): their cancel takes none of those listed as
    the flow's own; its call never acted, so once it can no longer arrive the flow ends cancelled, and the
    order is let go (a legacy hold is released after the cancel's read, not left to a take-over)."""
    payment = sale(world, "k3601p8", 3000)
    flow = refund(world, payment, "g2")
    world.sim.admin.set_faults(mode="error", status=500, operation="refund_operation", count=1)
    run(world, flow, {FlowState.RETRYING})
    assert made_by(world, flow) == []
    as_an_earlier_release_wrote_it(world, flow, "k3601p8")
    body = {"amount": "1000", "currency": "EUR"}
    outside = world.engine.gateway().call(Catalogue.refund_operation, payment, request=body, idempotency_key="back-office-2")
    world.settle()
    stopped = world.record(flow)
    assert stopped is not None and stopped.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert stopped.error is not None and stopped.error["operationIds"] == [outside.operationId], stopped.error
    assert world.engine.redis.hget(world.engine.keys.target("k3601p8"), "flow") is not None, "held while unresolved"
    world.engine.cancel(flow.flow_id, "the back office refunded it", by="person")
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.CANCELLED, world.describe(flow)
    assert made_by(world, flow) == []
    assert world.engine.redis.exists(world.engine.keys.target("k3601p8")) == 0, "let go after the cancel's read"


def test_a_legacy_holder_taking_its_own_target_again_lets_no_other_call_in_meanwhile(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 6 ("two flows acting on one target never leave a lost answer ambiguous"). A refund whose
    call an earlier release sent holds the order under a hold with no snapshot; its call acts late, and its
    resends are answered 500. Each later try wrote a new token and then took the key over from its own old
    one: in between another refund's check of the key's token answered ``free``, it took the order and
    called while the first's call was unresolved, and adopted the first's late refund. Now a try takes its
    own hold again under the same token: the second waits. The first's read-back then finds its late refund
    and a person decides (it is the flow's); then the second refunds: two flows, two refunds."""
    payment = sale(world, "k3601p2", 3000)
    first = refund(world, payment, "rv2")
    world.sim.admin.set_faults(mode="late", operation="refund_operation", count=1)
    while mine(world, first):
        world.deliver(mine(world, first)[0])
    as_an_earlier_release_wrote_it(world, first, "k3601p2")
    world.sim.admin.set_faults(mode="error", status=500, operation="refund_operation", count=1)
    world.advance(world.engine.retry_policy.cap_seconds + 1, release=False)
    world.engine.dispatch_due()
    while mine(world, first):
        world.deliver(mine(world, first)[0])
    held = world.record(first)
    assert held is not None and held.state is FlowState.RETRYING and held.reconcile, world.describe(first)
    legacy = hold_of(held, "post")
    assert legacy is not None and legacy.get("legacy"), legacy
    second = refund(world, payment, "rv3")
    world.messages.chains[:] = [chain for chain in world.messages.chains if chain[0] != second.flow_id]
    targets = world.engine.targets
    original = targets._take_key
    armed = [True]

    def take_key(name: str, flow_id: str, token: str, expected: str = "") -> list[str]:
        if armed[0] and flow_id == first.flow_id:  # the first takes its target again: the second runs now
            armed[0] = False
            world.sim.admin.set_faults(mode="error", status=500, operation="refund_operation", count=1)
            world.engine.run_step(second.flow_id, "post", worker="w2", money=True)
        return original(name, flow_id, token, expected)

    monkeypatch.setattr(targets, "_take_key", take_key)
    world.advance(world.engine.retry_policy.cap_seconds + 1, release=False)
    world.engine.dispatch_due()
    while mine(world, first):
        world.deliver(mine(world, first)[0])
    assert not armed[0], "the first's try took its target again"
    assert hold_of(world.record(first), "post")["token"] == legacy["token"]  # type: ignore[arg-type,index]
    waiting = world.record(second)
    assert waiting is not None and (waiting.error or {}).get("type") == "TargetHeld", world.describe(second)
    world.sim.admin.release_late()  # the first's refund acts now
    world.settle(stalled=waiting_on_a_person(world))
    stopped = world.record(first)
    assert stopped is not None and stopped.state is FlowState.NEEDS_ATTENTION, world.describe(first)
    assert (stopped.error or {}).get("type") == "ServerError", stopped.error  # its attempts used up on the 500s
    world.engine.retry(first.flow_id, by="person")  # it reads back first: its late refund is there now
    world.settle(stalled=waiting_on_a_person(world))
    stopped = world.record(first)
    assert stopped is not None and stopped.state is FlowState.NEEDS_ATTENTION, world.describe(first)
    assert world.record(second).state is FlowState.RETRYING, "the second still waits"  # type: ignore[union-attr]
    assert stopped.error is not None and stopped.error.get("operationIds") == [made_by(world, first)[0]["operationId"]], (
        stopped.error,
        world.engine.history(first.flow_id)[-6:],
    )
    world.engine.retry(first.flow_id, by="person")  # the person found it is the first's
    world.settle()
    refunds = [op for op in world.sim.admin.operations(operation_type="REFUND") if op["orderId"] == "k3601p2"]
    names = {flow.flow_id: named(world, flow) for flow in (first, second)}
    states = [world.record(flow).state for flow in (first, second)]  # type: ignore[union-attr]
    assert states == [FlowState.SUCCEEDED, FlowState.SUCCEEDED], [world.describe(flow) for flow in (first, second)]
    assert len(set(names.values())) == 2, f"two flows name one refund {names}; the gateway made {len(refunds)}"
    for flow in (first, second):
        assert named(world, flow) == made_by(world, flow)[0]["operationId"]


def test_a_delayed_charge_an_earlier_release_put_to_sleep_before_it_read_the_reservation_charges_checked(
    world: FlowWorld,
) -> None:
    """A record with no ``original`` output (the release that slept first): the charge step reads the
    reservation, checks it and charges the original operation the input names."""
    original = reservation(world, "k3601r3", 20000)
    run_at = (datetime.fromtimestamp(world.clock.now(), UTC) + timedelta(hours=1)).isoformat()
    data = {"reservationId": "k3601r3", "originalOperationId": original, "amount": 5000, "currency": "EUR", "runAt": run_at}
    flow = world.start_flow("delay_charge", data, key="h1")
    run(world, flow, {FlowState.SLEEPING})
    world.engine.redis.hdel(world.engine.keys.flow(flow.flow_id), "out:original")
    world.advance(3601.0)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, world.describe(flow)
    (own,) = made_by(world, flow)
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == own["operationId"]
