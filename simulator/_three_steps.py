"""Server-to-server card payments: three steps with 3DS (init, ACS challenge, validation, payment) and init/pay.

Three steps: ``init`` records an ``AUTHORIZATION`` / ``PENDING`` operation and answers, as the real test
environment does, ``threeDSEnrollmentStatus: ENROLLED`` and ``threeDSAuthUrl = {root}/_sim/acs`` for
every card. A frictionless card's ``threeDSAuthRequest`` is ``"notneeded"``: it goes straight to
``payment``. A challenge card (or ``exemptions: CHALLENGE_REQUESTED``) gets an opaque
``threeDSAuthRequest`` instead; the customer's browser posts the ACS
form there and comes back with a ``PaRes``, which ``validation`` turns into ``THREEDS_VALIDATED`` (or
``THREEDS_FAILED`` for a 3DS-failing card, a refused challenge or a forged PaRes). ``payment`` then gives
the final result. The operation keeps its id through all steps.

Init/pay (``/v2/svs``): ``init`` records a ``PENDING`` operation with the card; ``pay`` completes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durapay.gateway import (
    THREEDS_NOT_NEEDED,
    Exemptions,
    OperationResult,
    OperationType,
    SvsInitRequest,
    SvsPayRequest,
    ThreeDSEnrollmentStatus,
    ThreeStepsInitRequest,
    ThreeStepsPaymentRequest,
    ThreeStepsValidationRequest,
)
from durapay.simulator._cards import card_profile
from durapay.simulator._payments import (
    check_recurrence,
    claim_order,
    decide,
    ensure_new_order,
    is_explicit,
    new_operation,
    settle,
)
from durapay.simulator._protocol import Call, Handler, Reply, SimError, ok
from durapay.simulator._records import OperationRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

PENDING = OperationResult.PENDING.value
VALIDATED = OperationResult.THREEDS_VALIDATED.value
THREEDS_FAILED = OperationResult.THREEDS_FAILED.value


def three_steps_init(sim: Simulator, call: Call) -> Reply:
    body = call.body(ThreeStepsInitRequest)
    ensure_new_order(sim, body.order)
    check_recurrence(sim, body.recurrence, "recurrence")
    recurrence = body.recurrence.wire() if body.recurrence else None
    order = claim_order(sim, call, body.order, "three_steps", recurrence=recurrence)
    challenge = card_profile(body.card.pan).challenge or body.exemptions == Exemptions.CHALLENGE_REQUESTED
    op = new_operation(
        sim,
        order,
        call.origin,
        operation_type=OperationType.AUTHORIZATION.value,
        result=PENDING,
        amount=order.amount,
        pan=body.card.pan,
        expiry=body.card.expiryDate,
        flow="three_steps",
        challenge=challenge,
        recurrence=recurrence,
    )
    if challenge:
        op.threeds_request = "3DSREQ-" + sim.state.new_token()
    # As the real test environment: ENROLLED and an ACS URL either way; "notneeded" means no challenge.
    return ok(
        {
            "operation": op.wire(),
            "threeDSEnrollmentStatus": ThreeDSEnrollmentStatus.ENROLLED.value,
            "threeDSAuthRequest": op.threeds_request if challenge else THREEDS_NOT_NEEDED,
            "threeDSAuthUrl": f"{call.root_url}/_sim/acs",
        }
    )


def acs_authenticate(sim: Simulator, operation_id: str, three_ds_request: str, *, approve: bool) -> str:
    """The ACS's answer to a challenge: a PaRes that ``validation`` accepts when ``approve`` and the card allow."""
    op = sim.state.operations.get(operation_id)
    if op is None or op.flow != "three_steps" or not op.threeds_request or op.threeds_request != three_ds_request:
        raise SimError(400, None, "unknown 3DS request for this transaction")
    pares = "PARES-" + sim.state.new_token()
    op.pares[pares] = approve and not card_profile(op.pan or "").threeds_fails
    return pares


def _three_steps_operation(sim: Simulator, operation_id: str) -> OperationRecord:
    op = sim.state.operations.get(operation_id)
    if op is None or op.flow != "three_steps":
        raise SimError.invalid("operationId", "no three-step operation with this id")
    return op


def _not_paid(sim: Simulator, op: OperationRecord) -> None:
    """Refuse a step on an operation whose payment ran and was answered PENDING (a ``pend`` rule)."""
    if op.operation_id in sim.state.pending:
        raise SimError.invalid("operationId", "operation already paid: its result is PENDING")


def three_steps_validation(sim: Simulator, call: Call) -> Reply:
    body = call.body(ThreeStepsValidationRequest)
    op = _three_steps_operation(sim, body.operationId)
    _not_paid(sim, op)
    if op.result != PENDING:
        raise SimError.invalid("operationId", f"operation is {op.result}, not PENDING")
    authenticated = op.pares.get(body.threeDSAuthResponse, False) if op.challenge else True
    op.result = VALIDATED if authenticated else THREEDS_FAILED
    op.threeds_validated = authenticated
    op.steps.append(call.origin.step(op.result))
    result = {
        "authenticationValue": f"AAABB{op.operation_id[-12:]}=" if authenticated else None,
        "cavvAlgorithm": "2",
        "eci": "05" if authenticated else "07",
        "merchantAcquirerBin": "434994",
        "xid": op.operation_id,
        "status": "VALIDATED" if authenticated else "FAILED",
        "vendorcode": "",
        "version": "2.1.0",
    }
    return ok({"operation": op.wire(), "threeDSAuthResult": result})


def three_steps_payment(sim: Simulator, call: Call) -> Reply:
    body = call.body(ThreeStepsPaymentRequest)
    op = _three_steps_operation(sim, body.operationId)
    if body.order.orderId != op.order_id:
        raise SimError.invalid("order.orderId", "does not match the operation's order")
    if body.card.pan != op.pan:
        raise SimError.invalid("card.pan", "does not match the card given at init")
    if op.result == THREEDS_FAILED:
        op.steps.append(call.origin.step(op.result))
        return ok({"operation": op.wire()})
    _not_paid(sim, op)
    if op.result not in (PENDING, VALIDATED):
        raise SimError.invalid("operationId", f"operation already completed ({op.result})")
    if op.result == PENDING and op.challenge:
        raise SimError.invalid("operationId", "3DS authentication not validated: call validation first")
    if body.recurrence is not None:
        op.recurrence = body.recurrence.wire()
    op.capture_explicit = is_explicit(body.captureType)
    order = sim.state.orders[op.order_id]
    contract_id = (op.recurrence or {}).get("contractId")
    settle(sim, op, order, decide(sim, op.pan, contract_id=contract_id, with_3ds=False, origin=call.origin), call.origin)
    return ok({"operation": op.wire()})


def svs_init_order(sim: Simulator, call: Call) -> Reply:
    body = call.body(SvsInitRequest)
    ensure_new_order(sim, body.order)
    check_recurrence(sim, body.recurrence, "recurrence")
    recurrence = body.recurrence.wire() if body.recurrence else None
    order = claim_order(sim, call, body.order, "svs", recurrence=recurrence, capture_explicit=is_explicit(body.captureType))
    op = new_operation(
        sim,
        order,
        call.origin,
        operation_type=OperationType.AUTHORIZATION.value,
        result=PENDING,
        amount=order.amount,
        pan=body.card.pan,
        expiry=body.card.expiryDate,
        flow="svs",
        recurrence=recurrence,
        capture_explicit=order.capture_explicit,
    )
    return ok({"operation": op.wire()})


def svs_pay_operation(sim: Simulator, call: Call) -> Reply:
    body = call.body(SvsPayRequest)
    op = sim.state.operations.get(call.params["operationId"])
    if op is None:
        raise SimError.not_found()
    if op.flow != "svs":
        raise SimError.invalid("operationId", "not an operation of /v2/svs/order/init")
    _not_paid(sim, op)
    if op.result != PENDING:
        raise SimError.invalid("operationId", f"operation already completed ({op.result})")
    if body.captureType is not None:
        op.capture_explicit = is_explicit(body.captureType)
    contract_id = (op.recurrence or {}).get("contractId")
    outcome = decide(sim, op.pan, contract_id=contract_id, with_3ds=False, origin=call.origin)
    settle(sim, op, sim.state.orders[op.order_id], outcome, call.origin)
    return ok({"operation": op.wire()})


HANDLERS: dict[str, Handler] = {
    "three_steps_init": three_steps_init,
    "three_steps_validation": three_steps_validation,
    "three_steps_payment": three_steps_payment,
    "svs_init_order": svs_init_order,
    "svs_pay_operation": svs_pay_operation,
}
