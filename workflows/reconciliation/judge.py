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
the step that recorded it) first, then by the order id (``workflows.engine.orders``: every order a flow made,
derived ``<orderId>-2``... included). A succeeded flow whose named operation is missing from the window
is read by id (it may lie just outside it) before it is called missing. When a flow names an operation
the gateway lacks and holds another payment of it, that payment is named in the same finding ("the
gateway holds ... instead"), not reported a second time; a flow checked before the pages reached that
payment (its end an hour after it) has its orders read for it, and is not judged again when they do.

The window comes page by page, newest first (``run.Reconciler``), and is never held whole: each page's
operations are judged with the flows they name and let go. What a page cannot settle is held, small,
until a later page or a read by id settles it (``Judge``): the flows that succeeded in the window (from
their state index, just ahead of the pages) until their payment is met, and a met flow's payments it
does not show until its named operations are all accounted for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durapay.workflows.engine import STOPPED, FlowRecord, FlowState
from durapay.workflows.reconciliation import money
from durapay.workflows.reconciliation.findings import (
    FLOW_WITHOUT_MONEY,
    IN_FLIGHT,
    MONEY_NOT_SHOWN,
    MONEY_WITHOUT_FLOW,
    Finding,
    Lookups,
    Owners,
    brief,
)


def _label(record: FlowRecord) -> str:
    return f"{record.kind} flow {record.id} ({record.state.value})"


@dataclass
class Named:
    """A succeeded flow whose named operations are still to be found: what their check needs, not the
    flow's record (a few hundred bytes against about 12 KB)."""

    flow: str
    kind: str
    state: str
    #: When it ended (its state index's time) or, for one met through an operation, that page's time.
    end: float
    #: The operation ids its outcome names that the window has not shown yet.
    names: list[str]
    #: The operation its outcome reports (``brief``), to compare amount and currency.
    recorded: dict[str, Any]
    #: Payments of it the flow does not show, met so far (one may be what the gateway holds instead).
    unshown: list[dict[str, Any]] = field(default_factory=list)
    #: Its gateway orders, read for the payment held instead of a missing one that no page showed yet.
    orders: list[str] = field(default_factory=list)
    #: Every operation id its outcome names (``names`` shrinks as the pages show them).
    every: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, record: FlowRecord, end: float) -> Named:
        recorded = _recorded(record)
        names = money.named_operations(record)
        return cls(
            record.id,
            record.kind,
            record.state.value,
            end,
            list(names),
            brief(recorded[0]) if recorded else {},
            orders=list(record.orders or ([record.order_id] if record.order_id else [])),
            every=names,
        )

    @property
    def label(self) -> str:
        return f"{self.kind} flow {self.flow} ({self.state})"


#: Succeeded flows held for their check (met and not, together), at most; past it the newest-ended
#: are checked at once (by id).
MAX_PENDING = 50_000
#: Flows already checked remembered, at most (the oldest forgotten first): an older page that shows a
#: payment of one adds nothing to its verdict (``Judge.judged``).
MAX_JUDGED = 50_000
#: A flow's payment is looked for this long before the flow's end: one not met by then is read by id
#: (a payment long before its flow's end, a notification lost and read back at a deadline, costs a call).
HORIZON_SECONDS = 3600.0


class Judge:
    """The findings of a window given page by page, newest first (module docstring), holding only what
    is still open: the flows that succeeded in the window and were not met yet (``waiting``: their id and
    end), the succeeded flows met whose named operations the pages have not all shown (``pending``, each
    a :class:`Named`) with the payments of theirs they do not show. Each is checked by id once the pages
    are :data:`HORIZON_SECONDS` older than its end (together at most :data:`MAX_PENDING`)."""

    def __init__(self, lookups: Lookups) -> None:
        self.lookups = lookups
        self.pending: dict[str, Named] = {}
        self.waiting: dict[str, float] = {}
        #: The succeeded flows checked, each with the payments its verdict named as held instead: a flow
        #: checked by id before the pages reached its payment is not judged again when they do (it was
        #: reported twice: once missing, once "holds ... instead"). At most :data:`MAX_JUDGED`.
        self.judged: dict[str, set[str]] = {}

    def ended(self, flow_id: str, end: float) -> list[Finding]:
        """A flow that succeeded in the window, at ``end``: its named operations are checked once its
        operations are met, or read by id; the findings of flows checked early (:data:`MAX_PENDING`)."""
        if flow_id not in self.pending:
            self.waiting.setdefault(flow_id, end)
        return self._bounded()

    def expect(self, record: FlowRecord, end: float, *, seen: str = "") -> list[Finding]:
        """Check a succeeded flow met through an operation (its named operations but ``seen``) as the
        pages come."""
        named = self.pending.get(record.id)
        if named is None:
            named = Named.of(record, self.waiting.pop(record.id, end))
            self.pending[record.id] = named
        if seen in named.names:
            named.names.remove(seen)
        if not (named.names or named.unshown):
            del self.pending[record.id]  # all it names is shown: nothing left to hold
        return self._bounded()

    def page(self, operations: Mapping[str, Mapping[str, Any]], owners: Owners, moment: float) -> list[Finding]:
        """The findings of one page (``operations`` by id, ``owners`` looked up for them, ``moment`` its
        oldest time); the succeeded flows met are checked as the pages go on (:meth:`resolve`)."""
        findings: list[Finding] = []
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
            elif by_order and money.post_operation(op, _order_operations(op, record, of_order, self.lookups)):
                findings.append(_post_operation(op, record, of_order, self.lookups))
            elif record.state not in STOPPED:
                findings.append(_in_flight(op, record, f"its flow is still {record.state.value} at step {record.step}"))
            else:
                findings += self._stopped(record, op, moment)
        return findings

    def _stopped(self, record: FlowRecord, op: Mapping[str, Any], moment: float) -> list[Finding]:
        how = money.shown(record, op)
        if how == "attention":
            return [_in_flight(op, record, "its flow needs attention naming it: a person has it")]
        if record.state is not FlowState.SUCCEEDED:
            return [] if how else [_unshown(record.id, record.kind, record.state.value, _why(record), op)]
        found: list[Finding] = []
        operation_id = str(op.get("operationId") or "")
        if record.id in self.judged:  # checked already (its named operations read by id, its orders read)
            if how == "outcome" or operation_id in self.judged[record.id]:
                return []
            return [_unshown(record.id, record.kind, record.state.value, _why(record), op)]
        if how == "outcome":
            wrong = money.differs(_recorded_as(record, operation_id), op)
            if wrong:
                found.append(_wrong(record.id, record.kind, record.state.value, _label(record), operation_id, wrong, op))
        found += self.expect(record, moment, seen=operation_id if how == "outcome" else "")
        if how is None:
            named = self.pending.get(record.id)
            if named is None:  # every operation it names is shown: the payment is a second one
                found.append(_unshown(record.id, record.kind, record.state.value, _why(record), op))
            else:
                named.unshown.append(brief(op))
        return found

    def resolve(self, below: float | None = None) -> list[Finding]:
        """Check by id the named operations of the flows held that ended more than
        :data:`HORIZON_SECONDS` after ``below`` (the pages' oldest time so far; None: every one)."""
        late = None if below is None else below + HORIZON_SECONDS
        met = [named for named in self.pending.values() if late is None or named.end > late]
        unmet = [flow_id for flow_id, end in self.waiting.items() if late is None or end > late]
        return self._check(met, unmet)

    def _bounded(self) -> list[Finding]:
        over = len(self.pending) + len(self.waiting) - MAX_PENDING
        if over <= 0:
            return []
        held = sorted(
            [(named.end, named.flow, True) for named in self.pending.values()]
            + [(end, flow_id, False) for flow_id, end in self.waiting.items()],
            reverse=True,
        )[: over + MAX_PENDING // 10]  # a tenth more: not a sort for every flow past the bound
        return self._check([self.pending[flow] for _, flow, met in held if met], [flow for _, flow, met in held if not met])

    def _check(self, met: Iterable[Named], unmet: list[str]) -> list[Finding]:
        found: list[Finding] = []
        for named in list(met):
            del self.pending[named.flow]
            found += self._verdict(named)
        for flow_id in unmet:
            del self.waiting[flow_id]
        for start in range(0, len(unmet), 1000):
            for record in self.lookups.flows(unmet[start : start + 1000]):
                if record.state is FlowState.SUCCEEDED:  # not moved since
                    found += self._verdict(Named.of(record, 0.0))
        return found

    def _verdict(self, named: Named) -> list[Finding]:
        """The findings of one flow's check (:func:`_named`), remembered in :attr:`judged`."""
        found = _named(named, self.lookups)
        if len(self.judged) >= MAX_JUDGED:
            del self.judged[next(iter(self.judged))]  # the oldest checked (dicts keep insertion order)
        self.judged[named.flow] = {
            str(finding.operation["operationId"])
            for finding in found
            if finding.category == FLOW_WITHOUT_MONEY and finding.operation and finding.named
        }
        return found


def _recorded_as(record: FlowRecord, operation_id: str) -> Mapping[str, Any]:
    recorded = _recorded(record)
    return recorded[0] if recorded and str(recorded[0].get("operationId")) == operation_id else {}


def _unshown(flow: str, kind: str, state: str, why: str, op: Mapping[str, Any]) -> Finding:
    return Finding(
        MONEY_NOT_SHOWN,
        f"{_money_word(op)} of {kind} flow {flow} ({state}) that the flow does not show{why}",
        flow=flow,
        kind=kind,
        state=state,
        operation=brief(op),
    )


def _wrong(flow: str, kind: str, state: str, label: str, named: str, wrong: str, held: Mapping[str, Any]) -> Finding:
    return Finding(
        FLOW_WITHOUT_MONEY,
        f"{label} names operation {named}: {wrong}",
        flow=flow,
        kind=kind,
        state=state,
        operation=brief(held),
        named=named,
    )


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


def _named(named: Named, lookups: Lookups) -> list[Finding]:
    """``flow_without_money`` of one succeeded flow's named operations the window did not show, each
    read by id; a payment of it the flow does not show, taken as what the gateway holds instead of a
    missing one, is named in that finding, and the others are ``money_not_shown``. With no such payment
    met yet (the flow checked before the pages reached its payment: they go newest first), its orders
    are read for one, so that the verdict is the one the whole window gives."""
    found: list[Finding] = []
    unshown = list(named.unshown)
    for name in named.names:
        held = lookups.operation(name)
        if held is None:
            instead = next((op for op in unshown if money.is_payment(op)), None)
            if instead is not None:
                unshown.remove(instead)
            else:
                instead = _held_instead(named, lookups, {str(f.operation["operationId"]) for f in found if f.operation})
            what = f"{named.label} names operation {name}, which the gateway does not have"
            if instead is not None:
                what += f"; the gateway holds {_money_word(instead)} of it instead"
            found.append(
                Finding(
                    FLOW_WITHOUT_MONEY,
                    what,
                    flow=named.flow,
                    kind=named.kind,
                    state=named.state,
                    operation=brief(instead) if instead is not None else None,
                    named=name,
                )
            )
            continue
        recorded = named.recorded if str(named.recorded.get("operationId")) == name else {}
        wrong = money.differs(recorded, held)
        if wrong:
            found.append(_wrong(named.flow, named.kind, named.state, named.label, name, wrong, held))
    why = ": a second payment beside the one its outcome names"
    found += [_unshown(named.flow, named.kind, named.state, why, op) for op in unshown]
    return found


def _held_instead(named: Named, lookups: Lookups, taken: set[str]) -> dict[str, Any] | None:
    """A payment on the flow's orders that it does not name (nor a finding of its already names), as the
    gateway lists them (``Lookups.order_operations``): what it holds instead of a missing operation."""
    for order_id in named.orders:
        for op in lookups.order_operations(order_id):
            operation_id = str(op.get("operationId") or "")
            if money.is_payment(op) and operation_id not in named.every and operation_id not in taken:
                return brief(op)
    return None


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
