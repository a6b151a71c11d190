"""Payments the customer completes on a gateway page: hosted payment page and pay-by-link (with the link's
cancel, renewal and modification); the embedded form is in ``workflows.flows.forms``.

Each creates the session (with ``notificationUrl`` set to durapay's receiver unless the input gives
one), records the customer-facing URL, then *waits*: a verified notification resumes the flow; at the
deadline the flow reads the gateway (``GET /orders/{orderId}``) instead of guessing, and the one rule of
``workflows.flows.waits`` says whether the customer can still pay. A PENDING notification keeps the flow
waiting; only a final result ends it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from durapay.flows import Call, Flow, call, wait_signal
from durapay.gateway import (
    Amount,
    Catalogue,
    GatewayError,
    GatewayModel,
    HppOrderRequest,
    NotFound,
    Operation,
    PassThrough,
    PayByLinkModifyRequest,
    PayByLinkRenewRequest,
    PayByLinkRequest,
    PaymentLinkStatus,
)
from durapay.tasks.outcomes import Advance, Finish, Outcome, Wait
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from durapay.workflows.engine import CallStep, WaitStep
from durapay.workflows.flows._adopt import new_order_if_never_charged
from durapay.workflows.flows._common import (
    input_order_id,
    order_with_current_id,
    read_order,
    summarize,
)
from durapay.workflows.flows.waits import (
    CLOSED,
    GRACE_SECONDS,
    READ_AT_DEADLINE,
    began,
    cancel_link,
    earlier_order_paid,
    earlier_payment,
    first_read,
    judge_wait,
    kept_payment,
    link_end,
    notified,
    order_state,
    read_later,
)


def session_body(ctx: StepContext, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    body: dict[str, Any] = ctx.input.wire()
    for name in drop:
        body.pop(name, None)
    body["order"] = order_with_current_id(ctx, ctx.input.order)
    session = body.get("paymentSession")
    if isinstance(session, dict) and not session.get("notificationUrl") and ctx.notification_url:
        session["notificationUrl"] = ctx.notification_url
    return body


def _link_id(ctx: StepContext) -> str | None:
    created = ctx.output("create").get("paymentLink")
    return str(created["linkId"]) if isinstance(created, dict) and created.get("linkId") else None


def _with_link_status(ctx: StepContext, outcome: Outcome | None) -> Outcome:
    """A success reports the flow's link as the gateway has it now (PAID), not as created: one read of
    the order, best effort (the outcome stands without it). Anything else: the deadline read decides."""
    if outcome is None:
        return _read_order_at_deadline(ctx, "notification", read=AFTER_NOTIFICATION)
    if not isinstance(outcome, Advance | Finish):
        return outcome
    earlier = _earlier_unkept(ctx)  # a success of this order never hides a payment on an earlier one
    if earlier is not None:
        return earlier_order_paid(ctx, earlier)
    if _link_id(ctx) is None:
        return outcome
    try:
        _, links = order_state(ctx)
    except GatewayError:
        return outcome
    mine = [link for link in links if link.linkId == _link_id(ctx)]
    if not mine:
        return outcome
    output = {**outcome.output, "paymentLink": mine[-1].wire()}
    if isinstance(outcome, Advance):
        return Advance(output)
    return Finish(outcome.succeeded, outcome.reason, output, outcome.error)


def _cancel_own_link(ctx: StepContext) -> None:
    cancel_link(ctx, _link_id(ctx))


def _notified(ctx: StepContext, name: str, payload: dict[str, Any]) -> Outcome:
    if name == LINK_CHANGED:  # renewed or modified: what the gateway shows now moves the wait
        return _read_order_at_deadline(ctx, "the link changed")
    return notified(ctx, name, payload, _with_link_status)


def _ends(ctx: StepContext) -> float:
    """When the flow's instrument stopped being payable by its first terms: the link's expiry as created
    (a renewal moves it: the read then finds the link open), else the wait's first deadline."""
    created = ctx.output("create").get("paymentLink")
    if isinstance(created, dict) and isinstance(created.get("expirationDate"), str):
        return link_end(created["expirationDate"])
    return began(ctx) + (getattr(ctx.input, "waitSeconds", None) or HPP_SECONDS)  # fixed: never moves with the wait


def _earlier_unkept(ctx: StepContext) -> Operation | None:
    """A successful payment on an earlier order of the flow that its record does not keep yet: money the
    flow must account for (a person looks), whether its own order was read or notified paid."""
    earlier = earlier_payment(ctx)
    return earlier if earlier is not None and not kept_payment(ctx, earlier) else None


def _read_order_at_deadline(ctx: StepContext, waited_for: str, *, read: str = READ_AT_DEADLINE) -> Outcome:
    """The one rule for the end of a wait (``workflows.flows.waits``), on the flow's order."""
    earlier = earlier_payment(ctx)
    if earlier is not None and not kept_payment(ctx, earlier):
        return earlier_order_paid(ctx, earlier)
    judged = _judge_own_order(ctx, waited_for, read)
    if earlier is not None and not _final(judged):
        return earlier_order_paid(ctx, earlier)  # the flow's own order is still open: a person looks now
    return judged  # a payment on an earlier order stays kept on the record: money.lua shows it at the end


def _final(outcome: Outcome) -> bool:
    """The flow's own order is done with: paid, or closed (the customer can no longer pay on it)."""
    if isinstance(outcome, Advance):
        return True
    return isinstance(outcome, Finish) and (outcome.succeeded or bool((outcome.output or {}).get(CLOSED)))


def _judge_own_order(ctx: StepContext, waited_for: str, read: str) -> Outcome:
    operations, links = order_state(ctx)
    link_id = _link_id(ctx)
    if link_id is not None and not any(link.linkId == link_id for link in links):
        # A pay-by-link whose order read does not show its link (yet): read the link itself; never taken
        # for a hosted page with nothing on it.
        try:
            details = ctx.call(Catalogue.get_paybylink, link_id)
        except NotFound:
            error = {"type": "LinkNotFound", "linkId": link_id}
            return read_later(ctx, ("notification",), _ends(ctx) + GRACE_SECONDS, f"link {link_id} is not found", error)
        known = {op.operationId for op in operations}
        links = [*links, details.paymentLink]
        operations = [*operations, *(op for op in details.operations if op.operationId not in known)]
    judged = judge_wait(ctx, ("notification",), operations, links, ends=_ends(ctx), read=read)
    if judged is not None:
        return judged
    if read == AFTER_NOTIFICATION or link_id is not None:  # nothing final: the wait goes on
        return Wait(("notification",), ctx.wait_deadline or ctx.now)
    # A hosted page at its deadline, nothing paid or pending: the gateway offers no cancel and no expiry
    # for it (docs/gateway.md), so this read is the end the gateway allows; the flow's record is kept
    # (KEEP_MARGIN_SECONDS at least), so a payment on the page later still shows, as a late payment.
    closed = {CLOSED: "hosted page: no payment by the deadline (the gateway cannot close it)", read: True}
    return Finish(False, f"no payment by the deadline ({waited_for})", closed, error={"type": "Expired"})


#: durapay's default wait for a hosted page's customer (``waitSeconds``).
HPP_SECONDS = 1800.0

#: The output's mark of a read made because a notification was not a success (a decline, PENDING).
AFTER_NOTIFICATION = "readAfterNotification"

#: The signal durapay's own renewal or modification of a link sends to the flow that holds it.
LINK_CHANGED = "link_changed"


def _await(name: str, timeout: Any, waited_for: str, close: Any = None, signals: tuple[str, ...] = ("notification",)) -> WaitStep:
    return wait_signal(
        name,
        signals,
        _notified,
        lambda ctx: _read_order_at_deadline(ctx, waited_for),
        timeout=timeout,
        close=close,
    )


# -- hosted payment page ----------------------------------------------------------------------------


class HppInput(PassThrough, HppOrderRequest):
    waitSeconds: float | None = Field(default=None, gt=0, description="durapay: how long to wait for the customer")


HPP = Flow(
    "hpp",
    HppInput,
    (
        call(
            "create",
            Catalogue.create_hpp_order,
            lambda ctx: Call(request=session_body(ctx, ("waitSeconds",))),
            adopt=new_order_if_never_charged("the hosted page answer was lost before the customer saw it"),
            customer_url=lambda output: output.get("hostedPage"),
        ),
        _await("payment", lambda ctx: ctx.input.waitSeconds or HPP_SECONDS, "hosted payment page"),
    ),
    summarize,
    input_order_id,
    "hosted payment page: create, wait for the customer, outcome",
)


# -- pay-by-link -------------------------------------------------------------------------------------

LINK_OPERATIONS = {
    "v3": Catalogue.create_paybylink_v3,
    "v2": Catalogue.create_paybylink_v2,
    "v1": Catalogue.create_paybylink_v1,
    "unversioned": Catalogue.create_paybylink,
}


class PayByLinkInput(PassThrough, PayByLinkRequest):
    version: Literal["v3", "v2", "v1", "unversioned"] = "v3"


def _link_deadline(ctx: StepContext) -> float:
    """The link's first read (``waits.first_read``), or the end of its expiration day (UTC) plus a minute
    for the gateway's own expiry run if sooner (the link as the gateway answered, else as asked): a
    wait never depends on a notification arriving (``workflows.flows.waits``)."""
    created = ctx.output("create").get("paymentLink") or {}
    end = link_end(str(created.get("expirationDate") or ctx.input.expirationDate))
    seconds = max(ctx.now + 60.0, end) - ctx.now
    return min(seconds, first_read(ctx))


def _adopt_link(ctx: StepContext) -> ReconcileResult:
    """The order lookup lists its links: adopt the link (its token was lost, so the deadline read decides)."""
    found = read_order(ctx)
    if found is None:
        return NOT_COMMITTED
    links = found.all_links()
    if not links:
        return NOT_COMMITTED
    return Advance({"paymentLink": links[-1].wire(), "securityToken": None, "adopted": True})


def _per_version(ctx: StepContext, send: Any) -> Outcome:
    """The link's create of the version the input asks for (v3, v2, v1, unversioned)."""
    op = LINK_OPERATIONS[ctx.input.version]
    answer = ctx.call(op, request=session_body(ctx, ("version",)))
    return Advance(answer.wire())


def _link_create_step(name: str) -> CallStep:
    return call(
        name,
        Catalogue.create_paybylink_v3,
        lambda ctx: Call(),
        adopt=_adopt_link,
        customer_url=lambda output: (output.get("paymentLink") or {}).get("link"),
        body=_per_version,
    )


PAYBYLINK = Flow(
    "paybylink",
    PayByLinkInput,
    (
        _link_create_step("create"),
        _await(
            "payment", _link_deadline, "pay-by-link", lambda ctx: cancel_link(ctx, _link_id(ctx)), ("notification", LINK_CHANGED)
        ),
    ),
    summarize,
    input_order_id,
    "pay-by-link (v3 by default; v2, v1 and unversioned selectable): create, wait, outcome",
)


class LinkRef(GatewayModel):
    linkId: str = Field(min_length=1)


class LinkRenewal(LinkRef):
    expirationDate: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")


def _adopt_link_cancel(ctx: StepContext) -> ReconcileResult:
    try:
        details = ctx.call(Catalogue.get_paybylink, ctx.input.linkId)
    except NotFound:
        return NOT_COMMITTED
    if details.paymentLink.status is PaymentLinkStatus.CANCELLED:
        return Advance({"paymentLink": details.paymentLink.wire(), "cancelled": True})
    return NOT_COMMITTED


PAYBYLINK_CANCEL = Flow(
    "paybylink_cancel",
    LinkRef,
    (
        call(
            "cancel",
            Catalogue.cancel_paybylink,
            lambda ctx: Call((ctx.input.linkId,)),
            result=lambda ctx, answer: Advance({"linkId": ctx.input.linkId, "cancelled": True}),
            adopt=_adopt_link_cancel,
        ),
    ),
    summarize,
    None,
    "cancel a pay-by-link",
)


def _link_changed(ctx: StepContext, answer: Any) -> Outcome:
    """A renewal's or modification's answer, with the link's order (one read): the engine tells the flow
    that holds that order to read its link again (``Engine.tell_holder``), and keeps a holder that ended
    as long as the link is payable again. Without the order nothing can tell it, so a read that may pass
    (a 503, a timeout) is retried with the step: the renewal sent again sets the same date, a modification
    is resent safely. A link the gateway no longer finds has nothing left to pay."""
    output: dict[str, Any] = answer.wire()
    try:
        details = ctx.call(Catalogue.get_paybylink, ctx.input.linkId)
    except GatewayError as error:
        if error.retryable:
            raise
        return Advance(output)
    return Advance({**output, "orderId": details.orderId, "paymentLink": details.paymentLink.wire()})


def _adopt_link_change(ctx: StepContext) -> ReconcileResult:
    """A renewal's or modification's answer lost (or its worker): the link read back says whether it took
    effect, by what was asked of it (its expiry, its amount; the gateway names no operation for a change
    of a link). A renewal with no date asks the link to be payable again (the gateway picks the date): a
    link payable or paid is that. Taken, it completes as answered, and the flow holding the link is told
    (told when it was not this renewal's doing, the holder reads or keeps a link payable all the same);
    else the change is sent again, or, for a cancel, "nothing moved" once it can no longer arrive
    (``tasks.runner.settle``). A modification of the description alone cannot be read back: it is sent
    again (the same text), and a cancel ends it unread, the link's payability unchanged by it."""
    try:
        details = ctx.call(Catalogue.get_paybylink, ctx.input.linkId)
    except NotFound:
        return NOT_COMMITTED
    link = details.paymentLink
    asked = {name: value for name in ("expirationDate", "amount") if (value := getattr(ctx.input, name, None)) is not None}
    if asked:
        made = all(getattr(link, name) == value for name, value in asked.items())
    else:
        made = isinstance(ctx.input, LinkRenewal) and link.status in (PaymentLinkStatus.ACTIVE, PaymentLinkStatus.PAID)
    if made:
        return Advance({"orderId": details.orderId, "paymentLink": link.wire(), "adopted": True})
    return NOT_COMMITTED


PAYBYLINK_RENEW = Flow(
    "paybylink_renew",
    LinkRenewal,
    (
        call(
            "renew",
            Catalogue.renew_paybylink,
            lambda ctx: Call((ctx.input.linkId,), PayByLinkRenewRequest(expirationDate=ctx.input.expirationDate).wire()),
            result=_link_changed,
            adopt=_adopt_link_change,
            customer_url=lambda output: (output.get("paymentLink") or {}).get("link"),
        ),
    ),
    summarize,
    None,
    "renew a pay-by-link (a renewal repeated after a lost answer sets the same date again); the flow that "
    "holds the link waits to its new expiry",
    tells_holder=LINK_CHANGED,
)


class LinkModification(LinkRef):
    expirationDate: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    amount: Amount | None = None
    description: str | None = Field(default=None, max_length=255)


PAYBYLINK_MODIFY = Flow(
    "paybylink_modify",
    LinkModification,
    (
        call(
            "modify",
            Catalogue.modify_paybylink_v3,
            lambda ctx: Call(
                (ctx.input.linkId,),
                PayByLinkModifyRequest.model_validate({k: v for k, v in ctx.input.wire().items() if k != "linkId"}).wire(),
            ),
            result=_link_changed,
            adopt=_adopt_link_change,
        ),
    ),
    summarize,
    None,
    "modify a pay-by-link (expiry, amount, description); the flow that holds the link follows it",
    tells_holder=LINK_CHANGED,
)
