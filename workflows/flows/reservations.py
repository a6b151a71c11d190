"""Reservation guarantee ("Disputless"), the guest's side: a reservation with its pay-by-link, then charges.

The set-up calls (structures, agencies, conditions...) are the ``reservation_setup`` flow, in
``reservation_setup``.

* ``reservation`` - ``POST /reservations``, its pay-by-link, then a wait for the notification; at the
  deadline ``GET /reservations/{id}`` decides instead of a guess. Its outcome's operation is the
  *original operation* the later charges refer to.
* ``no_show``, ``incremental``, ``delay_charge`` - ``GET /reservations/{id}`` checks the charge when it
  starts (its original operation is the reservation's, one no-show, the charges within the reservation's
  amount, a delayed charge after the stay: refused at once rather than after a sleep), then the
  validation, then the charge with the step's Idempotency-Key, then ``GET /operations/{id}`` reads the
  result back. ``delay_charge`` sleeps until ``runAt`` on the engine's due set (a durable timer, months if
  need be; ``engine.start(..., run_at=...)`` works too). The charge step holds the reservation
  (``workflows.engine.targets``: one unresolved charge per reservation, another flow's waits), reads it and
  checks the same bounds again right before its call, binding (a check-out moved or a reservation
  cancelled during the sleep, the other flows' charges made meanwhile); after a lost answer it reads the
  reservation back and takes as its own only a charge that was not there when it took the reservation.

Every kind takes ``form``: ``current`` (default) or ``earlier``, the deprecated path forms (validations at
``/noshow_validation`` instead of ``/reservations/noshow_validation``, custom fields at ``/custom_fields``
instead of ``/structures/custom_fields``; the earlier forms have no agency endpoints). Where both forms
share a path (reservations, links, charges) it changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field

from durapay.flows import Call, Flow, Target, call, timer, wait_signal
from durapay.gateway import (
    SUCCESS_RESULTS,
    Amount,
    CaptureType,
    Catalogue,
    Currency,
    GatewayModel,
    LenientEnum,
    NotFound,
    OperationResponse,
    OperationResult,
    OperationType,
    Reservation,
    ReservationIdResponse,
    ReservationLookupResponse,
    Unknown,
)
from durapay.tasks.outcomes import Advance, Finish, Outcome, Wait
from durapay.tasks.runner import NOT_COMMITTED, UNCLEAR, ReconcileResult, StepContext
from durapay.workflows.engine import FlowDefinition
from durapay.workflows.flows._adopt import PAYMENT_TYPES, adopt_made, never_sent
from durapay.workflows.flows._common import read_until_final, summarize
from durapay.workflows.flows.waits import (
    GRACE_SECONDS,
    began,
    cancel_link,
    first_read,
    judge_wait,
    link_end,
    notified,
    read_later,
    watch,
)

Form = Literal["current", "earlier"]
CHARGE_TYPES = frozenset({OperationType.NOSHOW, OperationType.INCREMENTAL, OperationType.DELAY_CHARGE})


# -- reservation + pay-by-link ------------------------------------------------------------------------


class ReservationInput(GatewayModel):
    reservation: Reservation
    linkExpirationDate: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None
    notificationUrl: str | None = Field(default=None, max_length=2048, pattern=r"^https?://")
    waitSeconds: float | None = Field(default=None, gt=0, description="durapay: how long to wait for the guest")
    form: Form = "current"


def _reservation_id(ctx: StepContext) -> str:
    return str(ctx.input.reservation.reservationId)


def _read_reservation(ctx: StepContext) -> Any | None:
    try:
        return ctx.call(Catalogue.get_reservation, _reservation_id(ctx))
    except NotFound:
        return None


def _adopt_reservation(ctx: StepContext) -> ReconcileResult:
    found = _read_reservation(ctx)
    return NOT_COMMITTED if found is None else Advance({"reservationId": _reservation_id(ctx), "adopted": True})


def _link_request(ctx: StepContext) -> Call:
    body: dict[str, Any] = {"notificationUrl": ctx.input.notificationUrl or ctx.notification_url or None}
    if ctx.input.linkExpirationDate:
        body["linkExpirationDate"] = ctx.input.linkExpirationDate
    if ctx.input.captureType is not None:
        body["captureType"] = str(ctx.input.captureType)
    return Call((_reservation_id(ctx),), {key: value for key, value in body.items() if value})


def _adopt_link(ctx: StepContext) -> ReconcileResult:
    """A link the gateway made for a lost answer: adopt it (its token is lost, so the deadline read decides)."""
    found = _read_reservation(ctx)
    if found is None or not found.paymentLinks:
        return NOT_COMMITTED
    return Advance({"paymentLink": found.paymentLinks[-1].wire(), "securityToken": None, "adopted": True})


def _merchant_end(ctx: StepContext) -> float | None:
    """The merchant's deadline (``waitSeconds``, counted from the wait's start, ``waits.began``: the link's
    making, also after an operator's restart), when one was given: the read at it closes the link first."""
    return began(ctx) + float(ctx.input.waitSeconds) if ctx.input.waitSeconds else None


def _link_deadline(ctx: StepContext) -> float:
    """When to read the reservation first: at the link's first read (``waits.first_read``: a wait never
    depends on a notification arriving), or at ``waitSeconds``, else the link's expiry, if sooner."""
    if ctx.input.waitSeconds:
        seconds = float(ctx.input.waitSeconds)
    else:
        expiry = (ctx.output("link").get("paymentLink") or {}).get("expirationDate") or ctx.input.linkExpirationDate
        seconds = max(60.0, link_end(str(expiry)) - ctx.now) if expiry else 30 * 86400.0
    return min(seconds, first_read(ctx))


def _notified(ctx: StepContext, name: str, payload: dict[str, Any]) -> Outcome:
    """A verified notification: a success ends the wait; anything else is checked against the gateway."""
    return notified(ctx, name, payload, lambda ctx, outcome: outcome if outcome is not None else _payment_read(ctx))


def _link_of(ctx: StepContext) -> str | None:
    link = ctx.output("link").get("paymentLink")
    return str(link["linkId"]) if isinstance(link, dict) and link.get("linkId") else None


def _close_link(ctx: StepContext) -> None:
    cancel_link(ctx, _link_of(ctx))


def _payment_at_deadline(ctx: StepContext) -> Outcome:
    """At a read of the wait (its first read, the pace's, the deadline): the one rule for the end of a wait
    (``workflows.flows.waits``). The deadline the merchant set (``waitSeconds``), once reached, closes
    the link first (an adopted link is left to its expiry)."""
    end = _merchant_end(ctx)
    if end is not None and ctx.now >= end and not ctx.output("link").get("adopted"):
        _close_link(ctx)
    return _payment_read(ctx)


def _payment_read(ctx: StepContext) -> Outcome:
    """The one rule for the end of a wait (``workflows.flows.waits``), on the reservation."""
    found = _read_reservation(ctx)
    ends = began(ctx) + (ctx.input.waitSeconds or 30 * 86400.0)  # fixed: never moves with the wait
    created = ctx.output("link").get("paymentLink") or {}
    if created.get("expirationDate"):
        ends = link_end(str(created["expirationDate"]))
    if found is None:  # it had a link: gone from a read is not the customer's end
        return read_later(ctx, ("notification",), ends + GRACE_SECONDS, "the reservation is not found", {"type": "NotFound"})
    links = list(found.paymentLinks)
    merchant_end = _merchant_end(ctx)
    judged = judge_wait(ctx, ("notification",), found.operations, links, ends=ends, deadline=merchant_end)
    end = min(ends, merchant_end or ends)
    if judged is None and ctx.now < end:  # nothing shown yet, before the end: read again
        judged = Wait(("notification",), watch(ctx, end), note="the reservation shows no link yet")
    if isinstance(judged, Wait) and merchant_end is not None and ctx.now < merchant_end:
        judged = replace(judged, deadline=min(judged.deadline, merchant_end))  # the merchant's deadline is kept
    return judged or Finish(False, "no payment by the deadline", error={"type": "Expired"})


def _reservation_summary(data: Any, outputs: Any) -> dict[str, Any]:
    return {**summarize(data, outputs), "reservationId": data.reservation.reservationId}


RESERVATION = Flow(
    "reservation",
    ReservationInput,
    (
        call(
            "create",
            Catalogue.create_reservation,
            lambda ctx: Call(request={"reservation": ctx.input.reservation.wire()}),
            result=lambda ctx, answer: Advance(ReservationIdResponse.model_validate(answer.wire()).wire()),
            adopt=_adopt_reservation,
        ),
        call(
            "link",
            Catalogue.create_reservation_paybylink,
            _link_request,
            adopt=_adopt_link,
            customer_url=lambda output: (output.get("paymentLink") or {}).get("link"),
        ),
        wait_signal(
            "payment",
            ("notification",),
            _notified,
            _payment_at_deadline,
            timeout=_link_deadline,
            close=_close_link,
            on_settle=_payment_read,
        ),
    ),
    _reservation_summary,
    lambda data: str(data.reservation.reservationId),
    "reservation with its pay-by-link: create, link, wait for the guest's payment",
    order_field="reservation.reservationId",
    order_fixed=True,
)


# -- no-show, incremental and delayed charges -----------------------------------------------------------

#: The operation each charge makes.
CHARGE_TYPE = {
    "no_show": OperationType.NOSHOW,
    "incremental": OperationType.INCREMENTAL,
    "delay_charge": OperationType.DELAY_CHARGE,
}
CHARGE_TYPES = frozenset(CHARGE_TYPE.values())
#: Results of a charge that took the guest's money, or may still (PENDING): what counts against the bounds.
TAKEN = SUCCESS_RESULTS | {OperationResult.PENDING}


class ChargeInput(GatewayModel):
    reservationId: str = Field(min_length=1, max_length=27)
    originalOperationId: str | None = Field(
        default=None,
        min_length=1,
        description="the reservation's paid operation whose card is charged: checked against it, read from it when omitted",
    )
    amount: Amount = Field(ge=1)
    currency: Currency
    description: str | None = Field(default=None, max_length=255)
    form: Form = "current"


class DelayChargeInput(ChargeInput):
    runAt: AwareDatetime | None = Field(
        default=None,
        description="ISO 8601 with offset: when to charge, in the future and not before the reservation's checkOutDate",
    )


VALIDATIONS = {
    ("no_show", "current"): Catalogue.validate_no_show,
    ("no_show", "earlier"): Catalogue.validate_no_show_earlier,
    ("incremental", "current"): Catalogue.validate_incremental,
    ("incremental", "earlier"): Catalogue.validate_incremental_earlier,
    ("delay_charge", "current"): Catalogue.validate_delay_charge,
    ("delay_charge", "earlier"): Catalogue.validate_delay_charge_earlier,
}
CHARGES = {
    "no_show": Catalogue.create_no_show,
    "incremental": Catalogue.create_incremental,
    "delay_charge": Catalogue.create_delay_charge,
}


def _refused(field: str, reason: str) -> Finish:
    """A charge refused before anything is sent: the input does not fit the reservation the gateway shows."""
    return Finish(False, f"{field}: {reason}", error={"type": "InputError", "field": field, "reason": reason})


def _reservation_checked(ctx: StepContext, answer: ReservationLookupResponse) -> Outcome:
    """The reservation as the gateway shows it when the charge starts, checked before anything is sent
    (:func:`_charge_refused`), so that a charge that cannot be made is refused at once rather than after
    a sleep. Not the binding check: the charge step checks again with the reservation held (:class:`_Charge`).
    The output names the original operation, and what the reservation held (``before``: what a read-back
    of a flow of an earlier release judges by; ``workflows.flows._adopt``)."""
    run_at = ctx.input.runAt if ctx.kind == "delay_charge" else None
    if run_at is not None and run_at.timestamp() < ctx.created:
        return _refused("runAt", f"{run_at.isoformat()} was already past when the charge was started: it would charge at once")
    refused = _charge_refused(ctx, answer, when=charge_moment(ctx, run_at.timestamp() if run_at else ctx.now), charging=False)
    if refused is not None:
        return refused
    operations = list(answer.operations)
    return Advance({"originalOperationId": _original_of(ctx, operations), "before": [op.operationId for op in operations]})


def _paid(operations: list[Any]) -> list[Any]:
    return [op for op in operations if op.operationType in PAYMENT_TYPES and op.operationResult in SUCCESS_RESULTS]


def _original_of(ctx: StepContext, operations: list[Any]) -> str:
    """The original operation the charge takes the card of: the one checked at the start (or the input's,
    for a delayed charge that an earlier release put to sleep before it read the reservation), else the
    reservation's first paid operation."""
    named = ctx.output("original").get("originalOperationId") or ctx.input.originalOperationId
    if named:
        return str(named)
    paid = _paid(operations)
    return str(paid[0].operationId) if paid else ""


def _charge_refused(ctx: StepContext, answer: ReservationLookupResponse, *, when: datetime, charging: bool) -> Finish | None:
    """Why the charge may not be made on the reservation ``answer`` shows (None: it may), ``when`` it is to
    be made. One rule, asked when the charge starts and again, binding, by the charge step right before
    its call, the reservation held (``workflows.engine.targets``): every other flow's charge on it is then
    resolved and shows in ``answer``.

    * The charge takes the card of the operation it names, whatever order that operation is on: a given
      ``originalOperationId`` must be one of the reservation's own paid operations (else the validation
      checks this reservation and the charge lands on another guest's card); omitted, it is the first.
    * A no-show is charged once per reservation: one already taken (or PENDING) refuses a second.
    * The reservation's charges together stay within its amount (the gateway's validation checks each
      charge alone): durapay's bound, docs/flows.md, "Reservation guarantee".
    * A delayed charge runs after the stay: ``when`` not before ``checkOutDate`` (as the reservation says
      now: a check-out moved during the sleep counts).
    * At the charge: a reservation cancelled since is not charged (the public material does not say the
      gateway refuses it)."""
    reservation_id = ctx.input.reservationId
    reservation = answer.reservationStatus.reservation
    operations = list(answer.operations)
    if charging and str(reservation.status or "") == "CANCELED":
        return _refused("reservationId", f"reservation {reservation_id} is CANCELED: a cancelled reservation is not charged")
    paid = _paid(operations)
    if not paid:
        return Finish(False, f"reservation {reservation_id} has no paid original operation", error={"type": "NotPaid"})
    given = _original_of(ctx, operations) if charging else ctx.input.originalOperationId
    if given and given not in {op.operationId for op in paid}:
        return _refused(
            "originalOperationId",
            f"{given} is not a paid operation of reservation {reservation_id} (its original operation is "
            f"{paid[0].operationId}): a charge takes the card of the operation it names",
        )
    charges = [op for op in operations if op.operationType in CHARGE_TYPES and op.operationResult in TAKEN]
    no_shows = [op for op in charges if op.operationType is OperationType.NOSHOW]
    if CHARGE_TYPE[ctx.kind] is OperationType.NOSHOW and no_shows:
        return _refused(
            "reservationId",
            f"reservation {reservation_id} already has a no-show charge ({no_shows[0].operationId}, "
            f"{no_shows[0].operationResult}): a no-show is charged once",
        )
    limit = int(reservation.amount)
    taken = sum(int(op.operationAmount or 0) for op in charges)
    if taken + ctx.input.amount > limit:
        return _refused(
            "amount",
            f"{ctx.input.amount} with the {len(charges)} charges already on reservation {reservation_id} ({taken}) "
            f"exceeds the reservation's amount {limit}",
        )
    if ctx.kind == "delay_charge":
        return _before_check_out(ctx, reservation.checkOutDate, when)
    return None


def charge_moment(ctx: StepContext, moment: float) -> datetime:
    """The moment a charge is (to be) made, as the hotel's clock reads it: the one rule both checks judge
    its day by (the start's, for ``runAt``; the charge step's, for now). The reservation's ``checkOutDate``
    is a local date of the hotel, and the gateway gives no time zone for it; a delayed charge's ``runAt``
    carries the merchant's offset, taken as the hotel's: the day is ``moment`` in that offset. With no
    ``runAt`` (any other charge, or a delayed charge at once), UTC's. docs/flows.md, "Reservation guarantee"."""
    run_at = ctx.input.runAt if ctx.kind == "delay_charge" else None
    zone = run_at.tzinfo if run_at is not None and run_at.utcoffset() is not None else UTC
    return datetime.fromtimestamp(moment, zone)


def _before_check_out(ctx: StepContext, check_out: str | None, when: datetime) -> Finish | None:
    """A delayed charge ``when`` (:func:`charge_moment`) before the reservation's check-out date is refused."""
    try:
        day = date.fromisoformat(check_out[:10]) if check_out else None
    except ValueError:
        day = None  # a date this version cannot read: the gateway's validation decides
    if day is not None and when.date() < day:
        return _refused(
            "runAt",
            f"{when.date().isoformat()} is before reservation {ctx.input.reservationId}'s check-out date "
            f"{day.isoformat()}: a delayed charge is for after the stay",
        )
    return None


def _original_id(ctx: StepContext) -> str:
    """The checked original operation (the input's, for a delayed charge that an earlier release put to
    sleep before it read the reservation; else the reservation's first paid one, as the charge read it)."""
    read = ctx.target_read
    return _original_of(ctx, list(read.operations) if read is not None else [])


def _validate(ctx: StepContext, send: Callable[[StepContext], Outcome]) -> Outcome:
    """The validation of the flow's kind, on the path form the input asks for."""
    body = {"reservationId": ctx.input.reservationId, "amount": str(ctx.input.amount), "currency": ctx.input.currency}
    ctx.call(VALIDATIONS[(ctx.kind, ctx.input.form)], request=body)
    return Advance({"validated": True, "form": ctx.input.form})


def _charge_body(ctx: StepContext) -> Call:
    body = {"originalOperationId": _original_id(ctx), "amount": str(ctx.input.amount), "currency": ctx.input.currency}
    if ctx.input.description:
        body["description"] = ctx.input.description
    return Call(request=body)


def _charged(ctx: StepContext, answer: OperationResponse) -> Outcome:
    return Advance(answer.wire())


def _reservation_operations(ctx: StepContext, reservation_id: str) -> list[str]:
    """The operations the reservation holds now (the snapshot; the read kept for the charge's check)."""
    ctx.target_read = ctx.call(Catalogue.get_reservation, reservation_id)
    return [str(op.operationId) for op in ctx.target_read.operations]


#: A charge's target: its reservation (whose gateway order id is its id).
RESERVATION_TARGET = Target(lambda ctx: str(ctx.input.reservationId), _reservation_operations, "reservation")


def _charge(ctx: StepContext, send: Callable[[StepContext], Outcome]) -> Outcome:
    """The charge, checked again right before it is sent (:func:`_charge_refused`): after any sleep and
    wait, with the reservation held (``workflows.engine.targets``), so that every bound holds when the money
    moves, counting every other flow's charge (resolved, by then, and shown by the gateway)."""
    if ctx.target_read is None:  # the hold was kept from an earlier try: read the reservation now
        ctx.target_read = ctx.call(Catalogue.get_reservation, ctx.input.reservationId)
    refused = _charge_refused(ctx, ctx.target_read, when=charge_moment(ctx, ctx.now), charging=True)
    if refused is not None:
        return refused
    return send(ctx)


def _adopt_charge(ctx: StepContext) -> ReconcileResult:
    """A charge whose answer was lost: the reservation is read before the charge is sent again (never only
    the gateway's replay of the key, ``workflows.flows._adopt.adopt_made``); the charge is the one its
    snapshot did not list."""
    if never_sent(ctx):
        return NOT_COMMITTED
    found = _read_charged(ctx)
    if found is None:
        return UNCLEAR
    before = frozenset(ctx.output("original").get("before") or ())  # for a flow of an earlier release only
    types = frozenset({CHARGE_TYPE[ctx.kind]})
    return adopt_made(ctx, found.operations, types=types, before=before, amount=ctx.input.amount, currency=ctx.input.currency)


def _read_charged(ctx: StepContext) -> Any | None:
    try:
        return ctx.call(Catalogue.get_reservation, ctx.input.reservationId)
    except NotFound:
        return None


def charge_flow(kind: str, model: type[ChargeInput], description: str) -> FlowDefinition:
    """Read and check the reservation (:func:`_reservation_checked`), sleep until ``runAt`` (a delayed
    charge), validate, charge with the step's key, the reservation held and checked again
    (:class:`_Charge`; read back first after a lost answer), read the result."""
    steps: list[Any] = [
        call("original", Catalogue.get_reservation, lambda ctx: Call((ctx.input.reservationId,)), result=_reservation_checked)
    ]
    if kind == "delay_charge":
        steps.append(timer("timer", lambda ctx: ctx.input.runAt.timestamp() if ctx.input.runAt else None))
    steps += [
        call("validate", VALIDATIONS[(kind, "current")], lambda ctx: Call(), body=_validate),
        call(
            "charge", CHARGES[kind], _charge_body, result=_charged, adopt=_adopt_charge, target=RESERVATION_TARGET, body=_charge
        ),
        read_until_final("result", "charge", note="readBack"),
    ]
    # A no-show happens once per reservation: keyed by it, a second start is the first flow (or a conflict).
    once = (lambda data: f"no_show:{data.reservationId}") if kind == "no_show" else None
    return Flow(kind, model, tuple(steps), summarize, None, description, start_key=once)


NO_SHOW = charge_flow("no_show", ChargeInput, "no-show charge: reservation checked, validation, /no_shows, result read back")
INCREMENTAL = charge_flow(
    "incremental", ChargeInput, "incremental charge: reservation checked, validation, /incrementals, result read back"
)
DELAY_CHARGE = charge_flow(
    "delay_charge",
    DelayChargeInput,
    "delayed charge: reservation checked, durable timer to runAt, validation, /delay_charges, result read back",
)
