"""The four categories of a reconciliation: each operation of the window matched to its flow, and each
flow that ended in the window matched to the operations it names (docs/operations.md, Reconciliation).

* ``money_without_flow``: a payment, refund or capture the gateway made that no flow claims: no flow
  recorded its operation id, and the flow holding its order (if any) did not make a refund or capture
  there (a payment on an order is that order's flow's; a post-operation on it, ``money.post_operation``,
  only the flow that made it: an operator's capture or refund at the gateway is no flow's);
* ``flow_without_money``: a ``succeeded`` flow naming an operation the gateway does not have, or has with
  another amount or currency, or shows as refused;
* ``money_not_shown``: money of a flow that the flow does not show (``money.shown``): a payment of a flow
  that ``failed`` or was ``cancelled``, a second payment of one flow;
* ``in_flight``: listed, not errors: operations still ``PENDING``, operations of flows still going, and
  those a ``needs_attention`` flow already names (a person has them), a post-operation a flow of durapay
  may have made (its call's answer unread: ``unsettled``). Each is read again by id by the next runs
  until it is judged (``run.Reconciler``: the carried operations), so that nothing in flight on the day
  its window is read escapes every later report.

A flow is matched to an operation by the operation id it recorded (``Keys.operation``, written with
the step that recorded it) first, then by the order id (``workflows.orders``: every order a flow made,
derived ``<orderId>-2``... included). A succeeded flow whose named operation is missing from the window
is read by id (it may lie just outside it) before it is called missing. When a flow names an operation
the gateway lacks and holds another payment of it, that payment is named in the same finding ("the
gateway holds ... instead"), not reported a second time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from durapay.workflows.reconciliation import money
from durapay.workflows.reconciliation.window import GetCall
from durapay.workflows.states import STOPPED, FlowState
from durapay.workflows.store import FlowRecord

MONEY_WITHOUT_FLOW = "money_without_flow"
FLOW_WITHOUT_MONEY = "flow_without_money"
MONEY_NOT_SHOWN = "money_not_shown"
IN_FLIGHT = "in_flight"
#: The categories in the report's order; all but the last are mismatches.
CATEGORIES = (MONEY_WITHOUT_FLOW, FLOW_WITHOUT_MONEY, MONEY_NOT_SHOWN, IN_FLIGHT)
MISMATCHES = CATEGORIES[:3]

#: The operation fields a finding repeats (no card data).
OPERATION_FIELDS = (
    "operationId",
    "orderId",
    "operationType",
    "operationResult",
    "operationAmount",
    "operationCurrency",
    "operationTime",
    "channel",
)


def brief(op: Mapping[str, Any]) -> dict[str, Any]:
    return {name: op.get(name) for name in OPERATION_FIELDS if op.get(name) is not None}


@dataclass(frozen=True)
class Finding:
    """One line of a report: its category, one sentence, and the flow and the operation it is about."""

    category: str
    what: str
    flow: str | None = None
    kind: str | None = None
    state: str | None = None
    #: The gateway's operation (``brief``), or None when the gateway has none to show.
    operation: dict[str, Any] | None = None
    #: The operation id the flow names (``flow_without_money``).
    named: str | None = None

    @property
    def key(self) -> str:
        """The same mismatch found again has the same key (one event, one mark)."""
        operation = (self.operation or {}).get("operationId") or ""
        return f"{self.category}:{self.flow or ''}:{operation}:{self.named or ''}"

    @property
    def order_id(self) -> str:
        return str((self.operation or {}).get("orderId") or "")

    def wire(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Finding:
        operation = data.get("operation")
        return cls(
            category=str(data["category"]),
            what=str(data.get("what") or ""),
            flow=data.get("flow"),
            kind=data.get("kind"),
            state=data.get("state"),
            operation=dict(operation) if isinstance(operation, Mapping) else None,
            named=data.get("named"),
        )


#: The operations of one order as the gateway lists them (``GET /orders/{orderId}``), as JSON.
OrderCall = Callable[[str], list[dict[str, Any]]]
#: The flows of durapay that may have made a post-operation and not read it back (money in flight, a
#: call of ``money.POST_CALLS``), by the operation id their input acts on and by the orders they hold.
Makers = Callable[[], Mapping[str, list[FlowRecord]]]


@dataclass
class Owners:
    """Who holds what, as the engine's lookups say: flows by operation id and by order id, and the records."""

    by_operation: dict[str, str] = field(default_factory=dict)
    by_order: dict[str, str] = field(default_factory=dict)
    records: dict[str, FlowRecord] = field(default_factory=dict)


@dataclass
class Lookups:
    """What the judge may read besides the window: one operation by id, one order's operations, and the
    flows with a post-operation in flight (each read at most once, only when a finding needs it)."""

    operation: GetCall
    order: OrderCall
    makers: Makers
    #: The orders read so far, by id.
    read_orders: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _makers: Mapping[str, list[FlowRecord]] | None = None

    def order_operations(self, order_id: str) -> list[dict[str, Any]]:
        if order_id not in self.read_orders:
            self.read_orders[order_id] = self.order(order_id) if order_id else []
        return self.read_orders[order_id]

    def maker(self, op: Mapping[str, Any], acted_on: Iterable[str]) -> FlowRecord | None:
        """A flow of durapay whose post-operation in flight may be ``op``: it acts on one of ``acted_on``
        (operation ids of ``op``'s order) or holds ``op``'s order, and its call makes ``op``'s type."""
        if self._makers is None:
            self._makers = self.makers()
        keys = [*acted_on, str(op.get("orderId") or "")]
        for key in keys:
            for record in self._makers.get(key, []):
                if money.says_in_flight(record, op) or record.state not in STOPPED:
                    return record
        return None


def _label(record: FlowRecord) -> str:
    return f"{record.kind} flow {record.id} ({record.state.value})"


def judge(
    operations: Mapping[str, Mapping[str, Any]],
    owners: Owners,
    ended: Iterable[FlowRecord],
    lookups: Lookups,
) -> list[Finding]:
    """The findings of a window: ``operations`` (by id) read from the gateway, ``owners`` looked up for
    them, ``ended`` the flows that succeeded in the window; ``lookups`` reads what else a finding needs."""
    findings: list[Finding] = []
    unshown: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    judged: dict[str, FlowRecord] = {record.id: record for record in ended if record.state is FlowState.SUCCEEDED}
    of_order: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for op in operations.values():
        of_order[str(op.get("orderId") or "")].append(op)
    for operation_id, op in sorted(operations.items(), key=lambda item: str(item[1].get("operationTime") or "")):
        pending, moved = money.in_flight(op), money.is_money(op)
        if not (pending or moved):
            continue
        flow_id = owners.by_operation.get(operation_id)
        by_order = flow_id is None
        if flow_id is None:
            flow_id = owners.by_order.get(str(op.get("orderId") or ""))
        record = owners.records.get(flow_id) if flow_id else None
        if pending:
            findings.append(_in_flight(op, record, "still PENDING at the gateway"))
        elif record is None:
            gone = f"; its order's flow {flow_id} is gone (past its retention)" if flow_id else ""
            findings.append(Finding(MONEY_WITHOUT_FLOW, f"{_money_word(op)} that no flow claims{gone}", operation=brief(op)))
        elif by_order and money.post_operation(op, _order_operations(op, record, of_order, lookups)):
            findings.append(_post_operation(op, record, of_order, lookups))
        elif record.state not in STOPPED:
            findings.append(_in_flight(op, record, f"its flow is still {record.state.value} at step {record.step}"))
        else:
            if record.state is FlowState.SUCCEEDED:
                judged.setdefault(record.id, record)
            how = money.shown(record, op)
            if how == "attention":
                findings.append(_in_flight(op, record, "its flow needs attention naming it: a person has it"))
            elif how is None:
                unshown[record.id].append(op)
    for record in judged.values():
        findings.extend(_named(record, operations, lookups.operation, unshown[record.id]))
    for flow_id, ops in unshown.items():
        record = owners.records[flow_id]
        for op in ops:
            findings.append(
                Finding(
                    MONEY_NOT_SHOWN,
                    f"{_money_word(op)} of {_label(record)} that the flow does not show{_why(record)}",
                    flow=record.id,
                    kind=record.kind,
                    state=record.state.value,
                    operation=brief(op),
                )
            )
    return findings


def _order_operations(
    op: Mapping[str, Any],
    record: FlowRecord,
    by_order: Mapping[str, list[Mapping[str, Any]]],
    lookups: Lookups,
) -> list[Mapping[str, Any]]:
    """What is known of ``op``'s order: the window's operations on it and what its flow recorded; for a
    ``CAPTURE`` not told apart by those (its authorization older than the window), the gateway's order."""
    order_id = str(op.get("orderId") or "")
    known = [*by_order.get(order_id, []), *_recorded(record)]
    if money.op_type(op) == "CAPTURE" and not money.post_operation(op, known):
        known += lookups.order_operations(order_id)
    return known


def _recorded(record: FlowRecord) -> list[Mapping[str, Any]]:
    operation = (record.outcome or {}).get("operation")
    return [operation] if isinstance(operation, Mapping) else []


def _post_operation(
    op: Mapping[str, Any], record: FlowRecord, by_order: Mapping[str, list[Mapping[str, Any]]], lookups: Lookups
) -> Finding:
    """A post-operation on the order of ``record`` that no flow recorded: in flight when a flow of
    durapay may have made it (its answer unread), else money no flow of durapay made."""
    order_id = str(op.get("orderId") or "")
    acted_on = {str(other.get("operationId")) for other in [*by_order.get(order_id, []), *_recorded(record)]}
    acted_on |= {str(other.get("operationId")) for other in lookups.read_orders.get(order_id, [])}
    acted_on |= set(money.named_operations(record))
    acted_on.discard(str(op.get("operationId")))
    maker = lookups.maker(op, sorted(acted_on))
    if maker is not None:
        how = "a person has it" if maker.state is FlowState.NEEDS_ATTENTION else f"it is still {maker.state.value}"
        return _in_flight(op, maker, f"durapay's {maker.kind} flow may have made it, its answer unread: {how}")
    return Finding(
        MONEY_WITHOUT_FLOW,
        f"{_money_word(op)} on the order of {_label(record)} that no flow of durapay made",
        flow=record.id,
        kind=record.kind,
        state=record.state.value,
        operation=brief(op),
    )


def _named(
    record: FlowRecord, operations: Mapping[str, Mapping[str, Any]], fetch: GetCall, unshown: list[Mapping[str, Any]]
) -> list[Finding]:
    """``flow_without_money`` of one succeeded flow; a payment of it the flow does not show, taken as what
    the gateway holds instead of a missing one, is removed from ``unshown``."""
    found: list[Finding] = []
    recorded = (record.outcome or {}).get("operation")
    recorded = recorded if isinstance(recorded, Mapping) else {}
    for named in money.named_operations(record):
        held = operations.get(named)
        if held is None:
            held = fetch(named)
        if held is None:
            instead = next((op for op in unshown if money.is_payment(op)), None)
            what = f"{_label(record)} names operation {named}, which the gateway does not have"
            if instead is not None:
                unshown.remove(instead)
                what += f"; the gateway holds {_money_word(instead)} of it instead"
            found.append(
                Finding(
                    FLOW_WITHOUT_MONEY,
                    what,
                    flow=record.id,
                    kind=record.kind,
                    state=record.state.value,
                    operation=brief(instead) if instead is not None else None,
                    named=named,
                )
            )
            continue
        wrong = money.differs(recorded if str(recorded.get("operationId")) == named else {}, held)
        if wrong:
            found.append(
                Finding(
                    FLOW_WITHOUT_MONEY,
                    f"{_label(record)} names operation {named}: {wrong}",
                    flow=record.id,
                    kind=record.kind,
                    state=record.state.value,
                    operation=brief(held),
                    named=named,
                )
            )
    return found


def _in_flight(op: Mapping[str, Any], record: FlowRecord | None, why: str) -> Finding:
    if record is None:
        return Finding(IN_FLIGHT, f"{_money_word(op)}: {why}", operation=brief(op))
    return Finding(
        IN_FLIGHT,
        f"{_money_word(op)} of {_label(record)}: {why}",
        flow=record.id,
        kind=record.kind,
        state=record.state.value,
        operation=brief(op),
    )


def _money_word(op: Mapping[str, Any]) -> str:
    amount = f"{op.get('operationAmount', '?')} {op.get('operationCurrency', '')}".strip()
    return (
        f"{money.op_type(op) or 'operation'} {op.get('operationId')} ({money.op_result(op)}, {amount}, order {op.get('orderId')})"
    )


def _why(record: FlowRecord) -> str:
    if record.state in (FlowState.FAILED, FlowState.CANCELLED):
        return f": it ended {record.state.value}"
    if record.state is FlowState.SUCCEEDED:
        return ": a second payment beside the one its outcome names"
    return f": it needs attention for another reason ({(record.error or {}).get('type', '?')})"
