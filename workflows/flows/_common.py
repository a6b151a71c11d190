"""Pieces shared by the flow definitions: reading a payment result, reconciling by order or operation,
the summary every flow's outcome carries, and the step that reads a PENDING operation until final.

A payment result is read the same way everywhere: AUTHORIZED or EXECUTED is success; DECLINED,
DENIED_BY_RISK, 3DS failures, CANCELED, FAILED and EXPIRED end the flow ``failed`` with the gateway's
answer kept (and, for declines, the ISO response code and whether it is soft or hard); PENDING means
"look again"; a result this version does not know stops the flow for a person instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durapay.flows import Call, call
from durapay.gateway import (
    FAILURE_RESULTS,
    RESPONSE_CODE_FIELD,
    RESPONSE_CODES,
    SUCCESS_RESULTS,
    Catalogue,
    NotFound,
    Operation,
    OperationResponse,
    OperationResult,
    Unknown,
    decline_kind,
)
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome, Poll
from durapay.tasks.runner import StepContext
from durapay.workflows.engine import CallStep

#: How long to wait between reads of a PENDING operation, and how many reads before a person looks.
POLL_SECONDS = 2.0
MAX_POLLS = 60


def operation_of(output: Mapping[str, Any]) -> dict[str, Any] | None:
    """The operation object in a step output (``{operation: {...}}`` or an operation itself)."""
    inner = output.get("operation")
    if isinstance(inner, dict):
        return inner
    if "operationId" in output and "operationResult" in output:
        return dict(output)
    return None


#: The error type a failed result is reported as.
FAILURE_TYPES = {
    OperationResult.DECLINED: "PaymentDeclined",
    OperationResult.DENIED_BY_RISK: "PaymentDeclined",
    OperationResult.THREEDS_FAILED: "ThreeDSFailed",
    OperationResult.THREEDS_FAILED_ALT: "ThreeDSFailed",
    OperationResult.CANCELED: "Cancelled",
    OperationResult.CANCELLED: "Cancelled",
    OperationResult.EXPIRED: "Expired",
    OperationResult.FAILED: "PaymentFailed",
}


def decline_error(operation: Operation) -> dict[str, Any]:
    """The error a failed payment is recorded with: type, ISO response code, soft or hard decline."""
    code = str((operation.additionalData or {}).get(RESPONSE_CODE_FIELD) or "") or None
    result = operation.operationResult
    return {
        "type": FAILURE_TYPES.get(result, "PaymentFailed") if isinstance(result, OperationResult) else "PaymentFailed",
        "message": f"operation {operation.operationId} ended {operation.operationResult}",
        "operationId": operation.operationId,
        "operationResult": str(operation.operationResult),
        "responseCode": code,
        "responseText": RESPONSE_CODES.get(code or ""),
        "decline": decline_kind(code),
        "retryable": False,
    }


def judge_operation(operation: Operation, output: dict[str, Any], *, accept: frozenset[str] = frozenset()) -> Outcome:
    """The outcome of a payment answer: Advance, Finish(failed), Poll (PENDING) or Attention (unknown)."""
    result = operation.operationResult
    if isinstance(result, Unknown) or result is None:
        return Attention(
            f"operation {operation.operationId} has result {result!r}, which this version does not know",
            {"type": "UnknownResult", "operationId": operation.operationId, "operationResult": str(result)},
        )
    if result in SUCCESS_RESULTS or result.value in accept:
        return Advance(output)
    if result is OperationResult.PENDING:
        return Poll(POLL_SECONDS, note=f"operation {operation.operationId} is PENDING")
    if result in FAILURE_RESULTS:
        error = decline_error(operation)
        text = f" ({error['responseCode']} {error['responseText']})" if error["responseCode"] else ""
        return Finish(False, f"payment {result.value}{text}", output, error)
    return Attention(f"operation {operation.operationId} ended {result.value}, unexpected here")


def payment_result(ctx: StepContext, answer: OperationResponse) -> Outcome:
    """Judge an ``{operation}`` answer; a PENDING one is advanced and read until final by :func:`settle_step`."""
    outcome = judge_operation(answer.operation, answer.wire())
    if isinstance(outcome, Poll):
        return Advance(answer.wire())
    return outcome


def read_until_final(
    name: str,
    source: str,
    *,
    accept: frozenset[str] = frozenset(),
    only_if_pending: bool = False,
    note: str = "",
) -> CallStep:
    """Read ``GET /operations/{id}`` (the operation of step ``source``) until its result is final.

    The one "read until final" step of every flow: a success (or a result in ``accept``, such as
    REFUNDED for a refund) advances, a failure ends the flow ``failed``, PENDING reads again every
    :data:`POLL_SECONDS`, at most :data:`MAX_POLLS` times, then a person looks. With
    ``only_if_pending`` the step runs only when the source's answer was PENDING (a payment answered
    final needs no read)."""

    def operation_id(ctx: StepContext) -> str:
        output = ctx.output(source)
        found = operation_of(output) or output
        return str(found["operationId"])

    def pending(ctx: StepContext) -> bool:
        found = operation_of(ctx.output(source))
        return found is not None and found.get("operationResult") == OperationResult.PENDING.value

    def result(ctx: StepContext, answer: Operation) -> Outcome:
        output: dict[str, Any] = {"operation": answer.wire()}
        if note:
            output[note] = True
        outcome = judge_operation(answer, output, accept=accept)
        if isinstance(outcome, Poll) and ctx.polls >= MAX_POLLS:
            return Attention(f"operation {answer.operationId} still PENDING after {ctx.polls} reads")
        return outcome

    return call(
        name,
        Catalogue.get_operation,
        lambda ctx: Call((operation_id(ctx),)),
        result=result,
        when=pending if only_if_pending else None,
        reads=(source,),
    )


def settle_step(name: str, source: str) -> CallStep:
    """Read the operation of a payment answered PENDING until it is final (skipped when it was final)."""
    return read_until_final(name, source, only_if_pending=True)


def input_order_id(data: Any) -> str:
    """The merchant's ``order.orderId`` of a flow input (a FlowDefinition's ``order_id``)."""
    return str(data.order.orderId)


def order_with_current_id(ctx: StepContext, order: Any) -> dict[str, Any]:
    """The input's order as sent: the flow's current gateway order id replaces the merchant's."""
    data: dict[str, Any] = order.wire()
    data["orderId"] = ctx.order_id or data["orderId"]
    return data


def read_order(ctx: StepContext) -> Any | None:
    """``GET /orders/{orderId}`` for the flow's current order; None when the gateway has no such order."""
    try:
        return ctx.call(Catalogue.get_order, ctx.order_id)
    except NotFound:
        return None


def summarize(data: Any, outputs: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """What happened at the gateway: the last operation (id, type, result, amount) and every id seen."""
    summary: dict[str, Any] = {}
    operations: list[str] = []
    for output in outputs.values():
        found = operation_of(output)
        if found:
            summary["operation"] = {
                key: found.get(key)
                for key in (
                    "operationId",
                    "orderId",
                    "operationType",
                    "operationResult",
                    "operationAmount",
                    "operationCurrency",
                    "paymentCircuit",
                )
            }
            summary["operation"]["responseCode"] = (found.get("additionalData") or {}).get(RESPONSE_CODE_FIELD)
            if found.get("operationId") not in operations:
                operations.append(str(found.get("operationId")))
        elif isinstance(output.get("operationId"), str) and output["operationId"] not in operations:
            operations.append(output["operationId"])
        link = output.get("paymentLink")
        if isinstance(link, dict):
            summary["paymentLink"] = {key: link.get(key) for key in ("linkId", "link", "expirationDate", "status")}
    summary["operationIds"] = operations
    return summary
