"""Money in flight: what a step's completion says about money the flow may have at the gateway.

One record field, ``unsettled`` (JSON ``{step, op, t, v, operationId?}``), is the one home of "may money be
moving at the gateway for this flow" (docs/durability.md, "Money in flight"):

* **set** by ``claim.lua`` when a step whose operation moves money (the catalogue's ``moves_money``),
  opens something the customer pays on (a hosted page, a link, a form: ``notifies``) or makes it payable
  again (a renewal, a modification: ``reopens``) is claimed to call: from that moment the call may
  reach the gateway (a link whose create answer was lost is open at the gateway all the same); and by
  the completion of an opening step's answer, marked ``open``: from then on the customer may pay
  (``workflows.flows.waits``);
* **kept, and told the operation**, by a completion whose answer names an operation that is not final
  yet (a payment answered ``PENDING``; a refund, capture or cancel, answered only with its id): the
  flow's read step reads that operation;
* **kept** through anything that is not the gateway's word on it: a lost answer, a lost worker, a 429
  after an earlier try whose answer was lost, a person's stop;
* **settled** (deleted) only by a completion that reports the gateway's answer: a final result of the
  operation (success, decline, failure, refund...), a refusal of the call itself when no earlier try is
  unanswered (a 429, a 503, or the gateway's breaker that let no call out: ``Defer``), a wait's end
  where the gateway says the customer can no longer pay (``CLOSED``), or a
  read that found nothing after the call could no longer arrive (``tasks.runner.settle``).

``v`` is the mark's format (:data:`MARK_FORMAT`): a mark that carries it was made by a release whose money
steps on a shared gateway target hold it before any call can be sent (``workflows.engine.targets``), so such a
mark with no hold on the record had no call sent under it; a mark without it is an earlier release's,
whose call may have been sent with no hold at all (:func:`sent_unheld`).

``transition.lua`` reads it and nothing else to decide whether a flow may end ``cancelled`` or
``failed``: while it is set, a cancel becomes a read of the gateway and a failure is owed (``ending``)
until that read. The flags ``reconcile``, ``uncertain`` and ``maybe_sent`` only say *when* to read.

Every other layer asks here instead of reading those fields its own way (the questions below: the
engine's claim, completion and outage bound, the operator actions, the late payments' closes, the
reconciliation, the gateway targets); the scripts ask ``engine/lua/inflight.lua``, the same rule in Lua
(``in_flight``, ``unanswered``).
"""

from __future__ import annotations

import json
from typing import Any

from durapay.gateway import OperationResult
from durapay.tasks.outcomes import Advance, Defer, Finish, Outcome, Retry, Wait
from durapay.workflows.engine.steps import Step
from durapay.workflows.engine.store import FlowRecord, compact_json
from durapay.workflows.flows._common import operation_of
from durapay.workflows.flows.waits import CLOSED, KEEP_MARGIN_SECONDS, PAGE_SECONDS, keep_until

#: The fields a completion writes once the gateway has said what became of the money.
SETTLED: dict[str, str | None] = {"unsettled": None, "maybe_sent": None, "ending": None}
#: The format of this release's marks (``v``): 2 since a money step on a shared gateway target writes its
#: hold on the record before its call can be sent (``workflows.engine.targets``); an earlier release's mark has none.
MARK_FORMAT = 2


# -- the questions every other layer asks ----------------------------------------------------------


def in_flight(record: FlowRecord) -> dict[str, Any] | None:
    """The money the flow may have at the gateway (``unsettled``: its call and operation, or what its
    customer can pay on), or None: while it is set, no end cancelled or failed before a read."""
    return record.unsettled or None


def holds_open(record: FlowRecord) -> bool:
    """Whether the flow holds something its customer can still pay on (a page, a link, a form)."""
    return bool(record.unsettled and record.unsettled.get("open"))


def moved(record: FlowRecord) -> dict[str, Any] | None:
    """The money an earlier step recorded taken (``money_moved``: never cancelled, never failed), or None."""
    raw = record.fields.get("money_moved")
    if not raw:
        return None
    try:
        taken = json.loads(raw)
    except ValueError:
        return {}
    return taken if isinstance(taken, dict) else {}


def marked_since(record: FlowRecord, moment: Any) -> bool:
    """Whether ``moment`` (when a try wrote something of its money call: its hold on a gateway target) is no
    earlier than the claim that marked the money in flight now: written under this mark, not left by a try
    whose money was settled since (a refusal, a wait for another flow), after which a claim marked it anew.
    Unknown either way: True (as the record was read before marks were compared)."""
    marked = (record.unsettled or {}).get("t")
    if not isinstance(marked, int | float) or not isinstance(moment, int | float):
        return True
    return float(moment) >= float(marked) - 0.001  # (the mark's time passes through Lua's JSON: to a millisecond)


def sent_unheld(record: FlowRecord, step: str) -> bool:
    """Whether a try of an earlier release may have sent ``step``'s money call with no hold on its gateway
    target: money in flight for the step marked without this release's format (``v``), and a try that may
    have sent (:func:`may_have_sent`). Known from what the mark says, never from a hold missing: a mark of
    this release with no hold on the record had no call sent under it (the hold is written, and durable,
    before the call can be; ``workflows.engine.targets``)."""
    mark = record.unsettled
    if not mark or mark.get("step") != step or not may_have_sent(record):
        return False
    version = mark.get("v")
    return not isinstance(version, int) or version < MARK_FORMAT


def reads_first(record: FlowRecord) -> bool:
    """Whether the step's next try reads the gateway before it calls: an earlier try's call may have
    reached it (an ambiguous error, a lost worker: ``reconcile``, ``uncertain``)."""
    return record.reconcile or record.uncertain


def may_have_sent(record: FlowRecord) -> bool:
    """Whether an earlier try of the step may have sent a call that got no answer (its flags, or the moment
    one may still arrive from): what it marked in flight is then settled only by the gateway's word."""
    return reads_first(record) or record.maybe_sent is not None


def sent_at(record: FlowRecord) -> float:
    """The latest moment a try of the step may have sent a money call whose answer never came: an
    unanswered try's time, else the claim that marked the money in flight, else the flow's start (the
    late window counts from it: ``tasks.runner.settle``)."""
    marked = (record.unsettled or {}).get("t")
    times = [t for t in (record.maybe_sent, float(marked) if isinstance(marked, int | float) else None) if t is not None]
    return max(times) if times else record.created


def unanswered(record: FlowRecord, reconcile: bool) -> dict[str, str | None]:
    """What a try kept from its answer writes of when to read (a Retry, a Defer, another flow's hold): the
    step reads first from now on once any try may have reached the gateway (``reconcile``: this one; or an
    earlier one), and that stays true until the step is done: a later 429 or 5xx proves nothing about the
    earlier request, still on its way. (From when it may still arrive: :func:`unanswered_write`.)"""
    return {"reconcile": "1" if reconcile or reads_first(record) else None}


def unanswered_write(outcome: Outcome, *, wrote: bool) -> bool:
    """Whether a try that sent a write at the gateway (``wrote``) got no answer it can read (an ambiguous
    error, or an outcome that asks for a read-back first): the call may still act there, up to
    ``late_seconds`` on, and the late window starts at this try's completion."""
    error = getattr(outcome, "error", None)
    return wrote and (bool(getattr(outcome, "reconcile", False)) or _may_have_acted(error))


def may_have_moved(step: Step, record: FlowRecord, outcome: Outcome) -> bool:
    """Whether money may have moved for a flow about to end for a reason of its own (an outage past its
    bound): money in flight still marked after ``outcome``, or an unanswered call."""
    money = after(step, record, outcome)
    marked = money["unsettled"] if "unsettled" in money else record.fields.get("unsettled")
    return bool(marked) or bool(getattr(outcome, "reconcile", False)) or reads_first(record)


# -- what a completion writes -------------------------------------------------------------------


def money_operation(step: Step) -> str:
    """The gateway operation ``step`` calls when it moves money, opens what a customer pays on, or makes
    it payable again (a renewed or modified link: the catalogue's ``declared_only``; "" for any other
    step): what its claim marks as unsettled. A renewal whose answer was lost is then read back before a
    cancel ends its flow, never taken as "nothing moved" unread (``tasks.runner.settle``)."""
    op = step.operation
    return op.name if op is not None and op.declared_only else ""


def opens(step: Step) -> bool:
    """Whether ``step``'s answer opens something a customer pays on (a hosted page, a link, a form: the
    catalogue's ``notifies``): from its answer until the gateway says the customer can no longer pay,
    money may move (``workflows.flows.waits``)."""
    op = step.operation
    return op is not None and op.notifies


def after(step: Step, record: FlowRecord, outcome: Outcome, *, sent: bool = True) -> dict[str, str | None]:
    """The fields that ``outcome`` of ``step``, claimed as ``record``, writes about money in flight:
    settled, told its operation, opened (a customer may now pay), or nothing (it stays as it was); and
    how long a finished flow must be kept for the customer's instrument (``keep_until``). ``sent`` False:
    this try ended before its money call could be sent (taking its gateway target, ``workflows.engine.targets``)."""
    return {**_money(step, record, outcome, sent), **_keep(step, record, outcome)}


def _keep(step: Step, record: FlowRecord, outcome: Outcome) -> dict[str, str | None]:
    """A link's expiry (as answered, renewed or read), the deadline or end of a wait, or a page's assumed life
    from its creation keeps the flow's record and lookups until its customer can no longer pay, plus a
    margin; never shortened."""
    if isinstance(outcome, Wait):
        until: float | None = max(outcome.deadline, outcome.ends or 0.0) + KEEP_MARGIN_SECONDS
    elif isinstance(outcome, Advance | Finish) and outcome.output:
        until = keep_until(outcome.output)
        if until is None and isinstance(outcome, Advance) and opens(step):
            until = record.updated + PAGE_SECONDS + KEEP_MARGIN_SECONDS
    else:
        return {}
    if until is None or until <= record.keep_until:
        return {}
    return {"keep_until": repr(until)}


def _money(step: Step, record: FlowRecord, outcome: Outcome, sent: bool) -> dict[str, str | None]:
    unsettled = record.unsettled
    if isinstance(outcome, Advance) and opens(step) and (unsettled is None or _own_call(step, unsettled)):
        # The customer may pay from now on: the wait ends only on the gateway's word (CLOSED, or a
        # final payment), and a cancel closes it first.
        op = step.operation
        mark = {"step": step.name, "op": op.name if op else "", "t": record.updated, "open": True, "v": MARK_FORMAT}
        return {"unsettled": compact_json(mark)}
    if unsettled is None:
        return {}
    if isinstance(outcome, Finish) and outcome.output and outcome.output.get(CLOSED):
        return dict(SETTLED)  # the gateway says the customer can no longer pay (link expired, form over)
    if isinstance(outcome, Advance | Finish):
        operation = operation_of(outcome.output) if outcome.output else None
        if operation is not None:
            result = operation.get("operationResult")
            if result and result != OperationResult.PENDING.value:
                return dict(SETTLED)  # the gateway's final word on the operation
            if operation.get("operationId"):
                return _told(unsettled, operation["operationId"])
        elif outcome.output and isinstance(outcome.output.get("operationId"), str):
            return _told(unsettled, outcome.output["operationId"])  # a post-operation's answer: its id only
        if _own_call(step, unsettled):
            if isinstance(outcome, Advance) or outcome.error is None:
                return dict(SETTLED)  # the gateway answered the money call, with no operation to read
            if not may_have_sent(record) and not _may_have_acted(outcome.error) and not outcome.error.get("retryable"):
                return dict(SETTLED)  # the gateway refused the call, and no earlier try is unanswered
        return {}
    refused = isinstance(outcome, Retry | Defer) and not outcome.reconcile and not _may_have_acted(outcome.error)
    never_sent = not sent and _marked_by(record, unsettled)
    if (refused or never_sent) and _own_call(step, unsettled) and not may_have_sent(record):
        # Refused before acting (a 429, a 503), or this claim's mark and no call sent under it (a read before
        # the call failed, another flow holds the target: workflows.engine.targets): the next claim marks it again.
        return dict(SETTLED)
    return {}


def unclaimed(record: FlowRecord) -> dict[str, str | None]:
    """The fields of a claim given back before its step ran (a migration refused parks the flow): the
    mark this claim made is settled, no call having been sent under it; a mark kept from an earlier try
    stays, as does one after a try that may have sent."""
    unsettled = record.unsettled
    if unsettled is not None and _marked_by(record, unsettled) and not may_have_sent(record):
        return dict(SETTLED)
    return {}


def nothing_moved() -> dict[str, str | None]:
    """The fields of an end taken after a read found the money never moved (``tasks.runner.settle``)."""
    return dict(SETTLED)


def _told(unsettled: dict[str, Any], operation_id: Any) -> dict[str, str | None]:
    if unsettled.get("operationId") == str(operation_id):
        return {}
    return {"unsettled": compact_json({**unsettled, "operationId": str(operation_id)})}


def _own_call(step: Step, unsettled: dict[str, Any]) -> bool:
    """The outcome is of the money call itself (not of a read of it)."""
    return unsettled.get("step") == step.name and money_operation(step) != ""


def _marked_by(record: FlowRecord, unsettled: dict[str, Any]) -> bool:
    """Whether the mark is the one the claim of ``record`` made (claim.lua stamps it with the claim's time,
    which passes through Lua's JSON: to a millisecond), not one kept from an earlier try."""
    marked = unsettled.get("t")
    return isinstance(marked, int | float) and abs(float(marked) - record.updated) < 0.001


def _may_have_acted(error: Any) -> bool:
    """Whether an error, as recorded, leaves open that the gateway acted on the call: a gateway error's
    own ``ambiguous`` (a timeout after sending, a dropped connection, a 5xx). An error without it is a
    step's reading of an answer (a decline, an expiry), which the gateway gave."""
    return isinstance(error, dict) and bool(error.get("ambiguous", False))
