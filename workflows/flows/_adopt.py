"""Reading the gateway back: which operation is this flow's, and when a fresh order id is safe.

A call whose answer was lost (a timeout, a 5xx, a worker killed, a write Redis lost) may have taken
effect. Before calling again, the step reads the gateway and decides here:

* **Adopt** what the gateway holds, only when it is provably *this flow's*: the operation this step
  made, never simply the order's latest (a later refund or capture on the same order is not the
  payment); on an order this flow holds in the order index (``order:<orderId>`` names it: a live flow's
  order ids, derived ones included, are never another flow's); made after this flow started (an order id
  of a flow that ended long ago may be named again, and the gateway still holds that earlier payment);
  and matching the flow (amount, currency, card). Anything else is someone else's: a person looks,
  nothing is adopted.
* **Call again** only when the gateway shows the call never acted (no order, or the operation still
  where the earlier step left it).
* **A fresh order id** (``<orderId>-2``) for a customer session only when the read proves that the
  first order can never be charged: it holds no payment, final or in progress.

The same reads serve a duplicate answer (``orderId already used``, ``operation already completed``):
``BadRequest.already_done`` sends the step here instead of failing it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from durapay.gateway import (
    FAILURE_RESULTS,
    SUCCESS_RESULTS,
    Catalogue,
    NotFound,
    Operation,
    OperationResult,
    OperationType,
    customer_operation,
)
from durapay.gateway import (
    PAYMENT_TYPES as PAYMENT_TYPE_NAMES,
)
from durapay.tasks.outcomes import Advance, Attention, Finish, NewOrder, Outcome, Poll
from durapay.tasks.runner import NOT_COMMITTED, UNCLEAR, ReconcileResult, StepContext
from durapay.workflows.engine import mask_pan
from durapay.workflows.flows._common import judge_operation, operation_of, read_order
from durapay.workflows.moments import moment_text

#: Operations that take (or verify) the customer's money: what a payment step makes.
PAYMENT_TYPES = frozenset(OperationType(name) for name in PAYMENT_TYPE_NAMES)
#: Results of a payment that succeeded and was reversed afterwards (a void of an authorization).
REVERSED = frozenset({"VOIDED"})
#: Results of a 3-step operation before its payment: nothing charged on it yet.
BEFORE_PAYMENT = frozenset({OperationResult.PENDING, OperationResult.THREEDS_VALIDATED})


def _expected(ctx: StepContext) -> tuple[set[int], str | None, str | None]:
    """(amounts, currency, card number) a payment of this flow carries, from its input."""
    data = ctx.input
    amounts: set[int] = set()
    currency = None
    order = getattr(data, "order", None)
    if order is not None:
        amounts.add(int(order.amount))
        currency = str(order.currency)
    session = getattr(data, "paymentSession", None)
    if session is not None and getattr(session, "amount", None) is not None:
        amounts.add(int(session.amount))
    card = getattr(data, "card", None)
    return amounts, currency, (card.pan if card is not None else None)


def foreign(ctx: StepContext, operation: Operation) -> str | None:
    """Why ``operation`` cannot be this flow's payment, or None when it matches the flow's input."""
    amounts, currency, pan = _expected(ctx)
    verification = operation.operationType is OperationType.CARD_VERIFICATION
    if amounts and operation.operationAmount is not None and not verification and int(operation.operationAmount) not in amounts:
        return f"amount {operation.operationAmount}, this flow pays {'/'.join(str(a) for a in sorted(amounts))}"
    if currency and operation.operationCurrency is not None and str(operation.operationCurrency) != currency:
        return f"currency {operation.operationCurrency}, this flow pays in {currency}"
    masked = (operation.additionalData or {}).get("maskedPan")
    if pan and isinstance(masked, str) and len(masked) >= 10:
        ours = mask_pan(pan)
        if (masked[:6], masked[-4:]) != (ours[:6], ours[-4:]):
            return f"card {masked}, this flow pays with {ours}"
    return None


#: How far the gateway's clock may be ahead of the engine's when judging that a payment was made after
#: the flow started (the gateway writes its time to the millisecond; the two are NTP-synchronised).
CLOCK_SKEW_SECONDS = 60.0


def not_provably_ours(ctx: StepContext, operation: Operation) -> str | None:
    """Why ``operation`` on the flow's current order cannot be proved this flow's, or None when it is."""
    holder = ctx.order_holder(ctx.order_id) if ctx.order_holder is not None else ctx.flow_id
    if holder != ctx.flow_id:
        return f"order {ctx.order_id} is {'flow ' + holder if holder else 'no flow'}'s in the order index"
    made = operation.operationTime.moment if operation.operationTime is not None else None
    if made is None:
        return "the gateway gives no time for it, so it may predate this flow"
    if made.timestamp() < ctx.created - CLOCK_SKEW_SECONDS:
        return f"it was made at {moment_text(operation.operationTime)}, before this flow started"
    return foreign(ctx, operation)


def own_payment(operations: Sequence[Operation]) -> Operation | None:
    """The payment the flow's step made on its own order: the order's first payment operation (the
    flow created the order, so whatever came later, a capture or a refund, came after it)."""
    for operation in operations:
        if operation.operationType in PAYMENT_TYPES:
            return operation
    return None


def page_payment(operations: Sequence[Operation]) -> Operation | None:
    """The outcome of a customer's page (hosted page, link, form) from its order's operations: its first
    successful payment, else its last failed one (a customer may be declined, then pay), else None. Only
    the customer's own: a back-office capture of it is not a second payment (``customer_operation``)."""
    payments = [op for op in operations if op.operationType in PAYMENT_TYPES and customer_operation(op.wire())]
    for operation in payments:
        if operation.operationResult in SUCCESS_RESULTS:
            return operation
    failed = [op for op in payments if op.operationResult in FAILURE_RESULTS]
    return failed[-1] if failed else None


def _adopted(ctx: StepContext, operation: Operation, note: str) -> Outcome:
    """The outcome of a payment found at the gateway, judged as if its answer had arrived (a PENDING
    one advances: the flow's settle step reads it until final)."""
    output = {"operation": operation.wire(), note: True}
    outcome = judge_operation(operation, output, accept=REVERSED)
    return Advance(output) if isinstance(outcome, Poll) else outcome


def _not_ours(ctx: StepContext, operation: Operation, why: str) -> Attention:
    return Attention(
        f"order {ctx.order_id} holds operation {operation.operationId}, which is not this flow's payment ({why})",
        {"type": "ForeignOperation", "orderId": ctx.order_id, "operationId": operation.operationId, "reason": why},
    )


def adopt_order_payment(ctx: StepContext) -> ReconcileResult:
    """For a payment made in one call (MOTO, card verification, wallet, MIT, init of init/pay): read the
    order; no order means the call never acted."""
    found = read_order(ctx)
    if found is None:
        return NOT_COMMITTED
    operation = own_payment(found.operations)
    if operation is None:
        return UNCLEAR
    why = not_provably_ours(ctx, operation)
    if why:
        return _not_ours(ctx, operation, why)
    return _adopted(ctx, operation, "adopted")


def adopt_operation_of(step: str) -> Callable[[StepContext], ReconcileResult]:
    """For the payment call of a multi-step flow (3-step payment, svs pay): the operation keeps the id
    step ``step`` got; still before payment means the call never acted."""

    def adopt(ctx: StepContext) -> ReconcileResult:
        found = operation_of(ctx.output(step)) or {}
        try:
            operation = ctx.call(Catalogue.get_operation, str(found["operationId"]))
        except NotFound:
            return UNCLEAR
        if operation.operationResult in BEFORE_PAYMENT:
            return NOT_COMMITTED
        why = foreign(ctx, operation)
        if why:
            return _not_ours(ctx, operation, why)
        return _adopted(ctx, operation, "adopted")

    return adopt


def new_order_if_never_charged(reason: str, *, initiated: bool = False) -> Callable[[StepContext], ReconcileResult]:
    """For customer sessions (hosted page, embedded form, 3DS initiation) whose create answer was lost.

    The order exists, but the customer never got its page from durapay, so the flow may go on with a
    fresh order id: *only* when the order holds no payment. A successful payment on it (the page was
    used after all, e.g. its URL left durapay before Redis lost the write that recorded it) is the
    flow's money: adopted, the flow succeeds. A failed one ends the flow as the wait would have. One
    in progress means "not yet": read again. ``initiated``: the session's own creation records a
    PENDING operation (3-step init), which is not a payment in progress.
    """

    def adopt(ctx: StepContext) -> ReconcileResult:
        found = read_order(ctx)
        if found is None:
            return NOT_COMMITTED
        payments = [op for op in found.operations if op.operationType in PAYMENT_TYPES]
        outcome = page_payment(payments)
        if outcome is not None and outcome.operationResult in SUCCESS_RESULTS:
            why = not_provably_ours(ctx, outcome)
            if why:
                return _not_ours(ctx, outcome, why)
            return Finish(True, "the gateway already holds this flow's payment", {"operation": outcome.wire()})
        if not initiated and any(op.operationResult in BEFORE_PAYMENT for op in payments):
            return UNCLEAR
        if outcome is not None:
            return _adopted(ctx, outcome, "readBack")
        if any(op.operationResult not in BEFORE_PAYMENT for op in payments):
            return UNCLEAR  # a result this version does not know: read again, then a person
        return NewOrder(reason)

    return adopt


def _made_before(operation: Operation, moment: float) -> bool:
    """Whether the gateway shows ``operation`` made before ``moment`` (no time shown: not known to be)."""
    made = operation.operationTime.moment if operation.operationTime is not None else None
    return made is not None and made.timestamp() < moment


def never_sent(ctx: StepContext) -> bool:
    """Whether no call of the step was sent under its mark of money in flight (its hold recorded and its call
    never sent, or no hold at all under a mark of this release: ``workflows.engine.targets.snapshot_of``): its
    read-back finds nothing of its own, without a read."""
    return ctx.snapshot is not None and ctx.snapshot.before is None


def adopt_made(
    ctx: StepContext,
    operations: Sequence[Operation],
    *,
    types: frozenset[OperationType],
    before: frozenset[str] = frozenset(),
    amount: int | None,
    currency: str | None,
) -> ReconcileResult:
    """For a keyed call that makes an operation on a shared gateway target (a refund or capture of a
    payment's order, a reservation charge) and whose answer was lost: what the call made, read back before
    it is sent again.

    The public material does not say what a repeated ``Idempotency-Key`` does, and durapay itself takes a
    forgotten key as possible (``tasks.runner``: "already used" after a while), so a resend could make the
    operation twice. As for a payment, the read comes first. The call's operation is known by identity,
    never by resemblance (``workflows.engine.targets``): the flow held the target from before the call could be
    sent, and recorded what the target held then (``ctx.snapshot``), so an operation of one of ``types``
    that the snapshot does not list, and that no other flow recorded as its own (its ``op:`` lookup), is
    this call's; amount and currency only exclude (an operation made outside durapay). No call sent under
    the mark: NOT_COMMITTED at once (:func:`never_sent`).

    A call an earlier release sent with no hold (``ctx.snapshot`` None, known from its mark) has no
    snapshot, and nothing on the target says which operation it made: its candidates (of ``types``, not
    among ``before``, what an earlier step read; made after the flow started; of the call's amount, None:
    any, and currency; no other flow's) are never adopted on their own. None: NOT_COMMITTED. Any: a person
    decides (``ForeignOperation``, reason ``legacy``, the candidates listed): their retry takes the one
    listed as the flow's, their cancel takes none (``ctx.decided``: ``operator_actions.decision``).

    None found: NOT_COMMITTED (the call is sent again, with its key). One: adopted, answered as the call
    would have been (its id), and the flow's read step reads it until final. More than one: a person
    looks, nothing is adopted."""
    snapshot = ctx.snapshot
    if never_sent(ctx):
        return NOT_COMMITTED  # held, never sent: nothing at the gateway can be this call's
    known = snapshot.before if snapshot is not None and snapshot.before is not None else before
    made = [
        op
        for op in operations
        if op.operationType in types
        and op.operationId not in known
        and (amount is None or op.operationAmount is None or int(op.operationAmount) == amount)
        and (currency is None or op.operationCurrency is None or str(op.operationCurrency) == currency)
        and (snapshot is not None or not _made_before(op, ctx.created - CLOCK_SKEW_SECONDS))
        and not _another_flows(ctx, op)
    ]
    if snapshot is None:
        return _unheld(ctx, made)
    if not made:
        return NOT_COMMITTED
    if len(made) > 1:
        ids = ", ".join(op.operationId for op in made)
        return Attention(
            f"the gateway holds {len(made)} operations this call may have made ({ids}): which is this flow's is unclear",
            {"type": "ForeignOperation", "operationIds": [op.operationId for op in made], "reason": "ambiguous"},
        )
    return _as_answered(made[0])


def _as_answered(operation: Operation) -> Outcome:
    """As the call answers a post-operation (its id): the money stays in flight until the read step has read
    the operation final, so a cancel asked meanwhile still waits for that read."""
    found = operation.wire()
    return Advance({"operationId": found["operationId"], "operationTime": found.get("operationTime"), "adopted": True})


def _unheld(ctx: StepContext, made: list[Operation]) -> ReconcileResult:
    """The read-back of a call an earlier release sent with no hold on its target: ``made`` are operations it
    may have made, and nothing says which is its own. A person's decision (``ctx.decided``) takes one, or
    none of those they saw; anything else they did not see stops the flow for them."""
    decided = ctx.decided or {}
    chosen = [op for op in made if op.operationId == decided.get("adopt")]
    if chosen:
        return _as_answered(chosen[0])
    refused = decided.get("none")
    left = [op for op in made if not (isinstance(refused, list) and op.operationId in refused)]
    if not left:
        return NOT_COMMITTED
    ids = [str(op.operationId) for op in left]
    return Attention(
        f"an earlier release sent this call before durapay held its gateway target: the gateway holds {len(ids)} "
        f"operation(s) it may have made ({', '.join(ids)}), and nothing says whose each is: a person decides "
        "(docs/operations.md, 'A call an earlier release sent')",
        {"type": "ForeignOperation", "operationIds": ids, "reason": "legacy"},
    )


def _another_flows(ctx: StepContext, operation: Operation) -> bool:
    """Whether another flow recorded ``operation`` as its own (its ``op:`` lookup names that flow)."""
    if ctx.operation_holder is None or not operation.operationId:
        return False
    holder = ctx.operation_holder(str(operation.operationId))
    return holder is not None and holder != ctx.flow_id


__all__ = [
    "adopt_made",
    "adopt_operation_of",
    "adopt_order_payment",
    "foreign",
    "never_sent",
    "new_order_if_never_charged",
    "not_provably_ours",
    "own_payment",
    "page_payment",
]
