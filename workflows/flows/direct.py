"""Payments made in one call: MOTO, card verification, wallet, MIT; and the multi-call server-to-server
flows: three steps (init, 3DS challenge when needed, validation, payment) and init/pay (``/v2/svs``).

Inputs are the gateway's own request bodies. The merchant's ``order.orderId`` is the first gateway
order id; if a create's answer is lost after the gateway made an order the customer can never use,
the flow continues on ``<orderId>-2`` (see ``NewOrder``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from durapay.flows import Call, Flow, call, wait_signal
from durapay.gateway import (
    THREEDS_NOT_NEEDED,
    CaptureType,
    Card,
    CardVerificationRequest,
    Catalogue,
    Exemptions,
    GatewayModel,
    LenientEnum,
    MitRequest,
    MotoRequest,
    NotFound,
    Operation,
    OperationResult,
    Order,
    PassThrough,
    Recurrence,
    ThreeStepsInitResponse,
    ThreeStepsValidationResponse,
    Unknown,
    WalletPayRequest,
)
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome, Wait
from durapay.tasks.runner import NOT_COMMITTED, UNCLEAR, ReconcileResult, StepContext
from durapay.workflows.engine import FlowDefinition
from durapay.workflows.flows._adopt import adopt_operation_of, adopt_order_payment, new_order_if_never_charged
from durapay.workflows.flows._common import (
    input_order_id,
    operation_of,
    order_with_current_id,
    payment_result,
    settle_step,
    summarize,
)


def _with_order(ctx: StepContext) -> dict[str, Any]:
    body: dict[str, Any] = ctx.input.wire()
    body["order"] = order_with_current_id(ctx, ctx.input.order)
    return body


def one_call(kind: str, model: type[GatewayModel], op: Any, description: str) -> FlowDefinition:
    """A payment made by one call, reconciled by reading the order, then read until final if PENDING."""
    pay = call("pay", op, lambda ctx: Call(request=_with_order(ctx)), result=payment_result, adopt=adopt_order_payment)
    return Flow(kind, model, (pay, settle_step("settle", "pay")), summarize, input_order_id, description)


class MotoInput(PassThrough, MotoRequest):
    pass


class CardVerificationInput(PassThrough, CardVerificationRequest):
    pass


class WalletInput(PassThrough, WalletPayRequest):
    pass


class MitInput(PassThrough, MitRequest):
    pass


MOTO = one_call("moto", MotoInput, Catalogue.create_moto_order, "mail-order/telephone-order payment")
CARD_VERIFICATION = one_call(
    "card_verification", CardVerificationInput, Catalogue.card_verification, "card verification (no charge)"
)
WALLET = one_call("wallet", WalletInput, Catalogue.wallet_pay, "wallet payment")
MIT = one_call("mit", MitInput, Catalogue.create_mit_order, "merchant-initiated payment on a contract")


# -- three steps -----------------------------------------------------------------------------------


class ThreeStepsInput(PassThrough):
    order: Order
    card: Card
    recurrence: Recurrence | None = None
    exemptions: Annotated[Exemptions | Unknown | None, LenientEnum(Exemptions)] = None
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None
    challengeTimeoutSeconds: float | None = Field(default=None, gt=0, description="durapay: 3DS wait deadline")


def _challenge_needed(ctx: StepContext) -> bool:
    init = ctx.output("init")
    request = init.get("threeDSAuthRequest")
    return bool(init) and bool(request) and request != THREEDS_NOT_NEEDED


def _init_result(ctx: StepContext, answer: ThreeStepsInitResponse) -> Outcome:
    result = answer.operation.operationResult
    if result is OperationResult.PENDING or result is OperationResult.THREEDS_VALIDATED:
        return Advance(answer.wire())
    return payment_result(ctx, answer)  # type: ignore[arg-type]


def _operation_id(ctx: StepContext) -> str:
    found = operation_of(ctx.output("init")) or {}
    return str(found["operationId"])


def _challenge_signal(ctx: StepContext, name: str, payload: dict[str, Any]) -> Outcome:
    """The customer's challenge answer. One that names another operation (``paymentId``: a first challenge
    of this flow, before a lost init answer moved it to a new order) is not this challenge's: dropped."""
    named = payload.get("paymentId")
    if named and str(named) != _operation_id(ctx):
        return Wait(("3ds_result",), ctx.wait_deadline or ctx.now, note=f"a 3ds_result for operation {named} dropped")
    response = payload.get("threeDSAuthResponse") or payload.get("PaRes")
    if not response:
        return Finish(False, "the 3DS result carried no threeDSAuthResponse (PaRes)")
    return Advance({"threeDSAuthResponse": str(response)})


def _challenge_deadline(ctx: StepContext) -> Outcome:
    """At the deadline, read the operation: a failed challenge is reported; no answer means expired.

    An operation validated without durapay's validation (no ``3ds_result`` came) is not paid: a read
    carries none of the 3DS data the payment sends (:func:`_without_auth_data`)."""
    operation = ctx.call(Catalogue.get_operation, _operation_id(ctx))
    if operation.operationResult is OperationResult.THREEDS_VALIDATED:
        return _without_auth_data(operation, "the gateway shows the challenge validated at the deadline, without a 3ds_result")
    if operation.operationResult in {OperationResult.THREEDS_FAILED, OperationResult.THREEDS_FAILED_ALT}:
        return Finish(False, "3DS authentication failed", {"operation": operation.wire()}, {"type": "ThreeDSFailed"})
    return Finish(False, "the customer did not complete the 3DS challenge in time", error={"type": "ChallengeExpired"})


def _without_auth_data(operation: Operation, why: str) -> Attention:
    """A validated operation whose 3DS data durapay does not hold: stop for a person rather than pay.

    The payment of a challenged operation sends the validation's ``threeDSAuthResult``
    (``authenticationValue``, ``eci``, ``xid``) as ``threeDSAuthData``; only the validation's own answer
    carries it: ``GET /operations/{id}`` does not, and no public material says the gateway answers a
    second validation of a validated operation (the simulator refuses it). A payment without it may not
    be the authenticated payment the customer approved, so none is sent: no money moved, and the
    customer authenticates again in a new flow."""
    return Attention(
        f"{why}; operation {operation.operationId} is THREEDS_VALIDATED but durapay has no threeDSAuthResult to "
        "send with its payment, so it was not paid: cancel this flow (no money moved) and start a new one",
        {"type": "ThreeDSDataLost", "operationId": operation.operationId, "operationResult": str(operation.operationResult)},
    )


def _validation_result(ctx: StepContext, answer: ThreeStepsValidationResponse) -> Outcome:
    if answer.operation.operationResult is OperationResult.THREEDS_VALIDATED:
        if answer.threeDSAuthResult is None:
            return _without_auth_data(answer.operation, "the validation answered without threeDSAuthResult")
        return Advance(answer.wire())
    return Finish(
        False,
        f"3DS validation ended {answer.operation.operationResult}",
        answer.wire(),
        {"type": "ThreeDSFailed", "operationId": answer.operation.operationId},
    )


def _adopt_validation(ctx: StepContext) -> ReconcileResult:
    """A validation whose answer was lost: still PENDING means it never acted (validate again); a failed
    one ends the flow; a validated one cannot be paid, as its answer held the 3DS data (issue 22)."""
    try:
        operation = ctx.call(Catalogue.get_operation, _operation_id(ctx))
    except NotFound:
        return UNCLEAR
    if operation.operationResult is OperationResult.PENDING:
        return NOT_COMMITTED
    if operation.operationResult is OperationResult.THREEDS_VALIDATED:
        return _without_auth_data(operation, "the validation's answer was lost and a read of the gateway replaced it")
    return _validation_result(ctx, ThreeStepsValidationResponse(operation=operation))


def _payment_request(ctx: StepContext) -> Call:
    body: dict[str, Any] = {
        "operationId": _operation_id(ctx),
        "order": order_with_current_id(ctx, ctx.input.order),
        "card": ctx.input.card.wire(),
    }
    for name in ("recurrence", "exemptions", "captureType"):
        value = getattr(ctx.input, name)
        if value is not None:
            body[name] = value.wire() if isinstance(value, GatewayModel) else str(value)
    result = ctx.output("validation").get("threeDSAuthResult")
    if isinstance(result, dict):
        body["threeDSAuthData"] = {key: result.get(key) for key in ("authenticationValue", "eci", "xid")}
    return Call(request=body)


def _three_steps_init(ctx: StepContext) -> Call:
    body = _with_order(ctx)
    for name in ("captureType", "challengeTimeoutSeconds"):
        body.pop(name, None)
    return Call(request=body)


def _challenge_url(output: dict[str, Any]) -> str | None:
    request = output.get("threeDSAuthRequest")
    url = output.get("threeDSAuthUrl")
    return str(url) if url and request and request != THREEDS_NOT_NEEDED else None


THREE_STEPS = Flow(
    "three_steps",
    ThreeStepsInput,
    (
        call(
            "init",
            Catalogue.three_steps_init,
            _three_steps_init,
            result=_init_result,
            adopt=new_order_if_never_charged("the 3DS initiation answer was lost", initiated=True),
            customer_url=_challenge_url,
        ),
        wait_signal(
            "challenge",
            ("3ds_result",),
            _challenge_signal,
            _challenge_deadline,
            timeout=lambda ctx: ctx.input.challengeTimeoutSeconds or 600.0,
            when=_challenge_needed,
        ),
        call(
            "validation",
            Catalogue.three_steps_validation,
            lambda ctx: Call(
                request={
                    "operationId": _operation_id(ctx),
                    "threeDSAuthResponse": ctx.output("challenge")["threeDSAuthResponse"],
                }
            ),
            result=_validation_result,
            adopt=_adopt_validation,
            when=lambda ctx: _challenge_needed(ctx) and bool(ctx.output("challenge").get("threeDSAuthResponse")),
        ),
        call(
            "payment",
            Catalogue.three_steps_payment,
            _payment_request,
            result=payment_result,
            adopt=adopt_operation_of("init"),
        ),
        settle_step("settle", "payment"),
    ),
    summarize,
    input_order_id,
    "server-to-server card payment: init, 3DS challenge when needed, validation, payment",
)


# -- init / pay (/v2/svs) --------------------------------------------------------------------------


class SvsInput(PassThrough):
    order: Order
    card: Card
    recurrence: Recurrence | None = None
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None


def _svs_pay(ctx: StepContext) -> Call:
    found = operation_of(ctx.output("init")) or {}
    body: dict[str, Any] = {}
    if ctx.input.captureType is not None:
        body["captureType"] = str(ctx.input.captureType)
    return Call((str(found["operationId"]),), body)


SVS = Flow(
    "svs",
    SvsInput,
    (
        call(
            "init",
            Catalogue.svs_init_order,
            lambda ctx: Call(request=_with_order(ctx)),
            result=lambda ctx, answer: Advance(answer.wire()),
            adopt=adopt_order_payment,  # the initiated (PENDING) operation is all "pay" needs
        ),
        call("pay", Catalogue.svs_pay_operation, _svs_pay, result=payment_result, adopt=adopt_operation_of("init")),
        settle_step("settle", "pay"),
    ),
    summarize,
    input_order_id,
    "init/pay server-to-server flow on /v2/svs",
)
