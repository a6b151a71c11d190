"""The money invariants the whole-flow model checks, after every move and once settled.

From the project's design (docs/durability.md, "Money in flight" and "Money reported always shows"):

0. (the acceptance of waiting flows) A flow is kept while its customer can still pay: no payment reaches
   the gateway on the order of a flow whose record expired (its notification would be refused, 401,
   and the money found in no flow), however far the clock moved (days, months past the retention).
1. Money at the gateway (a payment, a refund, a capture, a cancel of a capture, a reservation charge) shows
   in the one flow it belongs to (``model_kinds.owner_of``): once settled, that flow is ``succeeded``
   naming it, or ``needs_attention`` naming it (or, when a step could not tell, a person's retry names it).
2. No flow ends ``failed`` or ``cancelled`` while its money is at the gateway: for a flow whose money only
   its own calls make, after *every* move (only a read of the gateway ends such a flow); for one whose
   customer pays on a page, once settled (the gateway's notification may come after the flow ended).
   A payment closed by an operator's refund counts as accounted.
3. A flow's outcome names an operation the gateway holds, never an invented one.
4. One flow, one movement of money by its own calls (a customer who paid two pages of one flow paid once
   per order), and one charge per schedule occurrence, ever.
5. Every merchant event matches a recorded transition, and every transition the merchant must see has
   its event: per flow and end state, as many events as moves, at the same times.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from durapay.workflows.engine.states import STOPPED, FlowState
from durapay.workflows.schedules import order_parts
from tests.workflows.model_kinds import OWN_CALLS, ModelFlow

if TYPE_CHECKING:
    from tests.workflows.flow_model import FlowWorld

LIVE = {FlowState.READY, FlowState.RETRYING, FlowState.WAITING, FlowState.SLEEPING, FlowState.RUNNING}
TOLD = (FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION)


def check_always(world: FlowWorld) -> None:
    """Invariants 2 (own calls) and 4 after every move; every started flow kept (until its retention);
    every unfinished flow on the due set."""
    charges = world.charges_by_flow()
    for flow in world.flows:
        made = charges.get(flow.flow_id, [])
        orders = [op["orderId"] for op in made]
        if flow.kind in OWN_CALLS:
            assert len(made) <= 1, f"flow {flow.flow_id} moved money {len(made)} times: {made}; {world.describe(flow)}"
        else:
            assert len(set(orders)) == len(orders), f"flow {flow.flow_id} charged twice on one order: {made}"
        if flow.expired:
            assert len(made) == flow.charges_at_expiry, f"an expired flow charged: {made}"
            continue
        record = world.record(flow)
        assert record is not None, f"acknowledged flow {flow.flow_id} lost"
        flow.orders.update(record.orders)
        if record.customer_url:
            world.shown.add(record.order_id)  # the merchant reads it and hands it to the customer
            _learn_page(flow, record.kind, record.order_id, record.outputs.get("create") or {})
        if record.state in LIVE:
            score = world.engine.redis.zscore(world.engine.keys.due_of(flow.flow_id), flow.flow_id)
            assert score is not None, f"unfinished flow without a due entry: {world.describe(flow)}"
        if flow.kind in OWN_CALLS and record.state in {FlowState.FAILED, FlowState.CANCELLED}:
            for op in made:
                assert _refunded(record.outcome, op), (
                    f"{op['operationType']} {op['operationId']} {op['operationResult']} at the gateway while the flow "
                    f"says {record.state}: {world.describe(flow)}"
                )
    occurrences: dict[str, list[str]] = {}
    for op in world.money():
        found = order_parts(str(op["orderId"]))  # (schedule, occurrence, attempt) of a schedule's charge
        if found and not op.get("parentOperationId"):
            occurrences.setdefault(f"{found[0]}#{found[1]}", []).append(op["orderId"])
    for occurrence, orders in occurrences.items():
        assert len(orders) <= 1, f"schedule occurrence {occurrence} charged {len(orders)} times: {orders}"


def check_settled(world: FlowWorld) -> list[ModelFlow]:
    """Invariants 1 to 5 once settled. Returns the flows in ``needs_attention`` that do not name their money
    (a step could not tell: a person's retry reads the gateway first), for ``FlowWorld.check_retried``."""
    check_always(world)
    check_events(world)
    charges = world.charges_by_flow()
    held = {op["operationId"] for op in world.sim.admin.operations()}
    unnamed = []
    for flow in world.flows:
        if flow.expired:
            continue
        record = world.record(flow)
        assert record is not None
        assert record.state in STOPPED, world.describe(flow)
        made = charges.get(flow.flow_id, [])
        outcome = record.outcome or {}
        if record.state is FlowState.SUCCEEDED:
            assert made, f"succeeded without money at the gateway: {world.describe(flow)}"
            named = (outcome.get("operation") or {}).get("operationId")
            assert named in held, f"the outcome names operation {named}, which the gateway does not hold: {world.describe(flow)}"
        for op in made:
            if record.state is FlowState.SUCCEEDED:
                assert op["operationId"] in (outcome.get("operationIds") or []), f"{op} not the flow's: {world.describe(flow)}"
            elif not _refunded(outcome, op):
                assert record.state is FlowState.NEEDS_ATTENTION, (
                    f"{op['operationType']} {op['operationId']} at the gateway while the flow says {record.state}: "
                    f"{world.describe(flow)}"
                )
                if op["operationId"] not in json.dumps(record.error or {}):
                    unnamed.append(flow)
    return unnamed


def check_events(world: FlowWorld) -> None:
    """Invariant 5: per flow, the events of its ends and the moves into them, one for one, at one time."""
    told: dict[str, list[dict[str, Any]]] = {}
    for event, _ in world.engine.events():
        if event.body.get("flow"):
            told.setdefault(str(event.body["flow"]), []).append(event.body)
    for flow in world.flows:
        if flow.expired or world.record(flow) is None:
            continue
        history = world.engine.history(flow.flow_id)
        events = told.get(flow.flow_id, [])
        kinds = Counter(event["type"] for event in events)
        assert kinds["flow.created"] == 1, (events, history)
        for state in TOLD:
            moves = sorted(float(entry["t"]) for entry in history if entry["to"] == state.value)
            said = sorted(float(event["time"]) for event in events if event["type"] == f"flow.{state.value}")
            # (an event's time passes through Lua's JSON, 14 significant digits: within a millisecond)
            same = len(moves) == len(said) and all(abs(a - b) < 0.002 for a, b in zip(moves, said, strict=True))
            assert same, f"flow {flow.flow_id}: moves to {state} at {moves}, events at {said}: {history}"
        late = [entry for entry in history if entry["to"] == "needs_attention" and "late payment:" in entry["what"]]
        assert kinds["payment.late"] == len(late), f"flow {flow.flow_id}: {kinds['payment.late']} payment.late, {late}"


def _learn_page(flow: ModelFlow, kind: str, order_id: str, created: dict[str, Any]) -> None:
    """What the customer holds of a page the merchant showed them (they keep it, whatever the flow does)."""
    ref = {"hpp": order_id, "paybylink": (created.get("paymentLink") or {}).get("linkId"), "build": created.get("sessionId")}
    if ref.get(kind) and order_id not in flow.pages:
        flow.pages[order_id] = (kind, str(ref[kind]))


def _refunded(outcome: dict[str, Any] | None, op: dict[str, Any]) -> bool:
    """A payment an operator closed with a refund flow (``Engine.refund_late_payment``)."""
    refund = (outcome or {}).get("refund") or {}
    return bool(refund) and refund.get("operationId") == op["operationId"]
