"""Post-operations on an existing payment: refund, capture, cancel of a capture; contract deactivation.

Refunds and captures carry the step's Idempotency-Key, so a lost answer is simply asked again (the
gateway replays it). Their answer is only ``{operationId, operationTime}``: the flow then reads
``GET /operations/{operationId}`` until the result is final. A cancel takes no key: after a lost answer
the flow looks for a CANCEL operation on the capture's order before sending again.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway import Amount as AmountField
from gateway import Catalogue, Currency, GatewayModel, NotFound, OperationType, PassThrough
from tasks.outcomes import Advance
from tasks.runner import NOT_COMMITTED, UNCLEAR, ReconcileResult, StepContext
from workflows.flows._common import read_until_final, summarize
from workflows.steps import Call, CallStep, FlowDefinition


class PostOperationInput(PassThrough):
    """Refund or capture of ``operationId``: omit amount and currency for the full amount."""

    operationId: str = Field(min_length=1)
    amount: AmountField | None = None
    currency: Currency | None = None
    description: str | None = Field(default=None, max_length=255)


class CancelCaptureInput(GatewayModel):
    operationId: str = Field(min_length=1, description="the CAPTURE operation to cancel")
    description: str | None = Field(default=None, max_length=255)


class ContractInput(GatewayModel):
    contractId: str = Field(min_length=1, max_length=255)


def _post_body(ctx: StepContext) -> Call:
    body = {key: value for key, value in ctx.input.wire().items() if key != "operationId"}
    return Call((ctx.input.operationId,), body)


def _result_step() -> CallStep:
    """Read the post-operation's own operation until its result is final."""
    return read_until_final("result", "post", accept=frozenset({"REFUNDED", "VOIDED", "CANCELED"}))


def post_operation(kind: str, op: Any, description: str) -> FlowDefinition:
    return FlowDefinition(
        kind,
        PostOperationInput,
        (CallStep("post", op, _post_body), _result_step()),
        summarize,
        None,
        description,
    )


REFUND = post_operation("refund", Catalogue.refund_operation, "refund (or void, before capture) an operation")
CAPTURE = post_operation("capture", Catalogue.capture_operation, "capture an authorized operation")


def _adopt_cancel(ctx: StepContext) -> ReconcileResult:
    """A CANCEL operation whose cancelledOperationId is our capture means the cancel was made."""
    try:
        capture = ctx.call(Catalogue.get_operation, ctx.input.operationId)
        order = ctx.call(Catalogue.get_order, str(capture.orderId))
    except NotFound:
        return UNCLEAR
    for operation in order.operations:
        if operation.operationType is OperationType.CANCEL and operation.cancelledOperationId == ctx.input.operationId:
            return Advance({"operationId": operation.operationId, "operationTime": operation.operationTime})
    return NOT_COMMITTED


CANCEL_CAPTURE = FlowDefinition(
    "cancel_capture",
    CancelCaptureInput,
    (CallStep("post", Catalogue.cancel_operation, _post_body, adopt=_adopt_cancel), _result_step()),
    summarize,
    None,
    "cancel a capture (same day only)",
)

DEACTIVATE_CONTRACT = FlowDefinition(
    "deactivate_contract",
    ContractInput,
    (
        CallStep(
            "deactivate",
            Catalogue.deactivate_contract,
            lambda ctx: Call((ctx.input.contractId,)),
            result=lambda ctx, answer: Advance({"contractId": ctx.input.contractId, "deactivated": True}),
        ),
    ),
    summarize,
    None,
    "deactivate a recurring contract",
)
