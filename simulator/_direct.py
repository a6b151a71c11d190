"""The hosted payment page and the one-call payments: MOTO, MIT, card verification, wallet.

Hosted page: ``POST /orders/hpp`` answers ``hostedPage = {root}/_sim/hpp/{orderId}``, a simulator page
on which the customer pays once or cancels (``admin.complete_hpp`` does it over HTTP); the outcome is
recorded on the order and notified. A ``page_payment`` rule (``_pending``) makes the payment ``PENDING``:
the page is used until it settles (a second payment is refused, 409), and both results are notified.

MIT charges the card of an active contract (PS0017 for an unknown or deactivated one) that allows it
(``_contracts.check_mit_charge``: never a CIT contract, an MIT_SCHEDULED one at its frequency). Card
verification answers ``CARD_VERIFICATION`` / ``EXECUTED`` for amount 0. None of these flows runs 3DS, so
a 3DS-failing or challenge card simply approves there.

Wallet: ``walletPaymentData`` picks the outcome: ``{"outcome": "116"}`` (any outcome token, see
``_cards``) wins; else ``{"pan": "..."}`` applies the card rule to that number; else it approves.
``walletPaymentData.wallet`` names the circuit (default ``GOOGLE_PAY``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import quote

from durapay.gateway import (
    CardVerificationRequest,
    Channel,
    HppOrderRequest,
    MitRequest,
    MotoRequest,
    OperationResult,
    OperationType,
    RecurrenceAction,
    WalletPayRequest,
)
from durapay.simulator._cards import OUTCOME_APPROVED, outcome_from_token
from durapay.simulator._clock import parse_iso
from durapay.simulator._config import AUTO_COMPLETE_PAN
from durapay.simulator._contracts import check_mit_charge
from durapay.simulator._payments import (
    abandon_on_page,
    check_recurrence,
    check_session,
    claim_order,
    decide,
    ensure_new_order,
    is_explicit,
    new_operation,
    page_payment_in_progress,
    pay_on_page,
    settle,
    verify,
)
from durapay.simulator._protocol import Call, Handler, Origin, Reply, SimError, ok
from durapay.simulator._records import OperationRecord, OrderRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

PENDING = OperationResult.PENDING.value
AUTHORIZATION = OperationType.AUTHORIZATION.value


def create_hpp_order(sim: Simulator, call: Call) -> Reply:
    body = call.body(HppOrderRequest)
    ensure_new_order(sim, body.order)
    session = body.paymentSession
    check_session(body.order, session)
    check_recurrence(sim, session.recurrence, "paymentSession.recurrence")
    order = claim_order(
        sim,
        call,
        body.order,
        "hpp",
        session=session.wire(),
        session_amount=session.amount,
        action_type=str(session.actionType),
        capture_explicit=is_explicit(session.captureType),
        recurrence=session.recurrence.wire() if session.recurrence else None,
        notification_url=session.notificationUrl,
        result_url=session.resultUrl,
        cancel_url=session.cancelUrl,
        page_open=True,
    )
    token = sim.state.new_token()
    order.security_tokens.append(token)
    order_id = order.order_id
    sim.auto_complete(lambda: auto_complete_hpp(sim, order_id))
    return ok({"hostedPage": f"{call.root_url}/_sim/hpp/{quote(order_id, safe='')}", "securityToken": token})


#: How long a hosted page can be paid: public material gives no lifetime (docs/gateway.md), so the
#: simulator picks one; then the order gets an ``EXPIRED`` operation and its notification, as a form's
#: session does after its 5 minutes (a payment PENDING on the page holds it open until it settles).
HOSTED_PAGE_LIFETIME = timedelta(days=1)
PAGE_EXPIRY_ORIGIN = Origin("hpp_expiry", "/_sim/clock")


def refresh_page(sim: Simulator, order: OrderRecord) -> None:
    """Expire ``order``'s hosted page if it outlived :data:`HOSTED_PAGE_LIFETIME` unpaid."""
    if order.kind != "hpp" or not order.page_open or page_payment_in_progress(sim, order) is not None:
        return
    if sim.clock.now() > parse_iso(order.created_at) + HOSTED_PAGE_LIFETIME:
        abandon_on_page(sim, order, PAGE_EXPIRY_ORIGIN, result=OperationResult.EXPIRED.value)
        sim.state.dirty = True


def expire_pages(sim: Simulator) -> None:
    for order in list(sim.state.orders.values()):
        refresh_page(sim, order)


def pay_hpp(sim: Simulator, order_id: str, origin: Origin, *, pan: str, expiry: str, cancel: bool) -> OperationRecord:
    """The customer's action on the hosted page (also the auto-completion)."""
    order = sim.state.orders.get(order_id)
    if order is None or order.kind != "hpp":
        raise SimError(404, None, f"no hosted page for order {order_id}")
    refresh_page(sim, order)
    held = page_payment_in_progress(sim, order)
    if held is not None:
        raise SimError(409, None, f"the hosted page of order {order_id} is in use: payment {held.operation_id} is PENDING")
    if not order.page_open:
        raise SimError(409, None, f"the hosted page of order {order_id} is already completed")
    if cancel:
        return abandon_on_page(sim, order, origin, result=OperationResult.CANCELED.value)
    return pay_on_page(sim, order, origin, pan=pan, expiry=expiry)


def auto_complete_hpp(sim: Simulator, order_id: str) -> None:
    with sim.state.lock:
        order = sim.state.orders.get(order_id)
        if order is not None and order.page_open:
            pay_hpp(
                sim,
                order_id,
                Origin("auto_complete", f"/_sim/hpp/{order_id}"),
                pan=AUTO_COMPLETE_PAN,
                expiry="1230",
                cancel=False,
            )
            sim.state.dirty = True


def create_moto_order(sim: Simulator, call: Call) -> Reply:
    body = call.body(MotoRequest)
    ensure_new_order(sim, body.order)
    order = claim_order(sim, call, body.order, "moto", capture_explicit=is_explicit(body.captureType))
    op = new_operation(
        sim,
        order,
        call.origin,
        operation_type=AUTHORIZATION,
        result=PENDING,
        amount=order.amount,
        channel=Channel.BACKOFFICE.value,
        pan=body.card.pan,
        expiry=body.card.expiryDate,
        capture_explicit=order.capture_explicit,
    )
    settle(sim, op, order, decide(sim, body.card.pan, contract_id=None, with_3ds=False, origin=call.origin), call.origin)
    return ok({"operation": op.wire()})


def create_mit_order(sim: Simulator, call: Call) -> Reply:
    body = call.body(MitRequest)
    ensure_new_order(sim, body.order)
    contract = sim.state.contracts.get(body.contractId)
    if contract is None or contract.internal:
        raise SimError.rejected("PS0017", f"no contract {body.contractId}")
    if contract.status != "ACTIVE":
        raise SimError.rejected("PS0017", f"contract {body.contractId} is deactivated")
    check_mit_charge(sim, contract)
    recurrence = {"action": RecurrenceAction.SUBSEQUENT_PAYMENT.value, "contractId": contract.contract_id}
    order = claim_order(sim, call, body.order, "mit", recurrence=recurrence, capture_explicit=is_explicit(body.captureType))
    op = new_operation(
        sim,
        order,
        call.origin,
        operation_type=AUTHORIZATION,
        result=PENDING,
        amount=order.amount,
        channel=Channel.BACKOFFICE.value,
        pan=contract.pan,
        expiry=contract.expiry,
        capture_explicit=order.capture_explicit,
        recurrence=recurrence,
    )
    outcome = decide(sim, contract.pan, contract_id=contract.contract_id, with_3ds=False, origin=call.origin)
    settle(sim, op, order, outcome, call.origin)
    return ok({"operation": op.wire()})


def card_verification(sim: Simulator, call: Call) -> Reply:
    body = call.body(CardVerificationRequest)
    ensure_new_order(sim, body.order)
    order = claim_order(sim, call, body.order, "card_verification")
    outcome = decide(sim, body.card.pan, contract_id=None, with_3ds=False, origin=call.origin)
    rule = sim.pending.take(call.origin.name)
    op = verify(sim, order, call.origin, outcome, rule=rule, pan=body.card.pan, expiry=body.card.expiryDate)
    return ok({"operation": op.wire()})


def wallet_pay(sim: Simulator, call: Call) -> Reply:
    body = call.body(WalletPayRequest)
    ensure_new_order(sim, body.order)
    data = body.walletPaymentData
    session = body.paymentSession
    if session is not None:
        check_session(body.order, session)
        check_recurrence(sim, session.recurrence, "paymentSession.recurrence")
    hint, pan = data.get("outcome"), data.get("pan")
    if pan is not None and not (isinstance(pan, str) and (pan.isascii() and pan.isdigit()) and 13 <= len(pan) <= 19):
        raise SimError.invalid("walletPaymentData.pan", "must be 13 to 19 digits")
    try:
        outcome = outcome_from_token(str(hint)) if hint is not None else None
    except ValueError as exc:
        raise SimError.invalid("walletPaymentData.outcome", str(exc)) from None
    card = pan or AUTO_COMPLETE_PAN
    recurrence = session.recurrence.wire() if session and session.recurrence else None
    explicit = is_explicit(body.captureType or (session.captureType if session else None))
    order = claim_order(sim, call, body.order, "wallet", recurrence=recurrence, capture_explicit=explicit)
    op = new_operation(
        sim,
        order,
        call.origin,
        operation_type=AUTHORIZATION,
        result=PENDING,
        amount=session.amount if session else order.amount,
        pan=card,
        expiry="1230",
        capture_explicit=explicit,
        recurrence=recurrence,
    )
    op.payment_method, op.circuit = "APM", str(data.get("wallet") or "GOOGLE_PAY")
    if outcome is None:
        outcome = decide(sim, pan, contract_id=None, with_3ds=False, origin=call.origin) if pan else OUTCOME_APPROVED
    settle(sim, op, order, outcome, call.origin)
    return ok({"operation": op.wire()})


HANDLERS: dict[str, Handler] = {
    "create_hpp_order": create_hpp_order,
    "create_moto_order": create_moto_order,
    "create_mit_order": create_mit_order,
    "card_verification": card_verification,
    "wallet_pay": wallet_pay,
}
