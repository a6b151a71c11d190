"""A person closes a late payment: money the gateway reports for a flow that does not account for it.

A ``LatePayment`` (``workflows/engine/lua/money.lua``) stops a flow in ``needs_attention`` with the payment kept
on its record, whatever it had been: failed or cancelled (the customer paid after all), succeeded with
another payment (a second one), or moved to a new order (the customer paid the page of an order the flow
left). The money stays shown until one of these closes it:

* **keep** (:meth:`LatePayments.keep`): the merchant keeps it. A flow that had succeeded stays its first
  payment's, the second listed beside it (``operationIds``, ``latePayments``); any other takes it as its
  outcome and succeeds. (``Engine.retry`` of a flow that had failed or been cancelled does the same
  through its waiting step.)
* **refund** (:meth:`LatePayments.refund`): a ``refund`` flow of it, started under a key per flow and
  operation (asking twice refunds once). The flow is closed only once that refund *succeeded*: cancelled
  naming it, or, beside a succeeded payment, back to ``succeeded`` listing it. Until then the flow stays
  in ``needs_attention``, and no keep or retry may take the payment being refunded; the refund flow's
  end closes it (:meth:`LatePayments.refund_ended`, called by the worker that ends it), and asking again
  closes it too (a worker lost in between).

Two rules hold for every close:

* **A close never ends a flow past money in flight.** A flow that still holds something its customer
  can pay on (``unsettled``, ``workflows.engine.inflight``: above all one that had moved to a new order, whose
  new link or page is still open) is not ended by a person: the close is asked as a cancel through
  ``transition.lua``, the one home of the rule, which makes the flow close what it holds and read the
  gateway first (:meth:`LatePayments._write`). The late payment stays shown meanwhile; once the flow has
  stopped again, asking again closes it.
* **The outcome is taken only on the gateway's word.** A payment becomes the flow's outcome (a keep, or
  an accept: ``Engine.retry``) only after a read of the gateway shows it still held
  (:meth:`LatePayments.held`): the kept notification says what the gateway said then, and the money may
  have gone back since (a refund flow of its own, the back office).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from durapay.gateway import FAILURE_RESULTS, FINAL_RESULTS, SUCCESS_RESULTS, Catalogue, GatewayError, Operation, OperationType
from durapay.workflows.engine import (
    TERMINAL,
    Change,
    FlowRecord,
    FlowState,
    MoneyTaken,
    OperatorError,
    compact_json,
    derived_id,
    inflight,
    late_payment,
    mask_text,
)
from durapay.workflows.flows._adopt import PAYMENT_TYPES

if TYPE_CHECKING:
    from durapay.workflows.engine import Engine

log = logging.getLogger("durapay.engine")

#: The start key of a late payment's refund flow: ``late-payment-refund:<flow id>:<operation id>``.
REFUND_KEY = "late-payment-refund:"
#: States in which a refund flow will not refund any more.
GAVE_UP = frozenset({FlowState.FAILED, FlowState.CANCELLED})
#: Operations that give a payment's money back (or part of it): a refund, a void of an authorization, a
#: cancel of a capture.
UNDOING = frozenset({OperationType.REFUND, OperationType.VOID, OperationType.CANCEL})


class LatePayments:
    """The operator actions on a ``LatePayment``. One per engine (``Engine.late``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def refund(self, flow_id: str, reason: str = "late payment refunded", *, by: str = "api") -> FlowRecord:
        """Refund the reported operation; the flow as it is once the refund flow is started (closed if it
        already succeeded, else still ``needs_attention`` until it does). A payment the gateway shows given
        back already (refunded or voided elsewhere, say in the gateway's back office) is closed as such,
        naming what the gateway shows, with no refund flow: a second refund would only be refused."""
        record, operation_id, _ = self.reported(flow_id)
        if "refund" not in self.engine.registry:
            raise OperatorError("this build has no refund flow kind")
        key = refund_key(flow_id, operation_id)
        ours = self.engine.store.get(derived_id("f", "refund", key))
        if ours is None or ours.state in GAVE_UP:
            # Given back all, and for good (no PENDING refund, no partial one), by someone else: close it so.
            given = self.undone(flow_id, operation_id)
            if given.whole and not given.doubt:
                return self._close_refunded(record, operation_id, {"undone": given.whole}, reason, by=by)
        # The refund's end closes this flow saying who asked, and why (a card number in the words masked).
        asked = {"by": by, "reason": mask_text(reason)}
        # Asked on the flow first, by its version: a keep or an accept of this payment read before (its
        # gateway read under way) is then refused when it writes, and one written first makes this fail.
        if not self.engine.store.mark(record, "refund_asked", {**asked, "operationId": operation_id}):
            raise OperatorError(f"flow {flow_id} changed meanwhile (another decision on it); look again")
        # On the flow's own terminal: the payment is that terminal's, and only its key may refund it.
        refund = self.engine.start(
            "refund", {"operationId": operation_id}, key, derived_key=True, note=asked, terminal=record.terminal
        )
        record = self.engine.get(flow_id)  # as marked (or as the refund's end closed it meanwhile)
        if refund.state is FlowState.SUCCEEDED and record.state is FlowState.NEEDS_ATTENTION:
            return self._close_refunded(record, operation_id, {"flow": refund.id}, reason, by=by)
        if refund.state in GAVE_UP:
            raise OperatorError(
                f"the refund of {operation_id} (flow {refund.id}) ended {refund.state}: retry that flow, or keep the payment"
            )
        return record

    def refund_ended(self, refund: FlowRecord) -> None:
        """A late payment's refund flow ended (the worker that ended it calls this): close the flow it was
        for, if it succeeded and that flow still shows the payment. Best effort: asking to refund again
        does the same."""
        flow_id, _, operation_id = refund.start_key.removeprefix(REFUND_KEY).rpartition(":")
        if refund.state is not FlowState.SUCCEEDED or not flow_id:
            return
        record = self.engine.store.get(flow_id)
        late = (record.error or {}) if record is not None else {}
        if record is None or record.state is not FlowState.NEEDS_ATTENTION or late.get("type") != "LatePayment":
            return
        if str((late.get("operation") or {}).get("operationId")) == operation_id:
            reason, asker = asked_for(refund)
            self._close_refunded(record, operation_id, {"flow": refund.id}, reason, by="refund", asker=asker)

    def keep(self, flow_id: str, *, by: str = "api") -> FlowRecord:
        """The merchant keeps the reported payment (see the module docstring)."""
        record, operation_id, ended_as = self.reported(flow_id)
        self.accepting(flow_id, operation_id)
        if ended_as == FlowState.SUCCEEDED.value:
            return self._close(record, operation_id, {"kept": True}, by=by)
        paid = dict((record.error or {}).get("operation") or {})
        outcome = {key: value for key, value in (record.outcome or {}).items() if key not in {"reason", "result", "refund"}}
        ids = [str(item) for item in outcome.get("operationIds") or []]
        outcome |= {
            "operation": paid,
            "result": "succeeded",
            "operationIds": [*ids, operation_id] if operation_id not in ids else ids,
        }
        outcome["latePayments"] = closed(record, operation_id, {"kept": True})
        fields = without_signals_of(record, operation_id)
        fields["outcome"] = compact_json(outcome)
        what = f"late payment {operation_id} kept: the flow takes it as its outcome (it had {ended_as})"
        return self._write(record, Change(FlowState.SUCCEEDED, what, fields), by=by)

    def reported(self, flow_id: str) -> tuple[FlowRecord, str, str]:
        """(the record, the reported operation, how the flow had ended) of a flow stopped for a late payment
        that no refund is under way for, or OperatorError."""
        record = self.engine.get(flow_id)
        error = record.error or {}
        operation = error.get("operation") if isinstance(error.get("operation"), dict) else {}
        operation_id = str((operation or {}).get("operationId") or "")
        if record.state is not FlowState.NEEDS_ATTENTION or error.get("type") != "LatePayment" or not operation_id:
            raise OperatorError(f"flow {flow_id} has no late payment to close (it is {record.state})")
        return record, operation_id, str(error.get("endedAs") or "")

    def under_way(self, record: FlowRecord) -> FlowRecord | None:
        """The refund flow of ``record``'s late payment, if the flow is a ``LatePayment`` being refunded."""
        late = late_payment(record)
        return None if late is None else self.refunding(record.id, str(late.get("operationId") or ""))

    def refunding(self, flow_id: str, operation_id: str) -> FlowRecord | None:
        """The refund flow of the flow's late payment, unless there is none or it gave up."""
        refund = self.engine.store.get(derived_id("f", "refund", refund_key(flow_id, operation_id)))
        return refund if refund is not None and refund.state not in GAVE_UP else None

    def accepting(self, flow_id: str, operation_id: str) -> None:
        """Refuse (OperatorError) to take the flow's late payment as its own (a keep, or an accept:
        ``Engine.retry``) while a refund of it is under way, or unless the gateway shows it still held."""
        if (refund := self.refunding(flow_id, operation_id)) is not None:
            raise OperatorError(f"flow {flow_id}: payment {operation_id} is being refunded by flow {refund.id} ({refund.state})")
        given = self.undone(flow_id, operation_id)
        if given.whole:
            raise OperatorError(
                f"flow {flow_id}: the gateway shows payment {operation_id} {given.whole}: it is no longer the merchant's "
                "money, so the flow cannot take it as its own; close it with refund-late-payment, which records it"
            )
        if given.doubt:
            raise OperatorError(
                f"flow {flow_id}: the gateway shows for payment {operation_id}: {given.doubt}; whether the money is still "
                "the merchant's is not clear: look at the order at the gateway, and ask again once it is settled"
            )

    def undone(self, flow_id: str, operation_id: str) -> GivenBack:
        """Read the gateway: the payment as it is now, and every operation of its order; what gives its money
        back ("" for nothing: it is still AUTHORIZED or EXECUTED and nothing on its order undoes it,
        :func:`undone_by`). The record's notification is the gateway's word *then*; only this read says
        whether the money is still the merchant's. OperatorError when the gateway cannot be read."""
        held = self.engine.store.get(flow_id)
        client = self.engine.gateway(held.terminal if held is not None else "default")  # the flow's own terminal's key
        try:
            payment = client.call(Catalogue.get_operation, operation_id)
            order = client.call(Catalogue.get_order, payment.orderId) if payment.orderId else None
        except GatewayError as failed:
            raise OperatorError(
                f"flow {flow_id}: payment {operation_id} could not be read at the gateway ({failed}); try again"
            ) from None
        return undone_by(payment, order.operations if order is not None else [])

    def _close_refunded(
        self, record: FlowRecord, operation_id: str, by_what: dict[str, str], reason: str, *, by: str, asker: str = ""
    ) -> FlowRecord:
        """Close a late payment given back: ``by_what`` is ``{"flow": <refund flow>}`` (durapay refunded it) or
        ``{"undone": <what the gateway shows>}`` (given back elsewhere); ``asker``: who asked for the refund,
        when another closes it (the refund flow's end)."""
        ended_as = str((record.error or {}).get("endedAs") or "")
        if ended_as == FlowState.SUCCEEDED.value:
            return self._close(record, operation_id, {"refund": by_what}, by=by)
        fields = without_signals_of(record, operation_id)
        late = closed(record, operation_id, {"refund": by_what})
        refunded = {**by_what, "operationId": operation_id}
        fields["outcome"] = compact_json({"reason": reason, "refund": refunded, "latePayments": late})
        how = f"by flow {by_what['flow']}" if "flow" in by_what else f"at the gateway already ({by_what['undone']})"
        what = f"late payment {operation_id} refunded {how}; cancelled{f' (asked by {asker})' if asker else ''}: {reason}"
        return self._write(record, Change(FlowState.CANCELLED, what, fields), by=by)

    def _close(self, record: FlowRecord, operation_id: str, how: dict[str, Any], *, by: str) -> FlowRecord:
        """A succeeded flow's second payment, closed: back to ``succeeded``, the outcome still the first
        payment's, the second shown beside it (so the money rule counts it as accounted)."""
        outcome = dict(record.outcome or {})
        ids = [str(item) for item in outcome.get("operationIds") or []]
        outcome["operationIds"] = [*ids, operation_id] if operation_id not in ids else ids
        outcome["latePayments"] = closed(record, operation_id, how)
        fields = without_signals_of(record, operation_id)
        fields["outcome"] = compact_json(outcome)
        refund = how.get("refund") or {}
        given_back = (
            f"refunded by flow {refund['flow']}" if "flow" in refund else f"given back at the gateway ({refund.get('undone')})"
        )
        what = f"second payment {operation_id} " + (given_back if refund else "kept")
        return self._write(record, Change(FlowState.SUCCEEDED, what + "; the flow stays its first payment's", fields), by=by)

    def _write(self, record: FlowRecord, change: Change, *, by: str) -> FlowRecord:
        """Write a close that ends the flow, unless money may still move for it at the gateway
        (``unsettled``: a link, page or form its customer can still pay on, say on the new order of a flow
        that had moved on). Such a flow is never ended by a person past it: the close becomes a cancel
        written through ``transition.lua`` (the one home of the rule), which makes the flow's step close
        what it holds and read the gateway now, and end as that read says. The late payment is left as it
        is (its error and notification), so it stays shown; asking again once the flow stopped closes it
        (the wait's read judges the flow's own order first when this payment is already kept on it)."""
        engine = self.engine
        unsettled = inflight.in_flight(record)
        if unsettled and change.state in TERMINAL:
            holds = unsettled.get("op") or "money in flight"
            what = f"{change.what}: not yet, the flow still holds {holds} at the gateway (closed and read first)"
            change = Change(FlowState.CANCELLED, what, {"outcome": compact_json({"reason": what})})
        try:
            written = engine.store.transition(record, change, now=engine.clock.now(), by=by)
        except MoneyTaken as taken:
            raise OperatorError(str(taken)) from None
        if written is None:
            raise OperatorError(f"flow {record.id} changed meanwhile; look again")
        engine.store.sync(record.id, f"late payment of flow {record.id} closed")
        if written.state is FlowState.READY:
            engine.protocol.send_from(written, written.step)  # the read the cancel asked for, now
        return written


def closed(record: FlowRecord, operation_id: str, how: dict[str, Any]) -> list[dict[str, Any]]:
    """The outcome's ``latePayments`` once ``operation_id`` is closed ``how``: every late payment a person
    ever closed on this flow, so that none is news again (``money.lua`` reads them)."""
    earlier = [dict(item) for item in (record.outcome or {}).get("latePayments") or [] if isinstance(item, dict)]
    return [*(item for item in earlier if str(item.get("operationId")) != operation_id), {"operationId": operation_id, **how}]


class GivenBack(NamedTuple):
    """What the gateway shows of a payment's money going back: ``whole`` describes undoing operations the
    gateway says are done that give all of it back ("" if none do); ``doubt`` what leaves it open (a
    PENDING refund that may still fail, a partial one, one on an order of several payments that names
    none of them)."""

    whole: str
    doubt: str


def undone_by(payment: Operation, operations: list[Operation]) -> GivenBack:
    """What gives ``payment``'s money back, as the gateway shows it. Its own result no longer AUTHORIZED or
    EXECUTED (voided, cancelled) gives it all back. Else the refunds, voids and cancels of it on its order
    count, and only they: one that names its payment (``cancelledOperationId``, ``parentOperationId``)
    counts for that payment; one that names none counts for it only when it is the order's only payment
    (docs/gateway.md: the gateway names no parent of a refund), and is a doubt on an order of several.
    Only final ones that did not fail add up, and only their sum reaching the payment's amount is ``whole``."""
    if payment.operationResult not in SUCCESS_RESULTS:
        return GivenBack(f"{payment.operationResult}", "")
    paid = {op.operationId for op in operations if op.operationType in PAYMENT_TYPES and op.operationResult in SUCCESS_RESULTS}
    alone = paid <= {payment.operationId}
    done: list[Operation] = []
    doubts: list[str] = []
    for operation in operations:
        if operation.operationId == payment.operationId or operation.operationType not in UNDOING:
            continue
        if operation.operationResult in FAILURE_RESULTS:
            continue
        named = operation.cancelledOperationId or operation.wire().get("parentOperationId")
        what = f"{operation.operationResult} by {operation.operationType} {operation.operationId}"
        if named is not None and str(named) != payment.operationId:
            continue
        if named is None and not alone:
            doubts.append(f"{what}, which names none of the order's payments")
        elif operation.operationResult not in FINAL_RESULTS:
            doubts.append(f"{what}, not final")
        else:
            done.append(operation)
    given = sum(int(op.operationAmount or 0) for op in done)
    whole = payment.operationAmount is None or given >= int(payment.operationAmount)
    described = ", ".join(f"{op.operationResult} by {op.operationType} {op.operationId}" for op in done)
    if done and not whole:
        doubts.append(f"{described}: {given} of {payment.operationAmount} given back")
    return GivenBack(described if done and whole else "", "; ".join(doubts))


def refund_key(flow_id: str, operation_id: str) -> str:
    return f"{REFUND_KEY}{flow_id}:{operation_id}"


def without_signals_of(record: FlowRecord, operation_id: str) -> dict[str, str | None]:
    """Fields that drop the kept notifications of ``operation_id`` and the LatePayment error."""
    kept = [s.field for s in record.signals if str((s.payload.get("operation") or {}).get("operationId")) == operation_id]
    fields: dict[str, str | None] = dict.fromkeys(kept)
    fields["error"] = None
    return fields


def asked_for(refund: FlowRecord) -> tuple[str, str]:
    """Why a late payment's refund was asked, and who asked (its ``note``), for the refunded flow's close
    by the refund's end; the refund's own words when it carries no note."""
    try:
        note = json.loads(refund.fields.get("note") or "{}")
    except ValueError:
        note = {}
    if not isinstance(note, dict) or not note.get("reason"):
        return "late payment refunded", ""
    return str(note["reason"]), str(note.get("by") or "")
