"""The payment core shared by every flow: claim an order, decide a card's outcome, record the operation.

Every way of paying (hosted page, link, build, three steps, init/pay, MOTO, MIT, wallet, reservation
charges) ends in :func:`settle`: approved with implicit capture (the default) is a ``CAPTURE`` /
``EXECUTED`` operation, with explicit capture an ``AUTHORIZATION`` / ``AUTHORIZED`` one; refusals keep
``AUTHORIZATION`` with ``DECLINED``, ``DENIED_BY_RISK``, ``THREEDS_FAILED`` or ``FAILED``. The ISO response
code goes in ``additionalData.responseCode``. An approved payment whose recurrence says
``CONTRACT_CREATION`` stores the contract that later MIT payments charge.

A payment the customer makes on a page (hosted page, link, the build's APM page or its version 2 3DS
step, and their auto-completion) is what a ``pend`` rule named :data:`PAGE_PAYMENT` holds ``PENDING``
(``_pending``); the merchant's own build steps keep their catalogue names.

All functions here run under the state's lock (the HTTP pipeline and the page handlers hold it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durapay.gateway import (
    ActionType,
    CaptureType,
    Channel,
    ContractType,
    OperationResult,
    OperationType,
    Order,
    PaymentSession,
    Recurrence,
    RecurrenceAction,
)
from durapay.simulator._cards import Outcome, card_outcome, circuit, outcome_from_token
from durapay.simulator._contracts import check_contract_terms
from durapay.simulator._protocol import Call, Origin, SimError
from durapay.simulator._records import ContractRecord, LinkRecord, OperationRecord, OrderRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator
    from durapay.simulator._pending import PendRule

#: Results of an operation that moved (or holds) money.
SUCCESS = frozenset({OperationResult.AUTHORIZED.value, OperationResult.EXECUTED.value})
PENDING = OperationResult.PENDING.value
#: The ``pend`` rule name of the payments a customer makes on a page (not a catalogue operation).
PAGE_PAYMENT = "page_payment"


def ensure_new_order(sim: Simulator, order: Order) -> None:
    """The ``orderId`` checks of every request that creates an order, before any other check: at most
    ``order_id_max_length`` characters (the live gateway's limit is 18 or 27, docs/gateway.md), and a
    second use refused, so that a resent create always answers PS0026 on ``order.orderId`` (the engine
    reads ``GET /orders/{orderId}`` on it)."""
    limit = sim.config.order_id_max_length
    if len(order.orderId) > limit:
        raise SimError.invalid("order.orderId", f"String should have at most {limit} characters")
    if order.orderId in sim.state.orders:
        raise SimError.invalid("order.orderId", "orderId already used")


def claim_order(sim: Simulator, call: Call, order: Order, kind: str, **fields: Any) -> OrderRecord:
    """Create the order (refused if its ``orderId`` is taken)."""
    state = sim.state
    ensure_new_order(sim, order)
    record = OrderRecord(
        order_id=order.orderId,
        order=order.wire(),
        amount=order.amount,
        currency=order.currency,
        created_at=state.now_iso(),
        kind=kind,
        created_by=call.op.name,
        **fields,
    )
    state.orders[order.orderId] = record
    return record


def check_session(order: Order, session: PaymentSession) -> None:
    if session.amount > order.amount:
        raise SimError.rejected("PS0007", f"{session.amount} > {order.amount}")


def check_recurrence(sim: Simulator, recurrence: Recurrence | None, field: str) -> None:
    """CONTRACT_CREATION needs a new contractId; SUBSEQUENT_PAYMENT an active contract; a
    ``contractFrequency`` is a number of days (``_contracts``)."""
    if recurrence is None or recurrence.action in (None, RecurrenceAction.NO_RECURRING):
        return
    check_contract_terms(recurrence, field)
    contract_id = recurrence.contractId
    if not contract_id:
        raise SimError.invalid(f"{field}.contractId", f"required with action {recurrence.action}")
    existing = sim.state.contracts.get(contract_id)
    if recurrence.action == RecurrenceAction.CONTRACT_CREATION and existing is not None:
        raise SimError.rejected("PS0017", f"contract {contract_id} already exists")
    if recurrence.action == RecurrenceAction.SUBSEQUENT_PAYMENT and (existing is None or existing.status != "ACTIVE"):
        raise SimError.rejected("PS0017", f"no active contract {contract_id}")


def is_explicit(capture_type: object) -> bool:
    """EXPLICIT asks for an authorization only; IMPLICIT or nothing (the terminal default) captures."""
    return capture_type == CaptureType.EXPLICIT


def new_operation(
    sim: Simulator,
    order: OrderRecord,
    origin: Origin,
    *,
    operation_type: str,
    result: str,
    amount: int,
    channel: str = Channel.ECOMMERCE.value,
    pan: str | None = None,
    expiry: str | None = None,
    **fields: Any,
) -> OperationRecord:
    """Record a new operation on ``order`` (inspection sees who made it, with which key)."""
    record = OperationRecord(
        operation_id=sim.state.new_operation_id(),
        order_id=order.order_id,
        operation_type=operation_type,
        result=result,
        amount=amount,
        currency=order.currency,
        time=sim.state.now_gateway(),
        channel=channel,
        created_by=origin.name,
        path=origin.path,
        idempotency_key=origin.idempotency_key,
        circuit=circuit(pan) if pan else None,
        pan=pan,
        expiry=expiry,
        customer_info=order.order.get("customerInfo"),
        **fields,
    )
    record.steps.append(origin.step(result))
    sim.state.operations[record.operation_id] = record
    order.operation_ids.append(record.operation_id)
    return record


def decide(sim: Simulator, pan: str | None, *, contract_id: str | None, with_3ds: bool, origin: Origin | None = None) -> Outcome:
    """A scripted outcome (contract first, then card) if one is queued, else the card rule.

    A request that a ``pend`` rule will hold (``origin``) takes the rule's final outcome instead and
    leaves the scripts alone.
    """
    held = sim.pending.peek(origin.name) if origin is not None else None
    if held is not None:
        return held
    scripted = sim.state.scripts.take(contract_id=contract_id, pan=pan)
    if scripted is not None:
        return scripted
    return card_outcome(pan or "0", with_3ds=with_3ds)


def settle(sim: Simulator, op: OperationRecord, order: OrderRecord, outcome: Outcome, origin: Origin) -> None:
    """Give a payment operation its final result and money pool; create the contract it asks for.

    A request that a ``pend`` rule holds leaves the operation ``PENDING`` instead: :func:`complete` runs
    when it settles (``_pending``), and no money moves before.
    """
    rule = sim.pending.take(origin.name)
    if rule is None:
        complete(sim, op, order, outcome, origin)
    else:
        sim.pending.hold(op, rule, origin)


def complete(sim: Simulator, op: OperationRecord, order: OrderRecord, outcome: Outcome, origin: Origin) -> None:
    """The final result of a payment (with its money pool) or of a card verification (no money)."""
    op.response_code = outcome.response_code
    if op.operation_type == OperationType.CARD_VERIFICATION.value:
        op.result = (outcome.failure or OperationResult.EXECUTED).value
    else:
        op.pool = True
        if outcome.failure is not None:
            op.operation_type = OperationType.AUTHORIZATION.value
            op.result = outcome.failure.value
        elif op.capture_explicit:
            op.operation_type = OperationType.AUTHORIZATION.value
            op.result = OperationResult.AUTHORIZED.value
            op.authorized = op.amount
        else:
            op.operation_type = OperationType.CAPTURE.value
            op.result = OperationResult.EXECUTED.value
            op.authorized = op.captured = op.amount
    op.time = sim.state.now_gateway()
    op.steps.append(origin.step(op.result))
    if outcome.approved:
        create_contract(sim, op, order)


def verify(
    sim: Simulator,
    order: OrderRecord,
    origin: Origin,
    outcome: Outcome,
    *,
    rule: PendRule | None,
    pan: str,
    expiry: str,
    **fields: Any,
) -> OperationRecord:
    """A card verification (amount 0, no money): final at once, or ``PENDING`` when ``rule`` (a ``pend``
    rule taken for its request) holds it."""
    op = new_operation(
        sim,
        order,
        origin,
        operation_type=OperationType.CARD_VERIFICATION.value,
        result=OperationResult.PENDING.value if rule else (outcome.failure or OperationResult.EXECUTED).value,
        amount=0,
        pan=pan,
        expiry=expiry,
        response_code=None if rule else outcome.response_code,
        **fields,
    )
    if rule is not None:
        sim.pending.hold(op, rule, origin)
    elif outcome.approved:
        create_contract(sim, op, order)
    return op


def create_contract(sim: Simulator, op: OperationRecord, order: OrderRecord, *, internal_id: str | None = None) -> None:
    recurrence = op.recurrence or {}
    if internal_id is None and recurrence.get("action") != RecurrenceAction.CONTRACT_CREATION.value:
        return
    contract_id = internal_id or str(recurrence.get("contractId"))
    if not op.pan or contract_id in sim.state.contracts:
        return
    sim.state.contracts[contract_id] = ContractRecord(
        contract_id=contract_id,
        contract_type=str(recurrence.get("contractType") or ContractType.MIT_UNSCHEDULED.value),
        customer_id=order.order.get("customerId"),
        pan=op.pan,
        expiry=op.expiry or "1299",
        created_by_operation_id=op.operation_id,
        contract_expiry_date=recurrence.get("contractExpiryDate"),
        contract_frequency=recurrence.get("contractFrequency"),
        internal=internal_id is not None,
    )


def pay_on_page(
    sim: Simulator,
    order: OrderRecord,
    origin: Origin,
    *,
    pan: str,
    expiry: str,
    link: LinkRecord | None = None,
    forced: Outcome | None = None,
    pend_as: str = PAGE_PAYMENT,
) -> OperationRecord:
    """The customer paid on a simulator page (hosted page, link, build form): one attempt, final unless a
    ``pend`` rule named ``pend_as`` holds it: :data:`PAGE_PAYMENT` for a customer's action, the catalogue
    name for the merchant's build steps (finalize, confirm).

    ``forced`` replaces the card's outcome (a customer failing the 3DS challenge of a build form); such a
    payment is final at once, whatever the rules.
    """
    recurrence = order.recurrence or {}
    contract_id = recurrence.get("contractId")
    service = (order.session or {}).get("paymentService")
    apm = service not in (None, "CARDS")
    rule = sim.pending.take(pend_as) if forced is None else None
    if forced is not None:
        outcome = forced
    elif rule is not None:
        outcome = outcome_from_token(rule.request.final)  # the scripts and the card rule stay for the next
    else:
        outcome = decide(sim, pan, contract_id=contract_id, with_3ds=True)
    if order.action_type == ActionType.VERIFY.value:
        op = verify(
            sim,
            order,
            origin,
            outcome,
            rule=rule,
            pan=pan,
            expiry=expiry,
            recurrence=order.recurrence,
            payment_link_id=link.link_id if link else None,
        )
    else:
        op = new_operation(
            sim,
            order,
            origin,
            operation_type=OperationType.AUTHORIZATION.value,
            result=PENDING,
            amount=order.session_amount or order.amount,
            pan=pan,
            expiry=expiry,
            capture_explicit=order.capture_explicit,
            recurrence=order.recurrence,
            payment_link_id=link.link_id if link else None,
        )
        if apm:
            op.payment_method, op.circuit = "APM", str(service)
        if rule is None:
            complete(sim, op, order, outcome, origin)
        else:
            sim.pending.hold(op, rule, origin)
    finish_page(sim, order, op, link)
    return op


def page_payment_in_progress(sim: Simulator, order: OrderRecord, link: LinkRecord | None = None) -> OperationRecord | None:
    """The customer's page payment on ``order`` (on ``link``, if given) still ``PENDING``, if any."""
    for operation_id in order.operation_ids:
        held = sim.state.pending.get(operation_id)
        if held is not None and held.operation == PAGE_PAYMENT:
            op = sim.state.operations[operation_id]
            if link is None or op.payment_link_id == link.link_id:
                return op
    return None


def reservation_contract_id(reservation_id: str) -> str:
    return f"reservation:{reservation_id}"


def abandon_on_page(
    sim: Simulator, order: OrderRecord, origin: Origin, *, result: str, link: LinkRecord | None = None
) -> OperationRecord:
    """The customer cancelled, or the page/link/session expired: a final operation without money."""
    op = new_operation(
        sim,
        order,
        origin,
        operation_type=OperationType.AUTHORIZATION.value,
        result=result,
        amount=order.session_amount or order.amount,
        payment_link_id=link.link_id if link else None,
    )
    finish_page(sim, order, op, link)
    return op


def finish_page(sim: Simulator, order: OrderRecord, op: OperationRecord, link: LinkRecord | None) -> None:
    """What ``op``'s result does to the page that made it, and its notification: at once, and again when a
    ``PENDING`` page payment settles (``_pending``).

    The page is used (a hosted page closes; a build session is complete with the operation). A link is
    ``PAID`` by a success, ``EXPIRED`` or ``FAILED`` by any other end, and stays ``ACTIVE`` while the
    payment is ``PENDING`` (in use: not payable, cancellable nor expiring until it settles).
    """
    order.page_open = False
    if order.reservation_id and op.result in SUCCESS:
        # The reservation's first payment keeps the card for later charges (not exposed as a contract).
        create_contract(sim, op, order, internal_id=reservation_contract_id(order.reservation_id))
    token = order.security_tokens[-1] if order.security_tokens else ""
    if link is not None:
        token = link.security_token
        if op.result in SUCCESS:
            link.status, link.paid_by_operation_id = "PAID", op.operation_id
        elif op.result == OperationResult.EXPIRED.value:
            link.status = "EXPIRED"
        elif op.result != PENDING and link.status == "ACTIVE":
            link.status = "FAILED"
    sim.notify(order, op, token)
