"""Reservation area, the guest's side: reservations, their pay-by-link, the three validations, and the
no-show, incremental and delayed charges (plus the earlier ``/reservation/{id}/mit``).

A reservation is paid through its pay-by-link; the order's id is the reservation's id. Guaranteed
reservations (``GUARANTEED``, ``GUARANTEED_NOSHOW``, ``GUARANTEED_PENALTY``) verify the card without a
charge; the others charge the deposit (or the amount). That first successful operation is the
"original operation": it keeps the card (an internal contract, not exposed) that the later charges use.

Validations answer 200 when the reservation has a paid original operation, the currency is the
reservation's, and the amount is between 1 and the reservation's amount; else 400 PS0026 (PS0009 for
the currency). Charges are ``NOSHOW`` / ``INCREMENTAL`` / ``DELAY_CHARGE`` operations against
``originalOperationId``, each its own money pool (an incremental on an explicit authorization is
``AUTHORIZED``, the rest ``EXECUTED``); declines follow the card rule and scripts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from durapay.gateway import (
    ActionType,
    ChangeAmountRequest,
    Channel,
    OperationResult,
    OperationType,
    ReservationListQuery,
    ReservationMitRequest,
    ReservationPayByLinkRequest,
    ReservationRequest,
    ReservationValidationRequest,
)
from durapay.simulator import _ledger
from durapay.simulator._links import answer, check_expiration, open_link, refresh
from durapay.simulator._lists import Window, newest_first
from durapay.simulator._payments import SUCCESS, decide, is_explicit, new_operation, reservation_contract_id, settle
from durapay.simulator._protocol import Call, Handler, Reply, SimError, ok
from durapay.simulator._records import OperationRecord, OrderRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

GUARANTEED_TYPES = frozenset({"GUARANTEED", "GUARANTEED_NOSHOW", "GUARANTEED_PENALTY"})
DATE_TYPES = {"CREATION_DATE": "creationDate", "CHECK_IN_DATE": "checkInDate", "CHECK_OUT_DATE": "checkOutDate"}
DEFAULT_LINK_DAYS = 30


def create_reservation(sim: Simulator, call: Call) -> Reply:
    reservation = call.body(ReservationRequest).reservation
    body = reservation.wire()
    state = sim.state
    if reservation.reservationId in state.reservations:
        raise SimError.invalid("reservation.reservationId", "already exists")
    if reservation.structureId is not None and reservation.structureId not in state.structures:
        raise SimError.invalid("reservation.structureId", f"unknown structure {reservation.structureId}")
    if reservation.agencyId is not None and reservation.agencyId not in state.agencies:
        raise SimError.invalid("reservation.agencyId", f"unknown agency {reservation.agencyId}")
    for terms_id in reservation.termsAndConditionsIds or []:
        if terms_id not in state.terms:
            raise SimError.invalid("reservation.termsAndConditionsIds", f"unknown terms and conditions {terms_id}")
    if reservation.collectionType == "INSTALLMENT" and not reservation.installments:
        raise SimError.invalid("reservation.installments", "required with collectionType INSTALLMENT")
    body.setdefault("status", "ACTIVE")
    body.setdefault("creationDate", state.now_iso())
    state.reservations[reservation.reservationId] = body
    return ok({"reservationId": reservation.reservationId})


def _order_of(sim: Simulator, reservation_id: str) -> OrderRecord | None:
    return sim.state.orders.get(sim.state.reservation_orders.get(reservation_id, ""))


def list_reservations(sim: Simulator, call: Call) -> Reply:
    query = call.body(ReservationListQuery)
    date_type = (query.dateType or "CREATION_DATE").upper()
    if date_type not in DATE_TYPES:
        raise SimError.invalid("dateType", f"must be one of {sorted(DATE_TYPES)}")
    date_field = DATE_TYPES[date_type]
    window = Window.of(query.fromTime, query.toTime)

    def structure_name(reservation: dict[str, Any]) -> str:
        return str(sim.state.structures.get(reservation.get("structureId") or "", {}).get("structureName") or "")

    found = [
        r
        for r in sim.state.reservations.values()
        if window.holds(r.get(date_field))
        and (query.reservationId is None or r["reservationId"] == query.reservationId)
        and (query.customField is None or r.get("customField") == query.customField)
        and (query.reservationType is None or r.get("reservationType") == query.reservationType)
        and (query.structureName is None or query.structureName.lower() in structure_name(r).lower())
        and (query.customerNameReservation is None or r.get("customerName") == query.customerNameReservation)
        and (query.customerSurnameReservation is None or r.get("customerSurname") == query.customerSurnameReservation)
    ]
    return ok({"reservation": newest_first(found, lambda r: str(r.get(date_field) or ""), query.maxRecords)})


def get_reservation(sim: Simulator, call: Call) -> Reply:
    reservation = sim.state.reservations.get(call.params["reservationId"])
    if reservation is None:
        raise SimError.not_found()
    order = _order_of(sim, reservation["reservationId"])
    status: dict[str, Any] = {"reservation": reservation, "authorizedAmount": "0", "capturedAmount": "0"}
    operations: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    if order is not None:
        for link_id in order.link_ids:
            refresh(sim, sim.state.links[link_id])
        sim.pending.settle_due()
        details = _ledger.order_details(sim.state, order)
        status.update({key: value for key, value in details.items() if key != "order"})
        operations = [sim.state.operations[i].wire() for i in order.operation_ids]
        links = [sim.state.links[i].wire() for i in order.link_ids]
    return ok({"reservationStatus": status, "operations": operations, "paymentLinks": links})


def _original(sim: Simulator, order: OrderRecord | None) -> OperationRecord | None:
    """The reservation's first successful payment or verification."""
    if order is None:
        return None
    for operation_id in order.operation_ids:
        op = sim.state.operations[operation_id]
        if op.payment_link_id is not None and op.result in SUCCESS:
            return op
    return None


def create_reservation_paybylink(sim: Simulator, call: Call) -> Reply:
    reservation_id = call.params["reservationId"]
    reservation = sim.state.reservations.get(reservation_id)
    if reservation is None:
        raise SimError.not_found()
    if reservation.get("status") == "CANCELED":
        raise SimError.invalid("reservationId", "reservation is CANCELED")
    request = call.body(ReservationPayByLinkRequest)
    order = _order_of(sim, reservation_id)
    if order is not None and _original(sim, order) is not None:
        raise SimError.rejected("PS0042", "the reservation is already paid")
    if order is not None and any(sim.state.links[i].status == "ACTIVE" for i in order.link_ids):
        raise SimError.rejected("PS0042", "the reservation has an active link")
    default_expiry = (sim.clock.now() + timedelta(days=DEFAULT_LINK_DAYS)).date().isoformat()
    expiry_text = request.linkExpirationDate or reservation.get("linkExpirationDate") or default_expiry
    expiration = check_expiration(sim, expiry_text, "linkExpirationDate")
    if order is None:
        if reservation_id in sim.state.orders:
            raise SimError.invalid("reservationId", "an order with this id already exists")
        amount, deposit = int(reservation["amount"]), int(reservation.get("deposit") or 0)
        verify = reservation.get("reservationType") in GUARANTEED_TYPES
        order = OrderRecord(
            order_id=reservation_id,
            order={
                key: reservation[key]
                for key in ("amount", "currency", "description", "customField", "customerId")
                if reservation.get(key) is not None
            }
            | {"orderId": reservation_id},
            amount=amount,
            currency=reservation["currency"],
            created_at=sim.state.now_iso(),
            kind="reservation",
            created_by=call.op.name,
            session_amount=0 if verify else (deposit or amount),
            action_type=(ActionType.VERIFY if verify else ActionType.PAY).value,
            reservation_id=reservation_id,
        )
        sim.state.orders[reservation_id] = order
        sim.state.reservation_orders[reservation_id] = reservation_id
    order.capture_explicit = is_explicit(request.captureType)
    order.notification_url = request.notificationUrl or order.notification_url
    return ok(answer(open_link(sim, call, order, expiration)))


def _check_reservation_amount(sim: Simulator, request: ReservationValidationRequest) -> None:
    reservation = sim.state.reservations.get(request.reservationId)
    if reservation is None:
        raise SimError.invalid("reservationId", f"unknown reservation {request.reservationId}")
    if reservation.get("status") == "CANCELED":
        raise SimError.invalid("reservationId", "reservation is CANCELED")
    if _original(sim, _order_of(sim, request.reservationId)) is None:
        raise SimError.invalid("reservationId", "the reservation has no paid original operation")
    if request.currency != reservation["currency"]:
        raise SimError.rejected("PS0009", f"{request.currency} is not the reservation's currency {reservation['currency']}")
    limit = int(reservation["amount"])
    if not 0 < request.amount <= limit:
        raise SimError.invalid("amount", f"must be between 1 and the reservation amount {limit}")


def validate_reservation_charge(sim: Simulator, call: Call) -> Reply:
    _check_reservation_amount(sim, call.body(ReservationValidationRequest))
    return ok()


def _charge(sim: Simulator, call: Call, kind: OperationType) -> Reply:
    request = call.body(ChangeAmountRequest)
    original = sim.state.operations.get(request.originalOperationId)
    if original is None:
        raise SimError.invalid("originalOperationId", "no operation with this id")
    if original.result not in SUCCESS or not original.pan:
        raise SimError.invalid("originalOperationId", f"operation is {original.result}: not a paid original operation")
    if request.currency != original.currency:
        raise SimError.rejected("PS0009", f"{request.currency} is not the original operation's currency {original.currency}")
    if request.amount <= 0:
        raise SimError.invalid("amount", "must be at least 1")
    order = sim.state.orders[original.order_id]
    contract_id = reservation_contract_id(order.reservation_id) if order.reservation_id else None
    op = new_operation(
        sim,
        order,
        call.origin,
        operation_type=kind.value,
        result=OperationResult.PENDING.value,
        amount=request.amount,
        channel=Channel.BACKOFFICE.value,
        pan=original.pan,
        expiry=original.expiry,
        capture_explicit=kind == OperationType.INCREMENTAL and original.result == OperationResult.AUTHORIZED.value,
    )
    settle(sim, op, order, decide(sim, original.pan, contract_id=contract_id, with_3ds=False, origin=call.origin), call.origin)
    op.operation_type = kind.value  # settle names the result's type; a charge keeps its own (so does _pending)
    return ok({"operation": op.wire()})


def create_no_show(sim: Simulator, call: Call) -> Reply:
    return _charge(sim, call, OperationType.NOSHOW)


def create_incremental(sim: Simulator, call: Call) -> Reply:
    return _charge(sim, call, OperationType.INCREMENTAL)


def create_delay_charge(sim: Simulator, call: Call) -> Reply:
    return _charge(sim, call, OperationType.DELAY_CHARGE)


def create_reservation_mit_earlier(sim: Simulator, call: Call) -> Reply:
    reservation_id = call.params["reservationId"]
    reservation = sim.state.reservations.get(reservation_id)
    if reservation is None:
        raise SimError.not_found()
    request = call.body(ReservationMitRequest)
    order = _order_of(sim, reservation_id)
    contract = sim.state.contracts.get(reservation_contract_id(reservation_id))
    if order is None or contract is None:
        raise SimError.rejected("PS0043", "the reservation has no paid original operation")
    if request.currency is not None and request.currency != order.currency:
        raise SimError.rejected("PS0009", f"{request.currency} is not the reservation's currency {order.currency}")
    if request.amount <= 0:
        raise SimError.invalid("amount", "must be at least 1")
    op = new_operation(
        sim,
        order,
        call.origin,
        operation_type=OperationType.AUTHORIZATION.value,
        result=OperationResult.PENDING.value,
        amount=request.amount,
        channel=Channel.BACKOFFICE.value,
        pan=contract.pan,
        expiry=contract.expiry,
    )
    settle(sim, op, order, decide(sim, contract.pan, contract_id=contract.contract_id, with_3ds=False), call.origin)
    return ok({"operation": op.wire()})


HANDLERS: dict[str, Handler] = {
    "create_reservation": create_reservation,
    "list_reservations": list_reservations,
    "get_reservation": get_reservation,
    "create_reservation_paybylink": create_reservation_paybylink,
    "create_no_show": create_no_show,
    "create_incremental": create_incremental,
    "create_delay_charge": create_delay_charge,
    "validate_incremental": validate_reservation_charge,
    "validate_no_show": validate_reservation_charge,
    "validate_delay_charge": validate_reservation_charge,
    "validate_no_show_earlier": validate_reservation_charge,
    "validate_delay_charge_earlier": validate_reservation_charge,
    "validate_incremental_earlier": validate_reservation_charge,
    "create_reservation_mit_earlier": create_reservation_mit_earlier,
}
