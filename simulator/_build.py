"""The embedded payment form (build): sessions, their states, versions 1, 2 and 3, and their expiry.

A session starts in ``CARD_DATA_COLLECTION`` (``paymentService: CARDS``), ``PAYMENT_METHOD_SELECTION``
(no service) or ``REDIRECTED_TO_EXTERNAL_DOMAIN`` (an APM: its ``url`` is a simulator page that pays).
The customer fills the form (``{root}/_sim/build/{sessionId}``, or ``admin.fill_build_form``):

* version 1: the challenge happens inside the form → ``READY_FOR_PAYMENT``; the merchant calls
  ``finalize_payment`` → ``PAYMENT_COMPLETE`` with the operation.
* version 3: a challenge card first goes to ``GDI_VERIFICATION`` (the customer completes the GDI page,
  ``/_sim/build/{sessionId}/gdi``), then ``READY_FOR_PAYMENT``; ``finalize_payment`` as in version 1.
* version 2: ``READY_FOR_PAYMENT``; the merchant calls ``confirm_payment`` (which may change the amount):
  frictionless → ``PAYMENT_COMPLETE``; challenge → ``GDI_VERIFICATION`` with a ``fieldSet`` holding the GDI
  field; when the customer completes it the payment runs → ``PAYMENT_COMPLETE``. No ``finalize_payment``.

A session lives 5 minutes by the simulator's clock; then (or after ``cancel``) it reads
``PAYMENT_COMPLETE`` with an ``EXPIRED`` (or ``CANCEL``/``CANCELED``) operation, and the order's
notification says so. Calling a merchant step in the wrong state or version answers 400 PS0026.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from durapay.gateway import (
    BuildConfirmRequest,
    BuildOrderRequest,
    BuildSessionQuery,
    BuildSessionRequest,
    BuildState,
    Exemptions,
    OperationResult,
    OperationType,
)
from durapay.simulator._cards import THREEDS_FAILURE, card_profile, circuit
from durapay.simulator._clock import iso, parse_iso
from durapay.simulator._config import AUTO_COMPLETE_PAN
from durapay.simulator._payments import (
    PAGE_PAYMENT,
    abandon_on_page,
    check_recurrence,
    check_session,
    claim_order,
    ensure_new_order,
    is_explicit,
    pay_on_page,
)
from durapay.simulator._protocol import Call, Handler, Origin, Reply, SimError, ok
from durapay.simulator._records import BuildSessionRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

SESSION_LIFETIME = timedelta(minutes=5)
EXPIRY_ORIGIN = Origin("build_expiry", "/_sim/clock")
CARD_FIELDS = ("CARD_NUMBER", "EXPIRATION_DATE", "SECURITY_CODE", "CARDHOLDER_NAME")
S = BuildState


def _field(session: BuildSessionRecord, field_id: str, kind: str = "TEXT", klass: str = "CARD") -> dict[str, Any]:
    src = f"{session.root_url}/_sim/build/{session.session_id}/field?id={field_id}"
    return {"type": kind, "class": klass, "id": field_id, "src": src}


def _check_merchant_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise SimError(400, "GW0001", "Invalid merchant URL: scheme and host only, no path")


def create_build_order(sim: Simulator, call: Call) -> Reply:
    body = call.body(BuildOrderRequest)
    ensure_new_order(sim, body.order)
    session_body = body.paymentSession
    _check_merchant_url(body.merchantUrl)
    check_session(body.order, session_body)
    check_recurrence(sim, session_body.recurrence, "paymentSession.recurrence")
    order = claim_order(
        sim,
        call,
        body.order,
        "build",
        session=session_body.wire(),
        session_amount=session_body.amount,
        action_type=str(session_body.actionType),
        capture_explicit=is_explicit(session_body.captureType),
        recurrence=session_body.recurrence.wire() if session_body.recurrence else None,
        notification_url=session_body.notificationUrl,
        result_url=session_body.resultUrl,
        cancel_url=session_body.cancelUrl,
        page_open=True,
    )
    token = sim.state.new_token()
    order.security_tokens.append(token)
    created = sim.clock.now()
    service = session_body.paymentService
    state = S.CARD_DATA_COLLECTION if service == "CARDS" else S.PAYMENT_METHOD_SELECTION
    if service not in (None, "CARDS"):
        state = S.REDIRECTED_TO_EXTERNAL_DOMAIN
    session = BuildSessionRecord(
        session_id=sim.state.new_id("S"),
        order_id=order.order_id,
        version=body.version or "1",
        state=state.value,
        created_at=iso(created),
        expires_at=iso(created + SESSION_LIFETIME),
        security_token=token,
        merchant_url=body.merchantUrl,
        root_url=call.root_url,
        payment_service=service,
        challenge=session_body.exemptions == Exemptions.CHALLENGE_REQUESTED,
    )
    sim.state.build_sessions[session.session_id] = session
    sim.auto_complete(lambda: auto_fill(sim, session.session_id))
    answer: dict[str, Any] = {"sessionId": session.session_id, "securityToken": token, "state": session.state}
    if state == S.REDIRECTED_TO_EXTERNAL_DOMAIN:
        answer["url"] = f"{call.root_url}/_sim/build/{session.session_id}"
        answer["fields"] = []
    else:
        fields = [_field(session, "PAY_WITH_CARD", "ACTION")] if state == S.PAYMENT_METHOD_SELECTION else []
        answer["fields"] = fields + [_field(session, field_id) for field_id in CARD_FIELDS]
    return ok(answer)


def find_session(sim: Simulator, session_id: str) -> BuildSessionRecord:
    session = sim.state.build_sessions.get(session_id)
    if session is None:
        raise SimError.not_found()
    refresh(sim, session)
    sim.pending.settle_due()
    return session


def _expired(sim: Simulator, session: BuildSessionRecord) -> bool:
    return sim.clock.now() > parse_iso(session.expires_at)


def refresh(sim: Simulator, session: BuildSessionRecord) -> None:
    """End a session that outlived its 5 minutes with an ``EXPIRED`` operation."""
    if not session.finished and _expired(sim, session):
        op = abandon_on_page(sim, sim.state.orders[session.order_id], EXPIRY_ORIGIN, result=OperationResult.EXPIRED.value)
        _complete(session, op.operation_id)
        sim.state.dirty = True


def expire_due(sim: Simulator) -> None:
    for session in list(sim.state.build_sessions.values()):
        refresh(sim, session)


def _complete(session: BuildSessionRecord, operation_id: str) -> None:
    session.state, session.operation_id, session.finished = S.PAYMENT_COMPLETE.value, operation_id, True


def state_answer(sim: Simulator, session: BuildSessionRecord) -> dict[str, Any]:
    answer: dict[str, Any] = {"state": session.state}
    if session.operation_id:
        answer["operation"] = sim.state.operations[session.operation_id].wire()
    if session.state == S.REDIRECTED_TO_EXTERNAL_DOMAIN.value:
        answer["url"] = f"{session.root_url}/_sim/build/{session.session_id}"
    if session.state == S.GDI_VERIFICATION.value:
        gdi = _field(session, "GDI", "GDI")
        gdi["src"] = f"{session.root_url}/_sim/build/{session.session_id}/gdi"
        answer["fieldSet"] = {"sessionId": session.session_id, "fields": [gdi]}
    return answer


def _execute(sim: Simulator, session: BuildSessionRecord, origin: Origin, pend_as: str = PAGE_PAYMENT) -> None:
    """Run the session's payment: the merchant's step (``pend_as`` its catalogue name) or the customer's
    (an APM page, a version 2 GDI step: a :data:`PAGE_PAYMENT`). ``PAYMENT_COMPLETE`` with the operation,
    also while a ``pend`` rule holds it ``PENDING``."""
    order = sim.state.orders[session.order_id]
    forced = None if session.gdi_approved else THREEDS_FAILURE
    pan, expiry = session.pan or AUTO_COMPLETE_PAN, session.expiry or "1230"
    op = pay_on_page(sim, order, origin, pan=pan, expiry=expiry, forced=forced, pend_as=pend_as)
    _complete(session, op.operation_id)


def _merchant_session(sim: Simulator, session_id: str) -> BuildSessionRecord:
    session = find_session(sim, session_id)
    if session.finished and session.operation_id:
        result = sim.state.operations[session.operation_id].result
        if result == OperationResult.EXPIRED.value:
            raise SimError.invalid("sessionId", "session expired: create a new build order")
    return session


def build_finalize_payment(sim: Simulator, call: Call) -> Reply:
    session = _merchant_session(sim, call.body(BuildSessionRequest).sessionId)
    if session.version == "2":
        raise SimError.invalid("sessionId", "a version 2 session is paid with confirm_payment")
    if session.state != S.READY_FOR_PAYMENT.value:
        raise SimError.invalid("sessionId", f"session is in state {session.state}, not READY_FOR_PAYMENT")
    _execute(sim, session, call.origin, call.origin.name)
    return ok(state_answer(sim, session))


def build_confirm_payment(sim: Simulator, call: Call) -> Reply:
    request = call.body(BuildConfirmRequest)
    session = _merchant_session(sim, request.sessionId)
    if session.version != "2":
        raise SimError.invalid("sessionId", f"a version {session.version} session is paid with finalize_payment")
    if session.state != S.READY_FOR_PAYMENT.value:
        raise SimError.invalid("sessionId", f"session is in state {session.state}, not READY_FOR_PAYMENT")
    order = sim.state.orders[session.order_id]
    if request.amount is not None:
        if not 0 < request.amount <= order.amount:
            raise SimError.rejected("PS0007", f"amount {request.amount} > order amount {order.amount}")
        order.session_amount = request.amount
    if session.challenge and not session.gdi_done:
        session.state = S.GDI_VERIFICATION.value
    else:
        _execute(sim, session, call.origin, call.origin.name)
    return ok(state_answer(sim, session))


def build_cancel(sim: Simulator, call: Call) -> Reply:
    session = _merchant_session(sim, call.body(BuildSessionRequest).sessionId)
    if session.finished:
        raise SimError.invalid("sessionId", "session is already complete")
    op = abandon_on_page(sim, sim.state.orders[session.order_id], call.origin, result=OperationResult.CANCELED.value)
    op.operation_type = OperationType.CANCEL.value
    _complete(session, op.operation_id)
    return ok(state_answer(sim, session))


def build_state(sim: Simulator, call: Call) -> Reply:
    return ok(state_answer(sim, find_session(sim, call.body(BuildSessionQuery).sessionId)))


def build_card_data(sim: Simulator, call: Call) -> Reply:
    session = find_session(sim, call.body(BuildSessionQuery).sessionId)
    if not session.pan or not session.expiry:
        raise SimError.invalid("sessionId", f"no card data collected yet (state {session.state})")
    pan = session.pan
    return ok({"bin": pan[:6], "lastFourDigits": pan[-4:], "expiringDate": session.expiry, "circuit": circuit(pan)})


def build_integrity(sim: Simulator, call: Call) -> Reply:
    session = find_session(sim, call.body(BuildSessionQuery).sessionId)
    operation = sim.state.operations.get(session.operation_id or "")
    expired = operation is not None and operation.result == OperationResult.EXPIRED.value
    return ok({"sessionId": session.session_id, "integrityCheck": "KO" if expired else "OK", "state": session.state})


# -- the customer's side (pages and auto-completion) -------------------------------------------


def fill_form(sim: Simulator, session_id: str, origin: Origin, *, pan: str, expiry: str) -> BuildSessionRecord:
    """The customer entered the card (or paid on the APM page)."""
    session = find_session(sim, session_id)
    open_states = (S.PAYMENT_METHOD_SELECTION.value, S.CARD_DATA_COLLECTION.value, S.REDIRECTED_TO_EXTERNAL_DOMAIN.value)
    if session.finished or session.state not in open_states:
        raise SimError(409, None, f"session {session_id} is in state {session.state}")
    session.pan, session.expiry = pan, expiry
    session.challenge = session.challenge or card_profile(pan).challenge
    if session.state == S.REDIRECTED_TO_EXTERNAL_DOMAIN.value:
        _execute(sim, session, origin)
    elif session.version == "3" and session.challenge:
        session.state = S.GDI_VERIFICATION.value
    else:
        session.state = S.READY_FOR_PAYMENT.value
    return session


def complete_gdi(sim: Simulator, session_id: str, origin: Origin, *, approve: bool) -> BuildSessionRecord:
    """The customer finished the 3DS step (GDI) of a version 3 form or of a version 2 confirm."""
    session = find_session(sim, session_id)
    if session.state != S.GDI_VERIFICATION.value:
        raise SimError(409, None, f"session {session_id} is in state {session.state}, not GDI_VERIFICATION")
    session.gdi_done, session.gdi_approved = True, approve
    if session.version == "2":
        _execute(sim, session, origin)
    else:
        session.state = S.READY_FOR_PAYMENT.value
    return session


def auto_fill(sim: Simulator, session_id: str) -> None:
    with sim.state.lock:
        session = sim.state.build_sessions.get(session_id)
        if session is not None and not session.finished and session.pan is None:
            fill_form(sim, session_id, Origin("auto_complete", f"/_sim/build/{session_id}"), pan=AUTO_COMPLETE_PAN, expiry="1230")
            sim.state.dirty = True


HANDLERS: dict[str, Handler] = {
    "create_build_order": create_build_order,
    "build_finalize_payment": build_finalize_payment,
    "build_cancel": build_cancel,
    "build_state": build_state,
    "build_card_data": build_card_data,
    "build_integrity": build_integrity,
    "build_confirm_payment": build_confirm_payment,
}
