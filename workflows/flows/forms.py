"""The embedded payment form (build, versions 3 and 2) and its cancel: the order, a wait for the customer
on the form, finalize (version 3) or confirm (version 2), the customer's own step after it (version 2's
3DS after a confirm; an APM page or a 3DS step found when a finalize is refused), and the outcome. Only
the gateway says what was paid: ``form_completed`` from the merchant's page proves nothing,
``GET /build/state`` and verified notifications do. A wait on the form ends on the one rule of
``workflows.flows.waits``; a customer still at work on the form (:func:`_at_work`) keeps the flow waiting
at whichever step finds it; a cancel, or durapay's own deadline on a form the customer has not started,
closes the session (``/build/cancel``) first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from pydantic import Field

from durapay.flows import Call, Flow, call, wait_signal
from durapay.gateway import (
    BadRequest,
    BuildOrderRequest,
    BuildSessionRequest,
    BuildState,
    BuildStateResponse,
    Catalogue,
    GatewayModel,
    NotFound,
    OperationResponse,
    OperationResult,
    PassThrough,
)
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome, Wait
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from durapay.workflows.flows._adopt import new_order_if_never_charged
from durapay.workflows.flows._common import (
    input_order_id,
    judge_operation,
    payment_result,
    settle_step,
    summarize,
)
from durapay.workflows.flows.sessions import session_body
from durapay.workflows.flows.waits import (
    CLOSED,
    GRACE_SECONDS,
    READ_AT_DEADLINE,
    began,
    notified,
    read_later,
)

# -- embedded form (build) ---------------------------------------------------------------------------


class BuildInput(PassThrough, BuildOrderRequest):
    version: str | None = Field(default="3", pattern=r"^[23]$", description="form version: 3 (default) or 2")
    formSeconds: float | None = Field(default=None, gt=0, description="durapay: how long to wait for the form")


def _session_id(ctx: StepContext) -> str:
    return str(ctx.output("create")["sessionId"])


def _form_signal(ctx: StepContext, name: str, payload: dict[str, Any]) -> Outcome:
    """``form_completed`` comes from the merchant's page and proves nothing about money: its payload is
    dropped, the form's state is read, and unless the customer is still at work there (:func:`_at_work`:
    the wait goes on) the flow goes on to finalize, which asks the gateway. Only a verified notification
    (or ``GET /build/state``) may say the payment already happened."""
    if name == "form_completed":
        return _at_work(ctx, _form_state(ctx)) or Advance({"formCompleted": True})
    return notified(ctx, name, payload, _form_read)


def _form_read(ctx: StepContext, outcome: Outcome | None) -> Outcome:
    return outcome if outcome is not None else _session_outcome(ctx, ready=None, close=False)


#: Form states durapay may close (``/build/cancel``) at its own deadline or on a cancel: nothing paid yet.
CLOSABLE = {BuildState.PAYMENT_METHOD_SELECTION, BuildState.CARD_DATA_COLLECTION, BuildState.READY_FOR_PAYMENT}

#: Form states in which the customer is still at work on the gateway's side (a 3DS step, an APM page):
#: the session is open, whatever durapay's own deadline says or the merchant's page signals.
CUSTOMER_AT_WORK = {BuildState.GDI_VERIFICATION, BuildState.REDIRECTED_TO_EXTERNAL_DOMAIN}


def _form_state(ctx: StepContext) -> BuildStateResponse:
    return ctx.call(Catalogue.build_state, request={"sessionId": _session_id(ctx)})


def _at_work(ctx: StepContext, state: BuildStateResponse) -> Outcome | None:
    """The one rule for a form whose customer is still at work on it (None: they are not): the session
    is theirs, neither durapay's to close nor a reason to fail, so the flow waits for the notification and
    reads again at a bounded pace until the session's own end (then a person looks). The form's waits
    apply it to every read (deadline, ``form_completed``, a notification that was not a success, a
    cancel's read); finalize, refused or read back while the customer is at work, hands the form to the
    ``challenge`` wait (:func:`_awaiting_customer`), which reads it by this rule."""
    if state.state not in CUSTOMER_AT_WORK:
        return None
    return read_later(
        ctx, ("notification",), _form_ends(ctx) + GRACE_SECONDS,
        f"the customer is still at work on the form ({state.state})", {"type": "FormOpen", "state": str(state.state)},
    )  # fmt: skip


def _session_outcome(ctx: StepContext, *, ready: Outcome | None, close: bool = True) -> Outcome:
    """The one rule for the end of a wait (``workflows.flows.waits``), on the form's session: its payment
    (paid, declined, cancelled, expired: the session is over), the customer still at work (read again at
    a bounded pace until the session's own end), ``ready`` when it is ready for payment; else (nothing
    entered yet) the flow's own deadline closes it (``/build/cancel``) and reads again. Without
    ``close`` (a notification that was not a success) nothing is closed: the wait goes on."""
    state = _form_state(ctx)
    if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
        outcome = judge_operation(state.operation, {"operation": state.operation.wire(), READ_AT_DEADLINE: True})
        if isinstance(outcome, Finish) and not outcome.succeeded:
            return Finish(False, outcome.reason, {**outcome.output, CLOSED: str(state.state)}, outcome.error)
        if not isinstance(outcome, Advance | Finish):  # PENDING: a payment still running
            return read_later(
                ctx, ("notification",), _form_ends(ctx) + GRACE_SECONDS,
                f"payment {state.operation.operationId} is still PENDING",
                {"type": "PaymentPending", "operationId": state.operation.operationId, "orderId": state.operation.orderId},
            )  # fmt: skip
        return outcome
    at_work = _at_work(ctx, state)
    if at_work is not None:
        return at_work
    if state.state is BuildState.READY_FOR_PAYMENT and ready is not None:
        return ready
    if state.state not in CLOSABLE:  # a state this version does not know (or none): never closed on a guess
        what = f"the form is in state {state.state}, which this version does not follow"
        return read_later(ctx, ("notification",), _form_ends(ctx) + GRACE_SECONDS, what, {"type": "FormStateUnknown"})
    if not close:
        return Wait(("form_completed", "notification"), ctx.wait_deadline or ctx.now)
    _close_form(ctx)
    closed = _form_state(ctx)
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
    """The form's last moment by its first terms, counted from the wait's start (``waits.began``)."""
    return began(ctx) + (ctx.input.formSeconds or FORM_SECONDS) + SESSION_SECONDS


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
        return _awaiting_customer(answer)
    return Attention(
        f"the form answered state {answer.state} without an operation, which this version does not follow",
        {"type": "UnknownFormState", "state": str(answer.state)},
    )


def _needs_finalize(ctx: StepContext) -> bool:
    """Finalize unless the gateway itself (notification or state read) already reported the operation."""
    return "operation" not in ctx.output("form")


def _awaiting_customer(state: BuildStateResponse) -> Advance:
    """Finalize is done with a form whose next move is the customer's: the ``challenge`` wait follows it
    (reads it by the one rule, :func:`_at_work`; closes it on a cancel). Never a failure while they may pay."""
    return Advance({**state.wire(), "awaitingCustomer": True})


def _awaits_customer(ctx: StepContext) -> bool:
    return bool(ctx.output("finalize").get("awaitingCustomer"))


def _challenge_deadline(ctx: StepContext) -> Outcome:
    return _session_outcome(ctx, ready=None)


def _finalize(ctx: StepContext, send: Callable[[StepContext], Outcome]) -> Outcome:
    """Version 3 finalizes (``finalize_payment``); version 2 confirms (``confirm_payment``)."""
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
        # customer is at work on it (an APM page, a 3DS step; or a state this version does not
        # follow): the form is theirs, the challenge wait follows it. Refused because the customer
        # never got that far (a form_completed from the page that proves nothing): the flow cannot
        # pay, so it closes the form and ends on what the gateway then shows (the one rule).
        state = _form_state(ctx)
        if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
            return _finalize_result(ctx, state)
        if state.state not in CLOSABLE:
            return _awaiting_customer(state)
        ended = _session_outcome(ctx, ready=None)
        if isinstance(ended, Finish) and not ended.succeeded:
            why = f"the gateway refused the {'confirm' if ctx.input.version == '2' else 'finalize'} ({refused})"
            return Finish(False, f"{why}; the form (state {state.state}) was closed", ended.output, ended.error)
        return ended
    return _finalize_result(ctx, answer)


def _adopt_finalize(ctx: StepContext) -> ReconcileResult:
    """What an earlier finalize or confirm did, read back before a resend, or before a cancel or an owed
    failure ends the flow (``tasks.runner.settle``): paid, its payment; ``READY_FOR_PAYMENT``, it never
    acted and only durapay can pay that form (sent again, or nothing moved); any other state is the
    customer's move (at work on an APM page or a 3DS step, a version 2 confirm's among them; or a form
    not yet filled, where they may still choose an APM): the ``challenge`` wait follows it, closing it
    first on a cancel (``WaitStep.close``), which a money step's read cannot do."""
    state = _form_state(ctx)
    if state.state is BuildState.PAYMENT_COMPLETE and state.operation is not None:
        return _finalize_result(ctx, state)
    if state.state is BuildState.READY_FOR_PAYMENT:
        return NOT_COMMITTED
    return _awaiting_customer(state)


#: durapay's default wait for the form, and the gateway's session life (5 minutes; docs/gateway.md).
FORM_SECONDS = 360.0
SESSION_SECONDS = 300.0

BUILD = Flow(
    "build",
    BuildInput,
    (
        call(
            "create",
            Catalogue.create_build_order,
            lambda ctx: Call(request=session_body(ctx, ("formSeconds",))),
            adopt=new_order_if_never_charged("the embedded form answer was lost before the customer saw it"),
            customer_url=lambda output: next((f.get("src") for f in output.get("fields") or [] if f.get("src")), None),
        ),
        wait_signal(
            "form",
            ("form_completed", "notification"),
            _form_signal,
            _form_deadline,
            timeout=lambda ctx: ctx.input.formSeconds or FORM_SECONDS,
            close=_close_form,
            on_settle=_challenge_deadline,  # never on to finalize: a cancel or a failure owed only reads
        ),
        call(
            "finalize",
            Catalogue.build_finalize_payment,
            lambda ctx: Call(),
            adopt=_adopt_finalize,
            when=_needs_finalize,
            body=_finalize,
        ),
        wait_signal(
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


BUILD_CANCEL = Flow(
    "build_cancel",
    BuildRef,
    (
        call(
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
