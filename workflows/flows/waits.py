"""The end of a wait for a customer: one rule for every flow that waits on a page, a link or a form.

A flow that waits for a customer (``hpp``, ``paybylink``, ``build``, ``reservation``) holds something the
customer can pay on. Its record marks that as money in flight (``workflows.engine.inflight``: the create's
answer opens it), so the flow ends ``failed`` or ``cancelled`` only on the gateway's word that the
customer can no longer pay (docs/durability.md, "Waiting flows"):

* the order shows a successful payment: the flow succeeds with it, however late;
* a payment is ``PENDING`` (an APM still running): the flow reads again at a bounded pace
  (:func:`pace`) until :data:`GRACE_SECONDS` after the instrument's expiry, then a person looks;
* the link is ``EXPIRED``, ``CANCELLED`` or ``FAILED``, the page or form recorded its outcome: the
  customer can no longer pay, the output says so (:data:`CLOSED`) and the flow ends;
* the link is ``ACTIVE`` with a later expiry (renewed or modified, by durapay or not): the wait goes on
  to that expiry, reading the gateway meanwhile (:func:`watch`); ``ACTIVE`` past its expiry: read again
  at a bounded pace, then a person looks.

A wait never depends on a notification arriving: the gateway gives up on one after its retries, a link
adopted after a lost answer has no token to verify its notifications, and a Redis that loses its last
second of writes (``appendfsync everysec`` on a server that confirms ``WAITAOF`` early) can lose one
the receiver acknowledged. So an open link is read :func:`first_read` after it is made and then as
:func:`watch` says until its end (reads that grow with the logarithm of its life); a notification only
makes the outcome come sooner.

A cancel closes what the gateway lets the merchant close (``WaitStep.close``: the link's cancel, the
form's cancel) and then reads the same way; a hosted page cannot be closed (docs/gateway.md), so its
record is kept while it may still be paid and a later payment shows as a late payment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from durapay.gateway import (
    SUCCESS_RESULTS,
    BadRequest,
    Catalogue,
    NotFound,
    Operation,
    OperationResult,
    PaymentLink,
    PaymentLinkStatus,
    Unknown,
    customer_operation,
    customer_payment,
    reported_payment,
)
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome, Wait
from durapay.tasks.runner import StepContext
from durapay.workflows.flows._adopt import page_payment
from durapay.workflows.flows._common import judge_operation, read_order

#: Output key of a wait's end: why the customer can no longer pay (the gateway's word). A completion
#: carrying it settles the flow's money in flight (``workflows.engine.inflight``).
CLOSED = "closed"
#: Reads after a deadline, while something is still open: every tenth of the wait's age, at least every
#: ``DURAPAY_RETRY__READ_PACE_SECONDS`` (5 minutes), at most every 6 hours (so a bounded number of reads
#: over any life).
PACE_MAX_SECONDS = 21600.0
#: How long after its instrument's expiry a flow goes on reading a PENDING payment, or a link the
#: gateway still shows ACTIVE, before it stops for a person.
GRACE_SECONDS = 7 * 86400.0
#: A finished flow's record, order lookups and notification tokens live at least this long after the
#: last moment its customer could pay (its link's expiry, the last deadline it waited for), whatever
#: ``DURAPAY_ENGINE__RETENTION_DAYS`` says. A hosted page has no cancel and no published lifetime
#: (docs/gateway.md): a payment on it within the margin (or the retention, if longer) is still found.
KEEP_MARGIN_SECONDS = 86400.0
#: How long durapay takes a hosted page or form to stay payable after it was opened, where the gateway
#: says nothing (docs/gateway.md): the flow is kept at least that long, plus the margin.
PAGE_SECONDS = 86400.0

#: The output's marks of why the gateway was read: at the wait's deadline, or before it (the reads of an
#: open link while the flow waits).
READ_AT_DEADLINE = "readAtDeadline"
READ_WHILE_WAITING = "readWhileWaiting"

_CLOSED_LINKS = {
    PaymentLinkStatus.EXPIRED: ("the pay-by-link expired unpaid", "LinkExpired"),
    PaymentLinkStatus.CANCELLED: ("the pay-by-link was cancelled", "LinkCancelled"),
    PaymentLinkStatus.FAILED: ("the pay-by-link can no longer be paid (FAILED)", "LinkFailed"),
}


def link_end(expiration_date: str) -> float:
    """The last moment a link may be paid: the end of its expiration day (UTC), plus a minute for the
    gateway's own expiry run."""
    day = date.fromisoformat(expiration_date[:10])
    return (datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1, minutes=1)).timestamp()


def began(ctx: StepContext) -> float:
    """When the flow's wait for its customer began (``StepContext.wait_since``: the making of the link,
    page or form it waits on, for this generation): what every deadline and pace of the wait counts from.
    Never the flow's creation: a flow an operator restarts weeks later makes a new link, whose
    ``waitSeconds`` and reads count from then."""
    return ctx.wait_since if ctx.wait_since is not None else ctx.created


def pace(ctx: StepContext) -> float:
    """Seconds to the next read of something still open after a deadline: a tenth of the wait's age."""
    return min(max(ctx.retry.read_pace_seconds, (ctx.now - began(ctx)) / 10), PACE_MAX_SECONDS)


def watch(ctx: StepContext, until: float) -> float:
    """The next read of an open link before its end ``until``: a tenth of the wait's age from now, at
    least the read pace, never past the end. Unlike :func:`pace` it has no 6-hour cap, so the reads
    over a link's whole life grow with the logarithm of it (about 57 over 3 days, 91 over 80): a
    payment whose notification never came shows within a tenth of the time the link had been open."""
    return min(until, ctx.now + max(ctx.retry.read_pace_seconds, (ctx.now - began(ctx)) / 10))


def keep_until(output: dict[str, Any]) -> float | None:
    """The moment until which a flow whose output shows ``paymentLink`` must be kept (its expiry plus a
    margin): the record and its lookups outlive the retention while the customer can still pay."""
    link = output.get("paymentLink")
    if not isinstance(link, dict) or not isinstance(link.get("expirationDate"), str):
        return None
    try:
        return link_end(link["expirationDate"]) + KEEP_MARGIN_SECONDS
    except ValueError:
        return None


def read_later(ctx: StepContext, signals: tuple[str, ...], horizon: float, what: str, error: dict[str, Any]) -> Outcome:
    """Something is still open after a deadline: wait on (a notification resumes the flow) and read again
    at :func:`pace`, until ``horizon``; then a person looks, told what is open."""
    if ctx.now >= horizon:
        return Attention(f"{what}, {GRACE_SECONDS / 86400:g} days after it could be paid: look at the gateway", error)
    return Wait(signals, min(ctx.now + pace(ctx), horizon), note=f"{what}; read again later")


def judge_wait(
    ctx: StepContext,
    signals: tuple[str, ...],
    operations: Sequence[Operation],
    links: Sequence[PaymentLink],
    *,
    ends: float,
    shown: dict[str, Any] | None = None,
    read: str = READ_AT_DEADLINE,
    deadline: float | None = None,
) -> Outcome | None:
    """What the gateway shows for a waiting flow's order, as its outcome; None when it shows nothing
    paid, nothing pending and no link (a hosted page or form: the caller reads its own state).

    ``ends``: when the instrument stopped being payable by its first terms (the deadline it was given);
    a PENDING payment, or a link still open past its end, is read until the later of ``ends`` and the
    links' current ends, plus :data:`GRACE_SECONDS`. ``read``: the output's mark of why the gateway was
    read (at the deadline, or after a notification that was not a success); a deadline's read before
    ``deadline`` (the merchant's, if sooner), else ``ends``, is one of the reads while waiting
    (:data:`READ_WHILE_WAITING`). A value this version does
    not know (an operation's type or result, a link's status) is never taken as an end."""
    shown = dict(shown or ({"paymentLink": links[-1].wire()} if links else {}))
    if read == READ_AT_DEADLINE and ctx.now < (deadline or ends):
        read = READ_WHILE_WAITING
    unknown = [op for op in operations if _unknown(op)]
    if unknown:
        op = unknown[-1]
        return Attention(
            f"operation {op.operationId} is {op.operationType} {op.operationResult}, which this version does not know",
            {"type": "UnknownResult", "operationId": op.operationId, "operationResult": str(op.operationResult)},
        )
    paid = page_payment(operations)
    if paid is not None and paid.operationResult in SUCCESS_RESULTS:
        return judge_operation(paid, {"operation": paid.wire(), read: True, **shown})
    horizon = max([ends, *(end for link in links if (end := _end_of(link)) is not None)]) + GRACE_SECONDS
    pending = [op for op in operations if op.operationResult is OperationResult.PENDING]
    if pending:
        what = f"payment {pending[-1].operationId} is still PENDING"
        error = {"type": "PaymentPending", "operationId": pending[-1].operationId, "orderId": pending[-1].orderId}
        return read_later(ctx, signals, horizon, what, error)
    for link in links:
        if link.status is PaymentLinkStatus.PAID or not isinstance(link.status, PaymentLinkStatus):
            # Paid, yet no successful payment on the order (not yet shown); or a status not known here.
            what = f"link {link.linkId} is {link.status} (paid by {link.paidByOperationId}) and the order shows no payment"
            return read_later(ctx, signals, horizon, what, {"type": "LinkStatusUnclear", "linkId": link.linkId})
    active = [link for link in links if link.status is PaymentLinkStatus.ACTIVE]
    if active:
        link = active[-1]
        until = _end_of(link) or ends
        if until > ctx.now:  # open (renewed or modified, by durapay or not): wait on to its expiry, reading
            note = f"link {link.linkId} open until {link.expirationDate}"
            return Wait(signals, watch(ctx, until), note=note, ends=until)
        return read_later(
            ctx, signals, horizon, f"link {link.linkId} is still ACTIVE after its expiry",
            {"type": "LinkStillOpen", "linkId": link.linkId},
        )  # fmt: skip
    if paid is not None:  # a failed payment, and nothing left open: the page or link has its outcome
        return judge_operation(paid, {"operation": paid.wire(), read: True, **shown, CLOSED: "paid-failed"})
    for link in reversed(links):
        closed = _CLOSED_LINKS.get(link.status) if isinstance(link.status, PaymentLinkStatus) else None
        if closed is not None:
            return Finish(False, closed[0], {**shown, CLOSED: str(link.status)}, error={"type": closed[1]})
    return None


def _unknown(op: Operation) -> bool:
    return op.operationResult is None or isinstance(op.operationResult, Unknown) or isinstance(op.operationType, Unknown)


def _end_of(link: PaymentLink) -> float | None:
    """The last moment ``link`` may be paid as the gateway shows it (None: no date, or not one)."""
    try:
        return link_end(link.expirationDate) if link.expirationDate else None
    except ValueError:
        return None


def first_read(ctx: StepContext) -> float:
    """Seconds from a link's making to its first read: the shortest pace (later reads come at
    :func:`pace`). Also the first read of a link adopted after its create's answer was lost: it has no
    security token, so its notifications cannot be verified and only the reads tell."""
    return ctx.retry.read_pace_seconds


def cancel_link(ctx: StepContext, link_id: str | None) -> None:
    """Close a link before a cancel ends its flow. Refused (already paid, cancelled or expired) or gone:
    the read that follows says what it is."""
    if not link_id:
        return
    with contextlib.suppress(BadRequest, NotFound):
        ctx.call(Catalogue.cancel_paybylink, link_id)


def notified(
    ctx: StepContext, name: str, payload: dict[str, Any], read: Callable[[StepContext, Outcome | None], Outcome]
) -> Outcome:
    """A verified notification: a customer's payment ends the wait (``gateway.customer_payment``, the rule
    money.lua applies: a BACKOFFICE capture or refund on the order is the merchant's own flow's, never this
    flow's payment); anything else (PENDING, a decline, an expiry, the merchant's operation)
    is checked against what the gateway shows (``read(ctx, None)``, the step's own read), since a
    declined customer may try again on a link still open; ``read(ctx, outcome)`` may add to a success
    what the gateway shows now (a link's status). A payment on an earlier order of the flow is money the
    flow must account for: a person looks."""
    data = payload.get("operation")
    if not isinstance(data, dict):
        return Wait((name,), ctx.wait_deadline or ctx.now)
    operation = Operation.model_validate(data)
    paid = customer_payment(payload) is not None  # the merchant's own capture or refund is not the payment
    if operation.orderId and ctx.order_id and operation.orderId != ctx.order_id:
        if paid:
            return earlier_order_paid(ctx, operation)
        return Wait((name,), ctx.wait_deadline or ctx.now, note="notification of an earlier order ignored")
    if paid:
        outcome = judge_operation(operation, {"operation": operation.wire()})
        return read(ctx, outcome) if isinstance(outcome, Advance | Finish) else outcome
    return read(ctx, None)


def earlier_order_paid(ctx: StepContext, operation: Operation) -> Attention:
    paid = reported_payment({"operation": operation.wire()}) or {}
    return Attention(
        f"the gateway reports {operation.operationResult} of operation {operation.operationId} on the flow's earlier "
        f"order {operation.orderId} (the flow now uses {ctx.order_id})",
        {"type": "LatePayment", "endedAs": "moved to a new order", "operation": paid},
    )


def earlier_payment(ctx: StepContext) -> Operation | None:
    """A successful payment on an order the flow made before its current one (read at the deadline,
    in case that page's notification never came)."""
    for order_id in ctx.orders:
        if order_id == ctx.order_id:
            continue
        try:
            found = ctx.call(Catalogue.get_order, order_id)
        except NotFound:
            continue
        for operation in found.operations:
            if operation.operationResult in SUCCESS_RESULTS and customer_operation(operation.wire()):
                return operation
    return None


def kept_payment(ctx: StepContext, operation: Operation) -> bool:
    """Whether the flow's record already keeps ``operation`` as a reported payment (a LatePayment's
    notification, kept until a person closes it; money.lua shows it whenever the flow would end)."""
    kept = {str((payload.get("operation") or {}).get("operationId")) for _, _, payload in ctx.signals}
    return operation.operationId in kept


def order_state(ctx: StepContext) -> tuple[list[Operation], list[PaymentLink]]:
    """The flow's current order as the gateway has it: its operations and links (none if unknown)."""
    found = read_order(ctx)
    return (list(found.operations), list(found.all_links())) if found else ([], [])
