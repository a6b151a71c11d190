"""Every flow against the gateway's ledger: lost, charged twice, money not reflected, stuck.

The ledger is the simulator's record of every operation. For each acknowledged start:

* **lost**: the flow is gone from Redis although its start was acknowledged;
* **charged twice**: more than one successful payment on the flow's orders (for a refund or a capture:
  more than one on the payment it names; for a schedule: more than one per occurrence);
* **charged but not succeeded**: money at the gateway that the flow does not show: not ``succeeded``
  with that operation as its outcome, and not ``needs_attention`` naming it (or, when its reads could not
  tell, saying that its call of that operation may have taken effect: money in flight, ``unsettled``). A flow ``cancelled`` or
  ``failed`` with money of its own at the gateway (on any of its orders: a flow retried after a failure
  pays on ``<orderId>-2``...) is one, whoever cancelled it; unless the operator closed it with
  ``refund_late_payment`` and the gateway shows that payment refunded. A cancel that ended
  ``succeeded`` because the money had moved is no finding: a cancel cannot undo money taken;
* **succeeded unpaid**: ``succeeded`` with no money at the gateway behind it;
* **stuck**: unfinished at the end (or, for an unfinished flow, without a due entry);
* **events lost / made up**: an event exists if and only if its transition happened (merchant events,
  ``workflows/engine/events.py``): per flow, one ``flow.created``, and as many ``flow.succeeded``,
  ``flow.failed`` and ``flow.cancelled`` events as its history has transitions to that state.

Whether a flow shows a charge is the rule the production reconciliation uses (``durapay reconcile``:
``workflows.reconciliation.money``), asked here too, so that the shipped proof and the daily check
cannot drift apart. What this check adds: it knows every start (a lost flow), and it asks the ledger
that an operator's refund of a late payment is at the gateway.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from durapay.service.chaos.workload import Planned
from durapay.workflows.engine import STOPPED, Cursor, Engine, EventFeed, FlowRecord, FlowState, NotFound
from durapay.workflows.reconciliation import money
from durapay.workflows.schedules import order_parts

PAYMENT_TYPES = frozenset({"AUTHORIZATION", "CAPTURE", "CARD_VERIFICATION"})
SUCCESS = money.TAKEN
RESERVATION_TYPES = {"no_show": "NOSHOW", "incremental": "INCREMENTAL", "delay_charge": "DELAY_CHARGE"}
#: Per post-operation flow kind: the operation types it makes, and their results that move money.
POST_TYPES = {
    "refund": (frozenset({"REFUND", "VOID"}), frozenset({"REFUNDED", "VOIDED"})),
    "capture": (frozenset({"CAPTURE"}), frozenset({"EXECUTED"})),
}


@dataclass
class Findings:
    """What went wrong, one line per flow (or occurrence) and class."""

    lost: list[str] = field(default_factory=list)
    charged_twice: list[str] = field(default_factory=list)
    not_reflected: list[str] = field(default_factory=list)
    unpaid: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    events_lost: list[str] = field(default_factory=list)
    events_made_up: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        wrong = self.lost or self.charged_twice or self.not_reflected or self.unpaid or self.stuck
        return not (wrong or self.events_lost or self.events_made_up)


class Ledger:
    """The simulator's operations, indexed by order and by the payment they act on."""

    def __init__(self, operations: list[dict[str, Any]]) -> None:
        self.by_order: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.by_parent: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for op in operations:
            self.by_order[str(op.get("orderId") or "")].append(op)
            if op.get("parentOperationId"):
                self.by_parent[str(op["parentOperationId"])].append(op)

    def charges(self, orders: list[str]) -> list[dict[str, Any]]:
        """Successful payments (not post-operations) on any of ``orders``."""
        return [
            op
            for order in orders
            for op in self.by_order.get(order, [])
            if op.get("operationType") in PAYMENT_TYPES
            and op.get("operationResult") in SUCCESS
            and not op.get("parentOperationId")
        ]

    def reservation_charges(self, order: str, kind: str) -> list[dict[str, Any]]:
        """Successful charges of ``kind`` (no-show, incremental, delayed) on a reservation's order."""
        wanted = RESERVATION_TYPES[kind]
        return [
            op
            for op in self.by_order.get(order, [])
            if op.get("operationType") == wanted and op.get("operationResult") in SUCCESS
        ]

    def refunded(self, charges: list[dict[str, Any]]) -> set[str]:
        """The payments among ``charges`` the gateway shows refunded or voided."""
        return {str(op["operationId"]) for op in charges if self.post_operations(str(op["operationId"]), "refund")}

    def post_operations(self, parent: str, kind: str) -> list[dict[str, Any]]:
        types, results = POST_TYPES[kind]
        return [
            op
            for op in self.by_parent.get(parent, [])
            if op.get("operationType") in types and op.get("operationResult") in results
        ]


def operator_refund(record: FlowRecord, operation_id: str) -> str | None:
    """The refund flow by which an operator closed the late payment ``operation_id`` of this flow
    (``refund_late_payment``: the flow cancelled, its outcome naming the refund), or None."""
    if record.state is FlowState.NEEDS_ATTENTION:
        return None
    refund = (record.outcome or {}).get("refund")
    if isinstance(refund, dict) and str(refund.get("operationId") or "") == operation_id:
        return str(refund.get("flow") or "")
    return None


def check_money(
    record: FlowRecord,
    charges: list[dict[str, Any]],
    label: str,
    findings: Findings,
    *,
    refunded: Collection[str] = (),
) -> None:
    """The money rule for one flow: at most one charge, and a charge shows in the flow. ``refunded``: the
    payments among ``charges`` that the gateway shows refunded (or voided)."""
    if len(charges) > 1:
        findings.charged_twice.append(f"{label}: {len(charges)} charges {[op['operationId'] for op in charges]}")
    for op in charges:
        operation_id = str(op["operationId"])
        if money.shown(record, op) in ("outcome", "attention"):
            continue
        if record.state is FlowState.SUCCEEDED and not money.named_operations(record):
            continue  # an outcome naming no operation is not judged (as workflows/engine/lua/money.lua)
        if record.state is FlowState.SUCCEEDED and len(charges) > 1:
            continue  # the twice-charged line already says it
        refund = operator_refund(record, operation_id)
        if refund is not None and operation_id in refunded:
            continue  # a late payment the operator refunded: accounted
        shown = f"flow {record.state.value} {record.summary()}"
        if refund is not None:
            shown += f"; the operator's refund (flow {refund}) is not at the gateway"
        findings.not_reflected.append(f"{label}: {operation_id} at the gateway, {shown}")
    if not charges and record.state is FlowState.SUCCEEDED and record.kind not in ("card_verification", "reservation_setup"):
        findings.unpaid.append(f"{label}: succeeded, nothing at the gateway")


def reconcile(engine: Engine, ledger: Ledger, started: list[Planned], findings: Findings) -> None:
    for planned in started:
        label = f"{planned.kind} {planned.flow_id} ({planned.order_id or planned.parent_operation})"
        try:
            record = engine.get(planned.flow_id)
        except NotFound:
            orders = [planned.order_id, *(f"{planned.order_id}-{n}" for n in range(2, 5))] if planned.order_id else []
            money = ledger.charges(orders)
            findings.lost.append(label + (f", charged {len(money)}x at the gateway" if money else ""))
            continue
        findings.states[record.state.value] = findings.states.get(record.state.value, 0) + 1
        if record.state not in STOPPED:
            findings.stuck.append(f"{label}: {record.state.value} at {record.step}")
        if planned.kind in POST_TYPES:
            check_money(record, ledger.post_operations(planned.parent_operation, planned.kind), label, findings)
        elif planned.kind in RESERVATION_TYPES:
            check_money(record, ledger.reservation_charges(planned.order_id, planned.kind), label, findings)
        elif planned.order_id:
            charges = ledger.charges(record.orders or [planned.order_id])
            check_money(record, charges, label, findings, refunded=ledger.refunded(charges))


def reconcile_schedule(engine: Engine, ledger: Ledger, schedule_id: str, findings: Findings) -> dict[str, Any]:
    """Each occurrence of the schedule charged at most once, and each charge shown by its flow."""
    occurrences: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for order, ops in ledger.by_order.items():
        parts = order_parts(order)  # (schedule, occurrence, attempt) of a schedule's charge
        if parts is not None and parts[0] == schedule_id:
            occurrences[str(parts[1])].extend(op for op in ledger.charges([order]) if op in ops)
    for occurrence, charges in sorted(occurrences.items()):
        label = f"schedule {schedule_id} occurrence {occurrence}"
        if len(charges) > 1:
            findings.charged_twice.append(f"{label}: {len(charges)} charges")
        for op in charges:
            flow_id = engine.flow_for_order(str(op["orderId"]))
            if flow_id is None:
                findings.not_reflected.append(f"{label}: {op['operationId']} charged, no flow for order {op['orderId']}")
                continue
            record = engine.get(flow_id)
            check_money(record, [op], f"{label} flow {flow_id}", findings)
    return {"occurrences_charged": sum(1 for charges in occurrences.values() if charges)}


#: The flow events checked against each flow's history: its creation and its ends.
CHECKED_EVENTS = ("flow.created", "flow.succeeded", "flow.failed", "flow.cancelled")


def check_events(engine: Engine, started: list[Planned], findings: Findings) -> None:
    """Every event of the run read through the feed, counted per flow and type, against the flow's
    history: a transition without its event is an event lost, an event without its transition one made
    up. (A flow gone from Redis is counted as lost already, with its events.)"""
    feed = EventFeed(engine.redis, engine.keys)
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    cursor = Cursor()
    while True:
        events, following = feed.read(cursor, limit=1000)
        for event in events:
            if event.type in CHECKED_EVENTS:
                seen[str(event.body.get("flow"))][event.type] += 1
        if not events and following == cursor:
            break
        cursor = following
    for planned in started:
        try:
            history = engine.history(planned.flow_id)
        except NotFound:
            continue
        expected: Counter[str] = Counter({"flow.created": 1})
        for entry in history:
            if entry.get("to") in {"succeeded", "failed", "cancelled"} and entry.get("from") != entry.get("to"):
                expected[f"flow.{entry['to']}"] += 1
        got = seen.get(planned.flow_id, Counter())
        for kind in CHECKED_EVENTS:
            label = f"{planned.kind} {planned.flow_id}: {kind}"
            if got[kind] < expected[kind]:
                findings.events_lost.append(f"{label}: {expected[kind]} transitions, {got[kind]} events")
            elif got[kind] > expected[kind]:
                findings.events_made_up.append(f"{label}: {got[kind]} events, {expected[kind]} transitions")
