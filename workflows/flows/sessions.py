"""Payments the customer completes on a gateway page: hosted payment page, pay-by-link, embedded form.

Each creates the session (with ``notificationUrl`` set to durapay's receiver unless the input gives
one), records the customer-facing URL, then *waits*: a verified notification resumes the flow; at the
deadline the flow reads the gateway (``GET /orders/{orderId}``, ``GET /build/state``) instead of
guessing. A PENDING notification keeps the flow waiting; only a final result ends it.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

from pydantic import Field

from gateway import (
    SUCCESS_RESULTS,
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
    Operation,
    OperationResponse,
    OperationResult,
    PassThrough,
    PayByLinkRenewRequest,
    PayByLinkRequest,
    PaymentLinkStatus,
    reported_payment,
)
from tasks.outcomes import Advance, Attention, Finish, Outcome, Poll, Wait
from tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from workflows.flows._adopt import new_order_if_never_charged, page_payment
from workflows.flows._common import (
    input_order_id,
    judge_operation,
    order_with_current_id,
    payment_result,
    read_order,
    settle_step,
    summarize,
)
from workflows.steps import Call, CallStep, FlowDefinition, WaitStep

#: How many times a deadline read that finds the payment still PENDING extends the wait.
MAX_EXTENSIONS = 3
EXTENSION_SECONDS = 600.0
#: How often a flow reads the order of a link it adopted (it cannot verify that link's notifications): at
#: first every 5 minutes, then a tenth of the link's age, at most every 6 hours (a bounded number of reads).
ADOPTED_READ_SECONDS = 300.0
ADOPTED_READ_MAX_SECONDS = 21600.0


def _session_body(ctx: StepContext, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    body: dict[str, Any] = ctx.input.wire()
    for name in drop:
        body.pop(name, None)
    body["order"] = order_with_current_id(ctx, ctx.input.order)
    session = body.get("paymentSession")
    if isinstance(session, dict) and not session.get("notificationUrl") and ctx.notification_url:
        session["notificationUrl"] = ctx.notification_url
    return body


def _notified(ctx: StepContext, name: str, payload: dict[str, Any]) -> Outcome:
    """A verified notification carries the operation: final results end the wait, PENDING keeps it. A
    payment on an earlier order of the flow (a page from before a restart or a new order id) is money
    the flow must account for: a person looks."""
    data = payload.get("operation")
    if not isinstance(data, dict):
        return Wait((name,), ctx.wait_deadline or ctx.now)
    operation = Operation.model_validate(data)
    if operation.orderId and ctx.order_id and operation.orderId != ctx.order_id:
        if operation.operationResult in SUCCESS_RESULTS:
            return earlier_order_paid(ctx, operation)
        return Wait((name,), ctx.wait_deadline or ctx.now, note="notification of an earlier order ignored")
    outcome = judge_operation(operation, {"operation": operation.wire()})
    if isinstance(outcome, Advance | Finish):
        return _with_link_status(ctx, outcome)
    return Wait(("notification",), ctx.wait_deadline or ctx.now)


def _with_link_status(ctx: StepContext, outcome: Advance | Finish) -> Outcome:
    """A pay-by-link flow's end reports its link as the gateway has it now (PAID, EXPIRED, ...), not as
    created: one read of the order, best effort (the outcome stands without it)."""
    created = ctx.output("create").get("paymentLink")
    if not isinstance(created, dict):
        return outcome
    try:
        found = read_order(ctx)
    except GatewayError:
        return outcome
    links = [link for link in (found.all_links() if found else []) if link.linkId == created.get("linkId")]
    if not links:
        return outcome
    output = {**outcome.output, "paymentLink": links[-1].wire()}
    if isinstance(outcome, Advance):
        return Advance(output)
    return Finish(outcome.succeeded, outcome.reason, output, outcome.error)


def earlier_order_paid(ctx: StepContext, operation: Operation) -> Attention:
    paid = reported_payment({"operation": operation.wire()}) or {}
    return Attention(
        f"the gateway reports {operation.operationResult} of operation {operation.operationId} on the flow's earlier "
        f"order {operation.orderId} (the flow now uses {ctx.order_id})",
        {"type": "LatePayment", "endedAs": "moved to a new order", "operation": paid},
    )


def _earlier_payment(ctx: StepContext) -> Operation | None:
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
            if operation.operationResult in SUCCESS_RESULTS:
                return operation
    return None


def _read_order_at_deadline(ctx: StepContext, waited_for: str) -> Outcome:
    earlier = _earlier_payment(ctx)
    if earlier is not None:
        return earlier_order_paid(ctx, earlier)
    found = read_order(ctx)
    operations = found.operations if found else []
    links = found.all_links() if found else []
    shown = {"paymentLink": links[-1].wire()} if links else {}
    paid = page_payment(operations)
    if paid is not None:
        return judge_operation(paid, {"operation": paid.wire(), "readAtDeadline": True, **shown})
    pending = [op for op in operations if op.operationResult is OperationResult.PENDING]
    if any(link.status is PaymentLinkStatus.EXPIRED for link in links):
        return Finish(False, "the pay-by-link expired unpaid", shown, error={"type": "LinkExpired"})
    if any(link.status is PaymentLinkStatus.CANCELLED for link in links):
        return Finish(False, "the pay-by-link was cancelled", shown, error={"type": "LinkCancelled"})
    if pending and ctx.polls < MAX_EXTENSIONS:
        return Poll(EXTENSION_SECONDS, note="payment still PENDING at the deadline; read again later")
    if ctx.output("create").get("adopted") and any(link.status is PaymentLinkStatus.ACTIVE for link in links):
        # An adopted link's security token was lost with the answer, so its notifications cannot be
        # verified: read the order again later, less often as the link ages, until it is paid or expires.
        later = min(max(ADOPTED_READ_SECONDS, (ctx.now - ctx.created) / 10), ADOPTED_READ_MAX_SECONDS)
        return Wait(("notification",), ctx.now + later, note="adopted link still open; read again later")
    return Finish(False, f"no payment by the deadline ({waited_for})", error={"type": "Expired"})


def _await(name: str, timeout: Any, waited_for: str) -> WaitStep:
    return WaitStep(
        name,
        ("notification",),
        _notified,
        lambda ctx: _read_order_at_deadline(ctx, waited_for),
        timeout=timeout,
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
        _await("payment", lambda ctx: ctx.input.waitSeconds or 1800.0, "hosted payment page"),
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
    """The end of the link's expiration day (UTC), plus a minute for the gateway's own expiry run; for
    an adopted link (no token to verify its notifications) the first read comes sooner."""
    day = date.fromisoformat(ctx.input.expirationDate)
    end = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1, minutes=1)
    seconds = max(ctx.now + 60.0, end.timestamp()) - ctx.now
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
    (_link_create_step("create"), _await("payment", _link_deadline, "pay-by-link")),
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

PAYBYLINK_RENEW = FlowDefinition(
    "paybylink_renew",
    LinkRenewal,
    (
        CallStep(
            "renew",
            Catalogue.renew_paybylink,
            lambda ctx: Call((ctx.input.linkId,), PayByLinkRenewRequest(expirationDate=ctx.input.expirationDate).wire()),
            customer_url=lambda output: (output.get("paymentLink") or {}).get("link"),
        ),
    ),
    summarize,
    None,
    "renew a pay-by-link (a renewal repeated after a lost answer sets the same date again)",
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
    ``GET /build/state`` at the deadline) may say the payment already happened."""
    if name == "form_completed":
        return Advance({"formCompleted": True})
    return _notified(ctx, name, payload)


def _form_deadline(ctx: StepContext) -> Outcome:
    """At the deadline read the session: ready (or already paid) goes on; anything else expired."""
    state = ctx.call(Catalogue.build_state, request={"sessionId": _session_id(ctx)})
    if state.state in {BuildState.READY_FOR_PAYMENT, BuildState.GDI_VERIFICATION}:
        return Advance({"formCompleted": True, "state": str(state.state)})
    if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
        return judge_operation(state.operation, {"operation": state.operation.wire(), "readAtDeadline": True})
    return Finish(False, f"the form was not completed in time (state {state.state})", error={"type": "Expired"})


def _finalize_result(ctx: StepContext, answer: BuildStateResponse) -> Outcome:
    if answer.operation is not None:
        return payment_result(ctx, OperationResponse(operation=answer.operation))
    return Finish(False, f"the form ended in state {answer.state} without an operation", answer.wire())


def _needs_finalize(ctx: StepContext) -> bool:
    """Finalize unless the gateway itself (notification or state read) already reported the operation."""
    return "operation" not in ctx.output("form")


class _Finalize(CallStep):
    """Version 3 finalizes (``finalize_payment``); version 2 confirms (``confirm_payment``)."""

    def execute(self, ctx: StepContext) -> Outcome:
        body = {"sessionId": _session_id(ctx)}
        try:
            if ctx.input.version == "2":
                answer = ctx.call(Catalogue.build_confirm_payment, request=body)
            else:
                answer = ctx.call(Catalogue.build_finalize_payment, request=BuildSessionRequest(**body))
        except BadRequest:
            # The session is this flow's own: refused because it is already paid ("session is in state
            # PAYMENT_COMPLETE"), an earlier try paid it, one whose claim Redis may have lost in a crash
            # (so no mark says so). Read the session: its payment is this flow's; else the refusal stands.
            state = ctx.call(Catalogue.build_state, request=body)
            if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
                return _finalize_result(ctx, state)
            raise
        return _finalize_result(ctx, answer)


def _adopt_finalize(ctx: StepContext) -> ReconcileResult:
    state = ctx.call(Catalogue.build_state, request={"sessionId": _session_id(ctx)})
    if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
        return _finalize_result(ctx, state)
    return NOT_COMMITTED


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
            timeout=lambda ctx: ctx.input.formSeconds or 360.0,
        ),
        _Finalize("finalize", Catalogue.build_finalize_payment, lambda ctx: Call(), adopt=_adopt_finalize, when=_needs_finalize),
        settle_step("settle", "finalize"),
    ),
    summarize,
    input_order_id,
    "embedded payment form (versions 3 and 2): order, wait for the form, finalize/confirm, outcome",
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
