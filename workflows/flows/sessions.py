"""Payments the customer completes on a gateway page: hosted payment page, pay-by-link, embedded form.

Each creates the session (with ``notificationUrl`` set to durapay's receiver unless the input gives
one), records the customer-facing URL, then *waits*: a verified notification resumes the flow; at the
deadline the flow reads the gateway (``GET /orders/{orderId}``, ``GET /build/state``) instead of
guessing. A PENDING notification keeps the flow waiting; only a final result ends it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from pydantic import Field

from gateway import (
    Amount,
    BadRequest,
    BuildOrderRequest,
    BuildSessionRequest,
    BuildState,
    BuildStateResponse,
    Catalogue,
    GatewayError,
    GatewayModel,
    HppOrderRequest,
    NotFound,
    OperationResponse,
    OperationResult,
    PassThrough,
    PayByLinkModifyRequest,
    PayByLinkRenewRequest,
    PayByLinkRequest,
    PaymentLinkStatus,
)
from tasks.outcomes import Advance, Attention, Finish, Outcome, Wait
from tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from workflows.flows._adopt import new_order_if_never_charged
from workflows.flows._common import (
    input_order_id,
    judge_operation,
    order_with_current_id,
    payment_result,
    read_order,
    settle_step,
    summarize,
)
from workflows.flows.waits import (
    CLOSED,
    GRACE_SECONDS,
    PACE_MIN_SECONDS,
    adopted_read,
    cancel_link,
    earlier_order_paid,
    earlier_payment,
    judge_wait,
    link_end,
    notified,
    order_state,
    read_later,
)
from workflows.steps import Call, CallStep, FlowDefinition, WaitStep

#: The first read of a link the flow adopted (it cannot verify that link's notifications); later reads
#: come at the pace of every wait (``workflows.flows.waits.adopted_read``).
ADOPTED_READ_SECONDS = PACE_MIN_SECONDS


def _session_body(ctx: StepContext, drop: tuple[str, ...] = ()) -> dict[str, Any]:
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
    if not isinstance(outcome, Advance | Finish) or _link_id(ctx) is None:
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
    return ctx.created + (getattr(ctx.input, "waitSeconds", None) or HPP_SECONDS)  # fixed: never moves with the wait


def _read_order_at_deadline(ctx: StepContext, waited_for: str, *, read: str = "readAtDeadline") -> Outcome:
    """The one rule for the end of a wait (``workflows.flows.waits``), on the flow's order."""
    earlier = earlier_payment(ctx)
    if earlier is not None:
        return earlier_order_paid(ctx, earlier)
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
    adopted = adopted_read(ctx, operations, links, adopted=bool(ctx.output("create").get("adopted")))
    if adopted is not None:
        return adopted
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
    return WaitStep(
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


HPP = FlowDefinition(
    "hpp",
    HppInput,
    (
        CallStep(
            "create",
            Catalogue.create_hpp_order,
            lambda ctx: Call(request=_session_body(ctx, ("waitSeconds",))),
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
    """The end of the link's expiration day (UTC), plus a minute for the gateway's own expiry run (the
    link as the gateway answered, else as asked); for an adopted link (no token to verify its
    notifications) the first read comes sooner."""
    created = ctx.output("create").get("paymentLink") or {}
    end = link_end(str(created.get("expirationDate") or ctx.input.expirationDate))
    seconds = max(ctx.now + 60.0, end) - ctx.now
    return min(seconds, ADOPTED_READ_SECONDS) if ctx.output("create").get("adopted") else seconds


def _adopt_link(ctx: StepContext) -> ReconcileResult:
    """The order lookup lists its links: adopt the link (its token was lost, so the deadline read decides)."""
    found = read_order(ctx)
    if found is None:
        return NOT_COMMITTED
    links = found.all_links()
    if not links:
        return NOT_COMMITTED
    return Advance({"paymentLink": links[-1].wire(), "securityToken": None, "adopted": True})


def _link_create_step(name: str) -> CallStep:
    class _PerVersion(CallStep):
        def execute(self, ctx: StepContext) -> Outcome:
            op = LINK_OPERATIONS[ctx.input.version]
            answer = ctx.call(op, request=_session_body(ctx, ("version",)))
            return Advance(answer.wire())

    return _PerVersion(
        name,
        Catalogue.create_paybylink_v3,
        lambda ctx: Call(),
        adopt=_adopt_link,
        customer_url=lambda output: (output.get("paymentLink") or {}).get("link"),
    )


PAYBYLINK = FlowDefinition(
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


PAYBYLINK_CANCEL = FlowDefinition(
    "paybylink_cancel",
    LinkRef,
    (
        CallStep(
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
    that holds that order to read its link again (``Engine.tell_holder``)."""
    output: dict[str, Any] = answer.wire()
    try:
        details = ctx.call(Catalogue.get_paybylink, ctx.input.linkId)
    except GatewayError:
        return Advance(output)  # the link changed all the same; the holder sees it at its deadline read
    return Advance({**output, "orderId": details.orderId, "paymentLink": details.paymentLink.wire()})


PAYBYLINK_RENEW = FlowDefinition(
    "paybylink_renew",
    LinkRenewal,
    (
        CallStep(
            "renew",
            Catalogue.renew_paybylink,
            lambda ctx: Call((ctx.input.linkId,), PayByLinkRenewRequest(expirationDate=ctx.input.expirationDate).wire()),
            result=_link_changed,
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


PAYBYLINK_MODIFY = FlowDefinition(
    "paybylink_modify",
    LinkModification,
    (
        CallStep(
            "modify",
            Catalogue.modify_paybylink_v3,
            lambda ctx: Call(
                (ctx.input.linkId,),
                PayByLinkModifyRequest.model_validate({k: v for k, v in ctx.input.wire().items() if k != "linkId"}).wire(),
            ),
            result=_link_changed,
        ),
    ),
    summarize,
    None,
    "modify a pay-by-link (expiry, amount, description); the flow that holds the link follows it",
    tells_holder=LINK_CHANGED,
)

# -- embedded form (build) ---------------------------------------------------------------------------


class BuildInput(PassThrough, BuildOrderRequest):
    version: str | None = Field(default="3", pattern=r"^[23]$", description="form version: 3 (default) or 2")
    formSeconds: float | None = Field(default=None, gt=0, description="durapay: how long to wait for the form")


def _session_id(ctx: StepContext) -> str:
    return str(ctx.output("create")["sessionId"])


def _form_signal(ctx: StepContext, name: str, payload: dict[str, Any]) -> Outcome:
    """``form_completed`` comes from the merchant's page and proves nothing about money: its payload is
    dropped and the flow goes on to finalize, which asks the gateway. Only a verified notification (or
    ``GET /build/state``) may say the payment already happened."""
    if name == "form_completed":
        return Advance({"formCompleted": True})
    return notified(ctx, name, payload, _form_read)


def _form_read(ctx: StepContext, outcome: Outcome | None) -> Outcome:
    return outcome if outcome is not None else _session_outcome(ctx, ready=None, close=False)


#: Form states durapay may close (``/build/cancel``) at its own deadline or on a cancel: nothing paid yet.
CLOSABLE = {BuildState.PAYMENT_METHOD_SELECTION, BuildState.CARD_DATA_COLLECTION, BuildState.READY_FOR_PAYMENT}

#: Form states in which the customer is still at work on the gateway's side (a 3DS step, an APM page):
#: the session is open, whatever durapay's own deadline says.
CUSTOMER_AT_WORK = {BuildState.GDI_VERIFICATION, BuildState.REDIRECTED_TO_EXTERNAL_DOMAIN}


def _session_outcome(ctx: StepContext, *, ready: Outcome | None, close: bool = True) -> Outcome:
    """The one rule for the end of a wait (``workflows.flows.waits``), on the form's session: its payment
    (paid, declined, cancelled, expired: the session is over), the customer still at work (read again at
    a bounded pace until the session's own end), ``ready`` when it is ready for payment; else (nothing
    entered yet) the flow's own deadline closes it (``/build/cancel``) and reads again. Without
    ``close`` (a notification that was not a success) nothing is closed: the wait goes on."""
    state = ctx.call(Catalogue.build_state, request={"sessionId": _session_id(ctx)})
    if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
        outcome = judge_operation(state.operation, {"operation": state.operation.wire(), "readAtDeadline": True})
        if isinstance(outcome, Finish) and not outcome.succeeded:
            return Finish(False, outcome.reason, {**outcome.output, CLOSED: str(state.state)}, outcome.error)
        if not isinstance(outcome, Advance | Finish):  # PENDING: a payment still running
            return read_later(
                ctx, ("notification",), _form_ends(ctx) + GRACE_SECONDS,
                f"payment {state.operation.operationId} is still PENDING",
                {"type": "PaymentPending", "operationId": state.operation.operationId, "orderId": state.operation.orderId},
            )  # fmt: skip
        return outcome
    if state.state in CUSTOMER_AT_WORK:
        return read_later(
            ctx, ("notification",), _form_ends(ctx) + GRACE_SECONDS,
            f"the customer is still at work on the form ({state.state})", {"type": "FormOpen", "state": str(state.state)},
        )  # fmt: skip
    if state.state is BuildState.READY_FOR_PAYMENT and ready is not None:
        return ready
    if state.state not in CLOSABLE:  # a state this version does not know (or none): never closed on a guess
        what = f"the form is in state {state.state}, which this version does not follow"
        return read_later(ctx, ("notification",), _form_ends(ctx) + GRACE_SECONDS, what, {"type": "FormStateUnknown"})
    if not close:
        return Wait(("form_completed", "notification"), ctx.wait_deadline or ctx.now)
    _close_form(ctx)
    closed = ctx.call(Catalogue.build_state, request={"sessionId": _session_id(ctx)})
    if closed.state is BuildState.PAYMENT_COMPLETE and closed.operation is not None:
        ended = _session_outcome(ctx, ready=ready, close=False)
        if isinstance(ended, Finish) and not ended.succeeded and ready is not None:  # durapay's deadline closed it
            error = {**(ended.error or {}), "type": "Expired"}
            return Finish(False, f"the form was not completed in time (state {state.state})", ended.output, error)
        return ended
    return read_later(
        ctx, ("notification",), _form_ends(ctx) + GRACE_SECONDS,
        f"the form is still open ({closed.state}) after durapay cancelled it", {"type": "FormOpen", "state": str(closed.state)},
    )  # fmt: skip


def _form_ends(ctx: StepContext) -> float:
    return ctx.created + (ctx.input.formSeconds or FORM_SECONDS) + SESSION_SECONDS


def _close_form(ctx: StepContext) -> None:
    """Close the form's session (its cancel): refused when it is already over, which the read then shows."""
    with contextlib.suppress(BadRequest, NotFound):
        ctx.call(Catalogue.build_cancel, request={"sessionId": _session_id(ctx)})


def _form_deadline(ctx: StepContext) -> Outcome:
    """At the form's deadline: ready goes on to finalize; otherwise the one rule decides."""
    return _session_outcome(ctx, ready=Advance({"formCompleted": True, "state": str(BuildState.READY_FOR_PAYMENT)}))


def _finalize_result(ctx: StepContext, answer: BuildStateResponse) -> Outcome:
    """An answer without an operation is never final: the customer still has a step (version 2's 3DS
    after confirm, an APM page); the ``challenge`` wait follows it to the gateway's word."""
    if answer.operation is not None:
        return payment_result(ctx, OperationResponse(operation=answer.operation))
    if answer.state in CUSTOMER_AT_WORK or answer.state is BuildState.READY_FOR_PAYMENT:
        return Advance({**answer.wire(), "awaitingCustomer": True})
    return Attention(
        f"the form answered state {answer.state} without an operation, which this version does not follow",
        {"type": "UnknownFormState", "state": str(answer.state)},
    )


def _needs_finalize(ctx: StepContext) -> bool:
    """Finalize unless the gateway itself (notification or state read) already reported the operation."""
    return "operation" not in ctx.output("form")


def _awaits_customer(ctx: StepContext) -> bool:
    return bool(ctx.output("finalize").get("awaitingCustomer"))


def _challenge_deadline(ctx: StepContext) -> Outcome:
    return _session_outcome(ctx, ready=None)


class _Finalize(CallStep):
    """Version 3 finalizes (``finalize_payment``); version 2 confirms (``confirm_payment``)."""

    def execute(self, ctx: StepContext) -> Outcome:
        body = {"sessionId": _session_id(ctx)}
        try:
            if ctx.input.version == "2":
                answer = ctx.call(Catalogue.build_confirm_payment, request=body)
            else:
                answer = ctx.call(Catalogue.build_finalize_payment, request=BuildSessionRequest(**body))
        except BadRequest as refused:
            # The session is this flow's own: refused because it is already paid ("session is in state
            # PAYMENT_COMPLETE"), an earlier try paid it, one whose claim Redis may have lost in a crash
            # (so no mark says so). Read the session: its payment is this flow's. Refused because the
            # customer never got that far (a form_completed from the page that proves nothing): the flow
            # cannot pay, so it closes the form and ends on what the gateway then shows (the one rule).
            state = ctx.call(Catalogue.build_state, request=body)
            if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
                return _finalize_result(ctx, state)
            if state.state in CUSTOMER_AT_WORK or state.state not in CLOSABLE:
                raise
            ended = _session_outcome(ctx, ready=None)
            if isinstance(ended, Finish) and not ended.succeeded:
                why = f"the gateway refused the {'confirm' if ctx.input.version == '2' else 'finalize'} ({refused})"
                return Finish(False, f"{why}; the form (state {state.state}) was closed", ended.output, ended.error)
            return ended
        return _finalize_result(ctx, answer)


def _adopt_finalize(ctx: StepContext) -> ReconcileResult:
    state = ctx.call(Catalogue.build_state, request={"sessionId": _session_id(ctx)})
    if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
        return _finalize_result(ctx, state)
    if ctx.input.version == "2" and state.state in CUSTOMER_AT_WORK:
        return _finalize_result(ctx, state)  # the confirm arrived: the customer is at its 3DS step
    return NOT_COMMITTED


#: durapay's default wait for the form, and the gateway's session life (5 minutes; docs/gateway.md).
FORM_SECONDS = 360.0
SESSION_SECONDS = 300.0

BUILD = FlowDefinition(
    "build",
    BuildInput,
    (
        CallStep(
            "create",
            Catalogue.create_build_order,
            lambda ctx: Call(request=_session_body(ctx, ("formSeconds",))),
            adopt=new_order_if_never_charged("the embedded form answer was lost before the customer saw it"),
            customer_url=lambda output: next((f.get("src") for f in output.get("fields") or [] if f.get("src")), None),
        ),
        WaitStep(
            "form",
            ("form_completed", "notification"),
            _form_signal,
            _form_deadline,
            timeout=lambda ctx: ctx.input.formSeconds or FORM_SECONDS,
            close=_close_form,
            on_settle=_challenge_deadline,  # never on to finalize: a cancel or a failure owed only reads
        ),
        _Finalize("finalize", Catalogue.build_finalize_payment, lambda ctx: Call(), adopt=_adopt_finalize, when=_needs_finalize),
        WaitStep(
            "challenge",
            ("notification",),
            lambda ctx, name, payload: notified(ctx, name, payload, _form_read),
            _challenge_deadline,
            timeout=lambda ctx: SESSION_SECONDS,
            when=_awaits_customer,
            close=_close_form,
        ),
        settle_step("settle", "finalize"),
    ),
    summarize,
    input_order_id,
    "embedded payment form (versions 3 and 2): order, wait for the form, finalize/confirm (and the customer's "
    "3DS step after a version 2 confirm), outcome",
)


class BuildRef(GatewayModel):
    sessionId: str = Field(min_length=1)


def _adopt_build_cancel(ctx: StepContext) -> ReconcileResult:
    state = ctx.call(Catalogue.build_state, request={"sessionId": ctx.input.sessionId})
    if state.operation is not None and state.operation.operationResult in {
        OperationResult.CANCELED,
        OperationResult.CANCELLED,
    }:
        return Advance(state.wire())
    return NOT_COMMITTED


BUILD_CANCEL = FlowDefinition(
    "build_cancel",
    BuildRef,
    (
        CallStep(
            "cancel",
            Catalogue.build_cancel,
            lambda ctx: Call(request={"sessionId": ctx.input.sessionId}),
            adopt=_adopt_build_cancel,
        ),
    ),
    summarize,
    None,
    "cancel an embedded-form payment",
)
