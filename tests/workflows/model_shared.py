"""The shared targets the whole-flow model's second machine acts on, and the money invariants over them.

``test_flow_model_shared.py`` starts two and three flows on one gateway target: partial refunds (and a
cancel of the capture) of one sale, no-show, incremental and delayed charges of one reservation. Which
flow an operation at the gateway belongs to is known here the way the gateway knows it, by the
``Idempotency-Key`` that made it (the step's key, ``<flowId>.<step>``, with a generation after an
operator's restart), never by what the operation looks like: that is what the invariants check durapay
does too (docs/durability.md, "One money call at a time per target").

* **6, identity** (after every move): no flow names an operation another flow's key made; no operation
  is named by two flows; no flow's key made two operations; no flow is ``failed`` or ``cancelled`` while
  an operation its key made moved money. Once settled: every operation a flow's key made is named by that
  flow (``succeeded`` naming it, or ``needs_attention`` naming it; a person's retry then names it).
* **7, a check holds when the money moves** (after every move): the charges a reservation took (or may
  still: PENDING) stay within its amount, at most one of them a no-show; no charge made after the
  reservation was cancelled; no delayed charge made on a day before the check-out date in force when it
  was made; the refunds of the sale within its amount.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from durapay.gateway import Catalogue, parse_gateway_time
from durapay.workflows.engine.keys import step_idempotency_key
from durapay.workflows.engine.states import STOPPED, FlowState
from tests.workflows.model_kinds import APPROVE, MOVED, ModelFlow, card

if TYPE_CHECKING:
    from tests.workflows.flow_model import FlowWorld

#: The money step of each kind the shared model starts, and the operation types its call makes.
STEP = {"refund": "post", "cancel_capture": "post", "no_show": "charge", "incremental": "charge", "delay_charge": "charge"}
MAKES = {
    "refund": frozenset({"REFUND", "VOID"}),
    "cancel_capture": frozenset({"CANCEL"}),
    "no_show": frozenset({"NOSHOW"}),
    "incremental": frozenset({"INCREMENTAL"}),
    "delay_charge": frozenset({"DELAY_CHARGE"}),
}
#: Charge results that count against a reservation's amount (taken, or may still be).
TAKEN = frozenset({"AUTHORIZED", "EXECUTED", "PENDING"})
SALE = 3000
RESERVATION = 2000
#: The kinds (with their amounts) that act on the sale, and on the reservation.
ON_SALE = [("refund", 1000), ("refund", 1000), ("refund", 1500), ("cancel_capture", 0)]
ON_RESERVATION = [("incremental", 500), ("incremental", 1000), ("no_show", 700), ("delay_charge", 800), ("delay_charge", 1200)]
#: At most this many flows per target (a third flow on a target is where a first-come rule breaks).
PER_TARGET = 3


@dataclass
class SharedTargets:
    """One sale and one reservation of an example, and what happened to the reservation meanwhile."""

    sale_order: str
    sale: str
    reservation: str
    cancelled_at: float | None = None
    #: (from when, the check-out date then), in order: the reservation's check-out as it moved.
    check_outs: list[tuple[float, str]] = field(default_factory=list)
    flows: list[ModelFlow] = field(default_factory=list)

    @classmethod
    def make(cls, world: FlowWorld) -> SharedTargets:
        """A sale of :data:`SALE` and a reservation of :data:`RESERVATION` paid on its link, both outside any
        flow, the reservation's check-out today (a delayed charge in an hour is after the stay)."""
        client = world.engine.gateway()
        sale_order = f"k{world.example}sale"
        order = {"orderId": sale_order, "amount": str(SALE), "currency": "EUR"}
        sale = client.call(Catalogue.create_moto_order, request={"order": order, "card": card(APPROVE)}).operation.operationId
        reservation = f"k{world.example}res"
        today = datetime.fromtimestamp(world.clock.now(), UTC).date().isoformat()
        body = {"reservationId": reservation, "amount": str(RESERVATION), "currency": "EUR", "checkOutDate": today}
        client.call(Catalogue.create_reservation, request={"reservation": body})
        link = client.call(Catalogue.create_reservation_paybylink, reservation, request={})
        world.sim.admin.complete_link(str(link.paymentLink.linkId), pan=APPROVE)
        return cls(sale_order, str(sale), reservation, check_outs=[(0.0, today)])

    def start(self, world: FlowWorld, which: int) -> ModelFlow | None:
        """Start a flow of the pool ``which`` draws, unless its target has :data:`PER_TARGET` flows already."""
        on_sale = which % 2 == 0
        pool = ON_SALE if on_sale else ON_RESERVATION
        kind, amount = pool[(which // 2) % len(pool)]
        target = self.sale_order if on_sale else self.reservation
        if len([flow for flow in self.flows if flow.charge_order == target]) >= PER_TARGET:
            return None
        if kind == "cancel_capture" and any(flow.kind == kind for flow in self.flows):
            return None
        data: dict[str, Any]
        if kind == "cancel_capture":
            data = {"operationId": self.sale}
        elif on_sale:
            data = {"operationId": self.sale, "amount": amount, "currency": "EUR"}
        else:
            data = {"reservationId": self.reservation, "amount": amount, "currency": "EUR"}
            if kind == "delay_charge":
                data["runAt"] = (datetime.fromtimestamp(world.clock.now(), UTC) + timedelta(hours=1)).isoformat()
        key = f"{world.example}-{len(self.flows)}"
        record = world.engine.start(kind, data, key=key)
        flow = ModelFlow(record.id, kind, key, charge_order=target)  # charge_order: the target, for this model
        world.flows.append(flow)
        self.flows.append(flow)
        return flow

    def change_reservation(self, world: FlowWorld, change: str) -> None:
        """The hotel moves the check-out three days on, or cancels the reservation (at the gateway). A charge
        request still on its way acts first: the check holds when the call is sent, not when a request durapay
        gave up on arrives."""
        world.sim.admin.release_late()
        state = world.sim.simulator.state
        with state.lock:
            reservation = state.reservations[self.reservation]
            if change == "cancel" and self.cancelled_at is None:
                reservation["status"] = "CANCELED"
                self.cancelled_at = world.sim.admin.now().timestamp()
            elif change == "check-out" and len(self.check_outs) == 1:
                later = (datetime.fromtimestamp(world.clock.now(), UTC) + timedelta(days=3)).date().isoformat()
                reservation["checkOutDate"] = later
                self.check_outs.append((world.sim.admin.now().timestamp(), later))

    # -- whose operation is whose ------------------------------------------------------------------

    def keys_of(self, world: FlowWorld, flow: ModelFlow) -> set[str]:
        """Every Idempotency-Key the flow's money step may have sent (a generation per operator restart)."""
        record = world.record(flow)
        generations = range((record.generation if record else 0) + 2)
        step = STEP[flow.kind]
        return {step_idempotency_key(flow.flow_id, f"{step}~{n}" if n else step) for n in generations}

    def made(self, world: FlowWorld) -> dict[str, list[dict[str, Any]]]:
        """The operations on the two targets, by the flow whose key made them (each has one)."""
        keys = {key: flow.flow_id for flow in self.flows for key in self.keys_of(world, flow)}
        cancels = [flow.flow_id for flow in self.flows if flow.kind == "cancel_capture"]
        found: dict[str, list[dict[str, Any]]] = {}
        for op in world.sim.admin.operations():
            owner = keys.get(str(op.get("idempotencyKey") or ""))
            if owner is None and op["operationType"] == "CANCEL" and cancels:
                owner = cancels[0]  # a cancel takes no key; the model starts one at most
            if owner is not None:
                found.setdefault(owner, []).append(op)
            elif op["orderId"] in {self.sale_order, self.reservation} and op["operationType"] not in {"CAPTURE", "AUTHORIZATION"}:
                raise AssertionError(f"an operation on a shared target no flow's key made: {op}")
        return found


def claims(record: Any) -> set[str]:
    """The operations a flow's record takes as its own: what its steps' outputs and its outcome name, and the
    operation an error names (never the candidates an ambiguous read-back lists, which it does not take)."""
    found: set[str] = set()

    def note(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("operationId"):
                found.add(str(value["operationId"]))
            inner = value.get("operation")
            if isinstance(inner, dict) and inner.get("operationId"):
                found.add(str(inner["operationId"]))

    for output in record.outputs.values():
        note(output)
    note(record.outcome or {})
    note(record.error or {})
    return found


def check_always(world: FlowWorld, targets: SharedTargets) -> None:
    """Invariants 6 and 7 over the flows of the two targets, after every move."""
    made = targets.made(world)
    ops = {str(op["operationId"]): owner for owner, list_ in made.items() for op in list_}
    claimed: dict[str, str] = {}
    for flow in targets.flows:
        record = world.record(flow)
        assert record is not None, f"acknowledged flow {flow.flow_id} lost"
        own = made.get(flow.flow_id, [])
        assert len({op.get("idempotencyKey") for op in own}) == len(own), f"one key made two operations: {own}"
        for operation_id in claims(record) & set(ops):
            assert ops[operation_id] == flow.flow_id, (
                f"flow {flow.flow_id} names {operation_id}, made by flow {ops[operation_id]}'s call: {world.describe(flow)}"
            )
            assert claimed.setdefault(operation_id, flow.flow_id) == flow.flow_id, f"{operation_id} named by two flows"
        if record.state in {FlowState.FAILED, FlowState.CANCELLED}:
            moved = [op for op in own if op["operationResult"] in MOVED]
            assert not moved, f"{moved} at the gateway while the flow says {record.state}: {world.describe(flow)}"
    check_bounds(world, targets)


def check_bounds(world: FlowWorld, targets: SharedTargets) -> None:
    """Invariant 7: what the gateway took on each target stays within what durapay checks."""
    charges = [
        op
        for op in world.sim.admin.operations(order_id=targets.reservation)
        if op["operationType"] in {"NOSHOW", "INCREMENTAL", "DELAY_CHARGE"} and op["operationResult"] in TAKEN
    ]
    assert sum(int(op["amount"]) for op in charges) <= RESERVATION, f"charges beyond the reservation's amount: {charges}"
    assert len([op for op in charges if op["operationType"] == "NOSHOW"]) <= 1, f"two no-shows: {charges}"
    for op in charges:
        made_at = parse_gateway_time(str(op["time"])).timestamp()
        if targets.cancelled_at is not None:
            assert made_at < targets.cancelled_at, f"a charge of the cancelled reservation: {op}"
        if op["operationType"] == "DELAY_CHARGE":
            in_force = [day for since, day in targets.check_outs if since <= made_at][-1]
            assert datetime.fromtimestamp(made_at, UTC).date().isoformat() >= in_force, (op, targets.check_outs)
    refunds = [
        op
        for op in world.sim.admin.operations(order_id=targets.sale_order)
        if op["operationType"] == "REFUND" and op["operationResult"] in MOVED
    ]
    assert sum(int(op["amount"]) for op in refunds) <= SALE, refunds


def held_for_people(world: FlowWorld, live: list[ModelFlow]) -> set[str]:
    """The flows stopped for a person that the live flows wait for (their target held: its money unresolved),
    or an empty set when some live flow waits for anything else."""
    holders = set()
    for flow in live:
        record = world.record(flow)
        error = (record.error if record is not None else None) or {}
        if record is None or record.state is not FlowState.RETRYING or error.get("type") != "TargetHeld":
            return set()
        holder = world.engine.store.get(str(error.get("holder")))
        if holder is None or holder.state is not FlowState.NEEDS_ATTENTION:
            return set()
        holders.add(holder.id)
    return holders


def settle(world: FlowWorld) -> None:
    """Settle the world; where flows can go on only once a person acts on the flow holding their target
    (stopped in ``needs_attention``, its money unresolved), a person retries it, the gateway answering
    again, and cancels it if it stops again (a cancel reads the gateway and ends it by what it shows), and
    the world settles on (bounded)."""
    live: list[ModelFlow] = []

    def stalled(flows: list[ModelFlow]) -> bool:
        live[:] = flows
        return bool(held_for_people(world, flows))

    for round_ in range(4):
        live.clear()
        world.settle(stalled=stalled)
        holders = held_for_people(world, live) if live else set()
        if not holders:
            return
        world.sim.admin.clear_faults()
        world.sim.admin.settle_pending()
        for holder in sorted(holders):
            if round_ == 0:
                world.engine.retry(holder)
            else:
                world.engine.cancel(holder, "a person stops it: the gateway refuses its call")
    raise AssertionError(f"flows still wait for people: {[world.describe(flow) for flow in world.live()]}")


def check_settled(world: FlowWorld, targets: SharedTargets) -> list[ModelFlow]:
    """Once settled: every flow stopped, every operation its key made named by it (the flows in
    ``needs_attention`` that do not name theirs are returned, for a person's retry)."""
    check_always(world, targets)
    made = targets.made(world)
    unnamed = []
    for flow in targets.flows:
        record = world.record(flow)
        assert record is not None and record.state in STOPPED, world.describe(flow)
        moved = [str(op["operationId"]) for op in made.get(flow.flow_id, []) if op["operationResult"] in MOVED]
        if record.state is FlowState.SUCCEEDED:
            outcome = (record.outcome or {}).get("operation") or {}
            if flow.kind == "cancel_capture":
                continue  # its call takes no key: known by the capture it cancels (cancelledOperationId)
            assert outcome.get("operationId") in moved, (
                f"succeeded naming {outcome}, its own call made {moved}: {world.describe(flow)}"
            )
        elif moved:
            assert record.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
            if not all(operation_id in json.dumps(record.error or {}) for operation_id in moved):
                unnamed.append(flow)
    return unnamed
