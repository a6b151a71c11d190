"""Review 36: attempts to make money misstated on shared gateway targets (and around them).

Each test fails on main (40c8c44) and names the invariant it breaks (docs/durability.md, DESIGN.md's
"Money invariants"). Run: ``.venv/bin/python -m pytest -n 0 tests/workflows/test_review36.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.durability import NotDurable
from durapay.workflows.engine import Claim
from durapay.workflows.states import FlowState
from tests.workflows.aof_tail import AofTail, FloorDurability
from tests.workflows.flow_model import FlowWorld
from tests.workflows.test_shared_targets import STOPPED, charge, made_by, mine, named, reservation, run, sale, to_step


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=3601)
    yield built
    built.close()


def claim_only(world: FlowWorld, flow_id: str, step: str) -> None:
    """A worker claims the step (durably: a money claim) and dies before it runs a line of it: before the
    hold on its target is written, so before any call could be sent."""
    claim = world.engine.protocol.claim(flow_id, step, worker="doomed", money=True)
    assert isinstance(claim, Claim), claim


# -- finding 1: a flow of this release that never took its hold is read back by resemblance ---------------


def test_a_refund_stopped_before_its_hold_never_adopts_a_refund_it_did_not_make(world: FlowWorld) -> None:
    """Invariant 6 (and 3). The refund's first read (the payment's operation, to name its target) is
    answered 401: the flow stops for a person before any hold or call. Meanwhile the merchant's back office
    refunds the same amount. The person's retry sets ``reconcile``, so ``Targets._hold`` takes the flow for
    one "whose call an earlier release sent" (``legacy``: no hold on the record, may_have_sent, in flight),
    takes no snapshot, and the read-back judges by resemblance (type, amount, time): it adopts the back
    office's refund as its own. The flow ends succeeded naming an operation its call never made, and the
    refund it was started for is never sent."""
    payment = sale(world, "k3601p1", 3000)
    flow = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="rv1")
    world.sim.admin.set_faults(mode="error", status=401, operation="get_operation", count=1)
    stopped = run(world, flow, STOPPED)
    assert stopped.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert made_by(world, flow) == [], "nothing was sent"
    # The back office refunds 1000 of the same payment (outside durapay, its own key).
    world.engine.gateway().call(
        Catalogue.refund_operation, payment, request={"amount": "1000", "currency": "EUR"}, idempotency_key="back-office-1"
    )
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
    """Invariant 6 (money misstated: a charge reported taken that never was). A delayed charge of 3000 sleeps
    40 days; meanwhile another delayed charge of 3000 on the same reservation charges and ends, and its
    record (with its ``op:`` lookup) expires after the retention (30 days). The sleeper wakes; its worker
    claims the charge step (durably) and dies before writing its hold. The next try, after the lease, is
    uncertain with no hold on the record: ``legacy``, no snapshot; the read-back takes a DELAY_CHARGE of
    3000 not in the list read at the flow's start, made after it started and recorded by no live flow: the
    other flow's charge. The sleeper ends succeeded naming it; the guest is charged once for two charges."""
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
        claim_only(world, sleeper.flow_id, "charge")
    else:  # the claim's WAITAOF times out (DURAPAY_ENGINE__SYNC_TIMEOUT): "runs after the lease, reading first"

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


def test_a_legacy_holder_taking_its_own_target_again_lets_no_other_call_in_meanwhile(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 6 ("two flows acting on one target never leave a lost answer ambiguous"). A refund read back
    as an earlier release's (``legacy``, here after the 401 of the first test) holds the payment's order under
    a hold with no snapshot; its call's answer is lost (the request acts late). Each later try of a legacy hold
    writes a *new* token (``Targets._hold``: the first branch needs ``before``) and then takes the key over
    from its own old token. Between that intent and the take, the holder's record no longer names the key's
    token, so another flow's ``check`` of it answers ``free``: a second refund takes the order over and calls
    while the first's call is still unresolved. The first's late refund lands after the second's snapshot,
    the second's own call never acted, and its read-back adopts the first's refund: two flows, one refund."""
    payment = sale(world, "k3601p2", 3000)
    first = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="rv2")
    world.sim.admin.set_faults(mode="error", status=401, operation="get_operation", count=1)
    assert run(world, first, STOPPED).state is FlowState.NEEDS_ATTENTION
    world.sim.admin.clear_faults()
    world.engine.retry(first.flow_id)
    world.sim.admin.set_faults(mode="late", operation="refund_operation", count=1)
    while mine(world, first):
        world.deliver(mine(world, first)[0])
    held = world.record(first)
    assert held is not None and held.state is FlowState.RETRYING and held.reconcile, world.describe(first)
    second = world.start_flow("refund", {"operationId": payment, "amount": 1000, "currency": "EUR"}, key="rv3")
    world.messages.chains[:] = [chain for chain in world.messages.chains if chain[0] != second.flow_id]
    targets = world.engine.targets
    original = targets._take_key
    armed = [True]

    def take_key(name: str, flow_id: str, token: str, expected: str = "") -> list[str]:
        if armed[0] and flow_id == first.flow_id:  # the first's new intent is written; its take not yet
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
    world.sim.admin.release_late()  # the first's refund acts now, after the second's snapshot
    world.settle()
    refunds = [op for op in world.sim.admin.operations(operation_type="REFUND") if op["orderId"] == "k3601p2"]
    names = {flow.flow_id: named(world, flow) for flow in (first, second)}
    states = [world.record(flow).state for flow in (first, second)]  # type: ignore[union-attr]
    assert states == [FlowState.SUCCEEDED, FlowState.SUCCEEDED], [world.describe(flow) for flow in (first, second)]
    assert len(set(names.values())) == 2, f"two flows name one refund {names}; the gateway made {len(refunds)}"


def test_a_full_refund_pays_one_gateway_read_for_its_target_as_documented(world: FlowWorld) -> None:
    """Cost (docs/durability.md, "One money call at a time per target", Cost: "a few Redis round trips and one
    gateway read"). A full refund's happy path reads the payment's operation (``PAYMENT_ORDER.of``:
    ``_payment_order``, to name its order) and then the order (the snapshot) before it sends its refund: two
    gateway reads on every refund, capture and cancel of a capture, where the refund alone needed none."""
    payment = sale(world, "k3601p3", 3000)
    flow = world.start_flow("refund", {"operationId": payment}, key="rv4")
    world.settle()
    assert world.record(flow).state is FlowState.SUCCEEDED  # type: ignore[union-attr]
    (post,) = [
        entry["call"]
        for entry in world.engine.history(flow.flow_id)
        if (entry.get("call") or {}).get("op", "").endswith("refund_operation")
    ]
    reads = post["op"].split(" then ")[:-1]
    assert len(reads) <= 1, f"the refund's step made {reads} before its call"


def test_a_delayed_charge_accepted_when_it_starts_is_judged_at_the_same_moment_when_it_charges(world: FlowWorld) -> None:
    """Invariant 7 (a check holds when the money moves: the same check, of the same moment). A delayed charge
    at 00:30 (+02:00) on the reservation's check-out day: the start's check (``_reservation_checked``, ``when
    = runAt``) reads the check-out day in runAt's own offset and accepts it; the charge step wakes at that very
    moment and checks ``datetime.fromtimestamp(now, UTC)``, the day before in UTC, and refuses it (``runAt``
    "before the check-out date"): the guest is not charged although nothing changed (reservations.py,
    ``_Charge.execute`` against ``_reservation_checked``)."""
    now = datetime.fromtimestamp(world.clock.now(), UTC)
    check_out = (now + timedelta(days=3)).date()
    reservation(world, "k3601r5", 20000, checkOutDate=check_out.isoformat())
    run_at = datetime(check_out.year, check_out.month, check_out.day, 0, 30, tzinfo=timezone(timedelta(hours=2)))
    flow = world.start_flow("delay_charge", charge("k3601r5", 5000, runAt=run_at.isoformat()), key="dv5")
    asleep = run(world, flow, STOPPED | {FlowState.SLEEPING})
    assert asleep.state is FlowState.SLEEPING, world.describe(flow)
    world.advance(run_at.timestamp() - world.clock.now() + 1)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED, (done.error if done else None, world.describe(flow))
