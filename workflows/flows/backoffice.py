"""Post-operations on an existing payment: refund, capture, cancel of a capture; contract deactivation.

Refunds and captures carry the step's Idempotency-Key, but a lost answer is read back before they are
sent again, as a payment is (``workflows.flows._adopt.adopt_made``: durapay does not count on the gateway
remembering a key). Each acts on its payment's gateway order, a target it shares with every other
refund, capture or cancel of that payment (``workflows.engine.targets``): the step holds the order from before
its call can be sent until the gateway names the call's operation, so that a read-back has one candidate;
another flow's call on the order waits meanwhile. Their answer is only ``{operationId, operationTime}``: the flow then reads
``GET /operations/{operationId}`` until the result is final, and each kind succeeds only with its own
results (:data:`SUCCEEDS_WITH`). A cancel takes no key: after a lost answer the flow looks for a CANCEL
operation on the capture's order before sending again.

Before a refund is sent, the operation and its order are read (one gateway read when a flow of durapay
recorded the operation, whose answer named its order; else two): a refund of an authorization that is not
captured voids all of it (docs/gateway.md), so a partial amount there is refused, naming ``amount``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from durapay.flows import Call, Flow, Target, call
from durapay.gateway import (
    SUCCESS_RESULTS,
    Catalogue,
    Currency,
    GatewayModel,
    NotFound,
    Operation,
    OperationResult,
    OperationType,
    PassThrough,
)
from durapay.gateway import Amount as AmountField
from durapay.tasks.outcomes import Advance, Finish, Outcome
from durapay.tasks.runner import NOT_COMMITTED, UNCLEAR, ReconcileResult, StepContext
from durapay.workflows.engine import CallStep, FlowDefinition
from durapay.workflows.flows._adopt import adopt_made, never_sent
from durapay.workflows.flows._common import read_until_final, summarize


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


#: The results each post-operation succeeds with, besides AUTHORIZED and EXECUTED (a capture or a cancel
#: read back CANCELED or VOIDED did not do what was asked; a refund of an authorization not captured is
#: its void: VOIDED).
SUCCEEDS_WITH = {
    "refund": frozenset({OperationResult.REFUNDED.value, OperationResult.VOIDED.value}),
    "capture": frozenset[str](),
    "cancel_capture": frozenset[str](),
}
#: The operations each keyed post-operation makes on the payment's order (what a read back looks for).
MAKES = {
    "refund": frozenset({OperationType.REFUND, OperationType.VOID}),
    "capture": frozenset({OperationType.CAPTURE}),
}


def _post_body(ctx: StepContext) -> Call:
    body = {key: value for key, value in ctx.input.wire().items() if key != "operationId"}
    return Call((ctx.input.operationId,), body)


def _payment_order(ctx: StepContext) -> str:
    """The gateway order of the payment a post-operation acts on: the target it holds. Known without a read
    when a flow of durapay's recorded the operation (its answer named the order); else the operation is
    read (kept for the step's own check), the only way the gateway names an operation's order."""
    known = ctx.operation_order(ctx.input.operationId) if ctx.operation_order is not None else None
    if known:
        return known
    operation = ctx.call(Catalogue.get_operation, ctx.input.operationId)
    ctx.target_read = {"operation": operation}
    return str(operation.orderId or ctx.input.operationId)


def _order_operations(ctx: StepContext, order_id: str) -> list[str]:
    """The operations the payment's order holds now: the snapshot a read-back of the call judges by; the
    operation acted on is among them (its type, result and amount, for the step's own check), so a target
    named without a read still costs one read in all."""
    order = ctx.call(Catalogue.get_order, order_id)
    read = dict(ctx.target_read or {})
    if "operation" not in read:
        found = [op for op in order.operations if op.operationId == ctx.input.operationId]
        if not found:  # the order durapay recorded does not hold it: the gateway's word, not ours, names it
            raise RuntimeError(f"order {order_id} does not show operation {ctx.input.operationId}, recorded on it")
        read["operation"] = found[0]
    ctx.target_read = {**read, "order": order}
    return [str(op.operationId) for op in order.operations]


#: A post-operation's target: its payment's gateway order.
PAYMENT_ORDER = Target(_payment_order, _order_operations, "the payment's order")


def _post(ctx: StepContext, send: Callable[[StepContext], Outcome]) -> Outcome:
    """A refund or capture; a refund of part of an amount is checked against the operation and its order as
    read with the order held (``workflows.engine.targets``), right before the call."""
    if ctx.kind == "refund" and ctx.input.amount is not None:
        read = ctx.target_read or {}
        operation = read.get("operation") or ctx.call(Catalogue.get_operation, ctx.input.operationId)
        order = read.get("order")
        if order is None and operation.orderId:
            order = ctx.call(Catalogue.get_order, str(operation.orderId))
        refused = _part_of_authorization(ctx, operation, list(order.operations) if order is not None else [])
        if refused is not None:
            return refused
    return send(ctx)


def _part_of_authorization(ctx: StepContext, operation: Operation, operations: list[Operation]) -> Finish | None:
    """A refund of part of an authorization that is not captured: the gateway voids the authorization
    whole (docs/gateway.md), so it would report more refunded than asked. Refused before it is sent."""
    authorized = (
        operation.operationType is OperationType.AUTHORIZATION and operation.operationResult is OperationResult.AUTHORIZED
    )
    captured = any(op.operationType is OperationType.CAPTURE and op.operationResult in SUCCESS_RESULTS for op in operations)
    whole = int(operation.operationAmount or 0)
    if not authorized or captured or ctx.input.amount == whole:
        return None
    reason = (
        f"{ctx.input.amount} is part of operation {operation.operationId}, an authorization of {whole} not captured: the "
        "gateway voids it whole; omit amount to void it, or capture it first and then refund part"
    )
    return Finish(False, f"amount: {reason}", error={"type": "InputError", "field": "amount", "reason": reason})


def _adopt_post(ctx: StepContext) -> ReconcileResult:
    """A refund or capture whose answer was lost: read the payment's order (the target the step holds)
    before sending again; the call's operation is the one its snapshot did not list (``adopt_made``)."""
    if never_sent(ctx):
        return NOT_COMMITTED
    order = _held_order(ctx)
    if order is None:
        return UNCLEAR
    amount = None if ctx.input.amount is None else int(ctx.input.amount)
    return adopt_made(ctx, order.operations, types=MAKES[ctx.kind], amount=amount, currency=ctx.input.currency)


def _held_order(ctx: StepContext) -> Any | None:
    """The payment's order as the gateway shows it now (None: not found): the target the step holds, named
    by its snapshot; for a call an earlier release sent with no hold, named by the operation's read."""
    try:
        order_id = ctx.snapshot.target if ctx.snapshot is not None and ctx.snapshot.target else None
        if order_id is None:
            order_id = str(ctx.call(Catalogue.get_operation, ctx.input.operationId).orderId)
        return ctx.call(Catalogue.get_order, order_id)
    except NotFound:
        return None


def _result_step(kind: str) -> CallStep:
    """Read the post-operation's own operation until its result is final."""
    return read_until_final("result", "post", accept=SUCCEEDS_WITH[kind])


def post_operation(kind: str, op: Any, description: str) -> FlowDefinition:
    return Flow(
        kind,
        PostOperationInput,
        (call("post", op, _post_body, adopt=_adopt_post, target=PAYMENT_ORDER, body=_post), _result_step(kind)),
        summarize,
        None,
        description,
    )


REFUND = post_operation("refund", Catalogue.refund_operation, "refund (or void, before capture) an operation")
CAPTURE = post_operation("capture", Catalogue.capture_operation, "capture an authorized operation")


def _adopt_cancel(ctx: StepContext) -> ReconcileResult:
    """A cancel of the capture whose answer was lost: a CANCEL operation of our capture (its
    ``cancelledOperationId``) that the snapshot did not list is the one the call made (``adopt_made``)."""
    if never_sent(ctx):
        return NOT_COMMITTED
    order = _held_order(ctx)
    if order is None:
        return UNCLEAR
    ours = [op for op in order.operations if op.cancelledOperationId == ctx.input.operationId]
    return adopt_made(ctx, ours, types=frozenset({OperationType.CANCEL}), amount=None, currency=None)


CANCEL_CAPTURE = Flow(
    "cancel_capture",
    CancelCaptureInput,
    (
        call("post", Catalogue.cancel_operation, _post_body, adopt=_adopt_cancel, target=PAYMENT_ORDER),
        _result_step("cancel_capture"),
    ),
    summarize,
    None,
    "cancel a capture (same day only)",
)

DEACTIVATE_CONTRACT = Flow(
    "deactivate_contract",
    ContractInput,
    (
        call(
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
