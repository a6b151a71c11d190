"""Captures, refunds, cancels, the allowed actions, and the order amounts they move.

The rules (docs/gateway.md, Post-operations, with the gateway's error codes):

* capture: once, on an ``AUTHORIZED`` authorization, at most the authorized amount (default all of it);
  PS0022 after a void, PS0023 when already captured (or on a capture), PS0024 after a refund.
* refund: on a captured payment (or its capture), at most what is captured and not yet refunded
  (PS0029), PS0027 when nothing is left, PS0028 after a void. On an authorization that is not
  captured it acts as a void: a ``VOID`` / ``VOIDED`` operation, the authorization becomes ``VOIDED``.
* cancel: only a capture (``CAPTURE`` / ``EXECUTED``), only on the day it was made (PS0002, by the
  simulator's clock), not after a refund (PS0027). The capture becomes ``CANCELED``; an explicit
  authorization can then be captured again, an implicit payment is rolled back entirely.

A post-operation that a ``pend`` rule holds is recorded ``PENDING`` and moves no money until it settles
(``_pending``); the checks above ran against the pool as it was, so settling checks again (:func:`fits`)
and a post-operation that no longer fits (a second capture, a refund beyond what is left) ends ``FAILED``.

Order amounts are net: ``authorizedAmount`` leaves out voided and cancelled payments,
``capturedAmount`` is captured minus refunded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durapay.gateway import Channel, OperationResult, OperationType, PostOperationRequest, parse_gateway_time
from durapay.simulator._clock import gateway_day
from durapay.simulator._payments import SUCCESS, new_operation
from durapay.simulator._protocol import Origin, SimError
from durapay.simulator._records import OperationRecord, OrderRecord
from durapay.simulator._state import SimulatorState

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

CAPTURE, REFUND, VOID, CANCEL = (
    t.value for t in (OperationType.CAPTURE, OperationType.REFUND, OperationType.VOID, OperationType.CANCEL)
)
AUTHORIZED, EXECUTED = OperationResult.AUTHORIZED.value, OperationResult.EXECUTED.value


def pool_of(state: SimulatorState, op: OperationRecord) -> OperationRecord | None:
    """The payment whose money ``op`` moves: itself, or the payment a capture/refund points at."""
    if op.pool:
        return op
    return state.operations.get(op.parent_id) if op.parent_id else None


def order_details(state: SimulatorState, order: OrderRecord) -> dict[str, Any]:
    """``OrderDetails``: the order, its net authorized and captured amounts, its last operation."""
    authorized = captured = 0
    last: OperationRecord | None = None
    for operation_id in order.operation_ids:
        op = state.operations[operation_id]
        if last is None or parse_gateway_time(op.time) >= parse_gateway_time(last.time):
            last = op
        if op.pool and not op.voided:
            authorized += op.authorized
            captured += op.captured - op.refunded
    return {
        "order": order.info(),
        "authorizedAmount": str(authorized),
        "capturedAmount": str(captured),
        "lastOperationType": last.operation_type if last else None,
        "lastOperationTime": last.time if last else None,
    }


def _operation(state: SimulatorState, operation_id: str) -> OperationRecord:
    op = state.operations.get(operation_id)
    if op is None:
        raise SimError.not_found()
    return op


def _check_currency(request: PostOperationRequest, pool: OperationRecord) -> None:
    if request.currency is not None and request.currency != pool.currency:
        raise SimError.rejected("PS0009", f"{request.currency} is not the operation's currency {pool.currency}")


def _post_operation(
    sim: Simulator, pool: OperationRecord, origin: Origin, kind: str, result: str, amount: int, **fields: Any
) -> OperationRecord:
    """Record a post-operation on ``pool`` and move its money, or leave it ``PENDING`` when a ``pend`` rule
    holds the request (:func:`move` then runs when it settles, if :func:`fits` still holds)."""
    order = sim.state.orders[pool.order_id]
    rule = sim.pending.take(origin.name)
    op = new_operation(
        sim,
        order,
        origin,
        operation_type=kind,
        result=OperationResult.PENDING.value if rule else result,
        amount=amount,
        channel=Channel.BACKOFFICE.value,
        parent_id=pool.operation_id,
        pan=pool.pan,
        expiry=pool.expiry,
        **fields,
    )
    if rule is None:
        move(sim, op, origin)
    else:
        sim.pending.hold(op, rule, origin, success_result=result)
    return op


def move(sim: Simulator, op: OperationRecord, origin: Origin) -> None:
    """The money a capture, void, refund or cancel ``op`` moves on its payment's pool."""
    state = sim.state
    pool = state.operations[op.parent_id or ""]
    if op.operation_type == CAPTURE:
        pool.captured = op.amount
    elif op.operation_type == VOID:
        pool.voided = True
        pool.result = OperationResult.VOIDED.value
        pool.steps.append(origin.step(pool.result))
    elif op.operation_type == REFUND:
        pool.refunded += op.amount
    elif op.operation_type == CANCEL:
        cancelled = state.operations[op.cancelled_operation_id or ""]
        cancelled.result = OperationResult.CANCELED.value
        cancelled.steps.append(origin.step(cancelled.result))
        pool.captured = 0
        if cancelled is pool:
            pool.authorized = 0


def fits(sim: Simulator, op: OperationRecord) -> bool:
    """Whether :func:`move` still may run for a post-operation that was PENDING (the pool may have changed since)."""
    operations = sim.state.operations
    pool = operations.get(op.parent_id or "")
    if pool is None or pool.voided:
        return False
    if op.operation_type == CAPTURE:
        return pool.result == AUTHORIZED and not pool.captured and not pool.refunded and op.amount <= pool.authorized
    if op.operation_type == VOID:
        return pool.result == AUTHORIZED and not pool.captured
    if op.operation_type == REFUND:
        return 0 < op.amount <= pool.captured - pool.refunded
    cancelled = operations.get(op.cancelled_operation_id or "")
    return op.operation_type == CANCEL and cancelled is not None and cancelled.result == EXECUTED and not pool.refunded


def capture(sim: Simulator, origin: Origin, operation_id: str, request: PostOperationRequest) -> OperationRecord:
    op = _operation(sim.state, operation_id)
    if not op.pool:
        raise SimError.rejected("PS0023", f"operation {operation_id} is a {op.operation_type}")
    if op.voided:
        raise SimError.rejected("PS0022")
    if op.refunded:
        raise SimError.rejected("PS0024")
    if op.result == EXECUTED or op.captured:
        raise SimError.rejected("PS0023")
    if op.result != AUTHORIZED:
        raise SimError.invalid("operationId", f"operation is {op.result}: nothing to capture")
    _check_currency(request, op)
    amount = op.authorized if request.amount is None else request.amount
    if not 0 < amount <= op.authorized:
        raise SimError.invalid("amount", f"must be between 1 and the authorized amount {op.authorized}")
    return _post_operation(sim, op, origin, CAPTURE, EXECUTED, amount)


def refund(sim: Simulator, origin: Origin, operation_id: str, request: PostOperationRequest) -> OperationRecord:
    op = _operation(sim.state, operation_id)
    pool = pool_of(sim.state, op)
    if pool is None or op.operation_type in (REFUND, VOID, CANCEL):
        raise SimError.invalid("operationId", f"a {op.operation_type} operation cannot be refunded")
    if pool.voided:
        raise SimError.rejected("PS0028")
    if pool.result not in SUCCESS or op.result not in SUCCESS:
        raise SimError.invalid("operationId", f"operation is {op.result}: nothing to refund")
    _check_currency(request, pool)
    if not pool.captured:
        # A refund of an authorization that is not captured is a void of the whole authorization.
        if request.amount is not None and request.amount > pool.authorized:
            raise SimError.rejected("PS0029", f"{request.amount} > authorized {pool.authorized}")
        return _post_operation(sim, pool, origin, VOID, OperationResult.VOIDED.value, pool.authorized)
    remaining = pool.captured - pool.refunded
    if remaining <= 0:
        raise SimError.rejected("PS0027")
    amount = remaining if request.amount is None else request.amount
    if amount <= 0:
        raise SimError.invalid("amount", "must be at least 1")
    if amount > remaining:
        raise SimError.rejected("PS0029", f"{amount} > refundable {remaining}")
    return _post_operation(sim, pool, origin, REFUND, OperationResult.REFUNDED.value, amount)


def cancel(sim: Simulator, origin: Origin, operation_id: str) -> OperationRecord:
    op = _operation(sim.state, operation_id)
    if op.operation_type != CAPTURE or op.result != EXECUTED:
        raise SimError.invalid("operationId", f"only an executed capture can be cancelled, not {op.operation_type}/{op.result}")
    if not _same_day(sim, op):
        raise SimError.rejected("PS0002")
    pool = pool_of(sim.state, op)
    if pool is None:
        raise SimError.invalid("operationId", "capture without a payment")
    if pool.refunded:
        raise SimError.rejected("PS0027", "refund the capture instead")
    return _post_operation(sim, pool, origin, CANCEL, EXECUTED, op.amount, cancelled_operation_id=op.operation_id)


def _same_day(sim: Simulator, op: OperationRecord) -> bool:
    """The gateway's day (UTC+01:00), by the simulator's clock."""
    return gateway_day(parse_gateway_time(op.time)) == gateway_day(sim.state.clock.now())


def allowed_actions(sim: Simulator, op: OperationRecord) -> list[dict[str, Any]]:
    """What may be done to ``op`` now, with the accepted amount range."""
    actions: list[dict[str, Any]] = []

    def add(kind: str, low: int, high: int) -> None:
        actions.append({"actionType": kind, "minAmount": str(low), "maxAmount": str(high), "currency": op.currency})

    pool = pool_of(sim.state, op)
    if pool is None or pool.voided or op.operation_type in (REFUND, VOID, CANCEL) or op.result not in SUCCESS:
        return actions
    if op.pool and op.result == AUTHORIZED and not op.captured:
        add(CAPTURE, 1, op.authorized)
        add(REFUND, op.authorized, op.authorized)
        return actions
    remaining = pool.captured - pool.refunded
    if remaining > 0:
        add(REFUND, 1, remaining)
    if op.operation_type == CAPTURE and op.result == EXECUTED and not pool.refunded and _same_day(sim, op):
        add(CANCEL, op.amount, op.amount)
    return actions
