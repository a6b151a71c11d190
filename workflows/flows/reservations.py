"""Reservation guarantee ("Disputless"), the guest's side: a reservation with its pay-by-link, then charges.

The set-up calls (structures, agencies, conditions...) are the ``reservation_setup`` flow, in
``reservation_setup``.

* ``reservation`` - ``POST /reservations``, its pay-by-link, then a wait for the notification; at the
  deadline ``GET /reservations/{id}`` decides instead of a guess. Its outcome's operation is the
  *original operation* the later charges refer to.
* ``no_show``, ``incremental``, ``delay_charge`` - validation, then the charge with the step's
  Idempotency-Key, then ``GET /operations/{id}`` reads the result back. ``delay_charge`` first sleeps
  until ``runAt`` on the engine's due set (a durable timer, months if need be; ``engine.start(...,
  run_at=...)`` works too). Without ``originalOperationId`` the charge reads it from the reservation.

Every kind takes ``form``: ``current`` (default) or ``earlier``, the deprecated path forms (validations at
``/noshow_validation`` instead of ``/reservations/noshow_validation``, custom fields at ``/custom_fields``
instead of ``/structures/custom_fields``; the earlier forms have no agency endpoints). Where both forms
share a path (reservations, links, charges) it changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field

from gateway import (
    SUCCESS_RESULTS,
    Amount,
    CaptureType,
    Catalogue,
    Currency,
    GatewayModel,
    LenientEnum,
    NotFound,
    OperationResponse,
    OperationType,
    Reservation,
    ReservationIdResponse,
    Unknown,
)
from tasks.outcomes import Advance, Finish, Outcome
from tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from workflows.flows._common import read_until_final, summarize
from workflows.flows.sessions import ADOPTED_READ_SECONDS
from workflows.flows.waits import GRACE_SECONDS, adopted_read, cancel_link, judge_wait, link_end, notified, read_later
from workflows.steps import Call, CallStep, FlowDefinition, SleepStep, WaitStep

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


def _link_deadline(ctx: StepContext) -> float:
    """When to read the reservation: ``waitSeconds``, else the link's expiry; for an adopted link (its
    token was lost with the answer, so its notifications cannot be verified) within minutes, as for a
    pay-by-link (``workflows.flows.sessions``)."""
    if ctx.input.waitSeconds:
        return float(ctx.input.waitSeconds)
    expiry = (ctx.output("link").get("paymentLink") or {}).get("expirationDate") or ctx.input.linkExpirationDate
    seconds = max(60.0, link_end(str(expiry)) - ctx.now) if expiry else 30 * 86400.0
    return min(seconds, ADOPTED_READ_SECONDS) if ctx.output("link").get("adopted") else seconds


def _notified(ctx: StepContext, name: str, payload: dict[str, Any]) -> Outcome:
    """A verified notification: a success ends the wait; anything else is checked against the gateway."""
    return notified(ctx, name, payload, lambda ctx, outcome: outcome if outcome is not None else _payment_read(ctx))


def _link_of(ctx: StepContext) -> str | None:
    link = ctx.output("link").get("paymentLink")
    return str(link["linkId"]) if isinstance(link, dict) and link.get("linkId") else None


def _close_link(ctx: StepContext) -> None:
    cancel_link(ctx, _link_of(ctx))


def _payment_at_deadline(ctx: StepContext) -> Outcome:
    """At the deadline: the one rule for the end of a wait (``workflows.flows.waits``). A deadline the
    merchant set (``waitSeconds``) before the link's own expiry closes the link first."""
    if ctx.input.waitSeconds and not ctx.output("link").get("adopted"):
        _close_link(ctx)
    return _payment_read(ctx)


def _payment_read(ctx: StepContext) -> Outcome:
    """The one rule for the end of a wait (``workflows.flows.waits``), on the reservation."""
    found = _read_reservation(ctx)
    ends = ctx.created + (ctx.input.waitSeconds or 30 * 86400.0)  # fixed: never moves with the wait
    created = ctx.output("link").get("paymentLink") or {}
    if created.get("expirationDate"):
        ends = link_end(str(created["expirationDate"]))
    if found is None:  # it had a link: gone from a read is not the customer's end
        return read_later(ctx, ("notification",), ends + GRACE_SECONDS, "the reservation is not found", {"type": "NotFound"})
    links = list(found.paymentLinks)
    adopted = adopted_read(ctx, found.operations, links, adopted=bool(ctx.output("link").get("adopted")))
    judged = adopted or judge_wait(ctx, ("notification",), found.operations, links, ends=ends)
    return judged or Finish(False, "no payment by the deadline", error={"type": "Expired"})


def _reservation_summary(data: Any, outputs: Any) -> dict[str, Any]:
    return {**summarize(data, outputs), "reservationId": data.reservation.reservationId}


RESERVATION = FlowDefinition(
    "reservation",
    ReservationInput,
    (
        CallStep(
            "create",
            Catalogue.create_reservation,
            lambda ctx: Call(request={"reservation": ctx.input.reservation.wire()}),
            result=lambda ctx, answer: Advance(ReservationIdResponse.model_validate(answer.wire()).wire()),
            adopt=_adopt_reservation,
        ),
        CallStep(
            "link",
            Catalogue.create_reservation_paybylink,
            _link_request,
            adopt=_adopt_link,
            customer_url=lambda output: (output.get("paymentLink") or {}).get("link"),
        ),
        WaitStep(
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
)


# -- no-show, incremental and delayed charges -----------------------------------------------------------


class ChargeInput(GatewayModel):
    reservationId: str = Field(min_length=1, max_length=27)
    originalOperationId: str | None = Field(default=None, min_length=1, description="read from the reservation when omitted")
    amount: Amount = Field(ge=1)
    currency: Currency
    description: str | None = Field(default=None, max_length=255)
    form: Form = "current"


class DelayChargeInput(ChargeInput):
    runAt: AwareDatetime | None = Field(
        default=None, description="ISO 8601 with offset: when to charge (e.g. check-out + 2 days)"
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


def _original_result(ctx: StepContext, answer: Any) -> Outcome:
    for operation in answer.operations:
        if operation.operationResult in SUCCESS_RESULTS and operation.operationType not in CHARGE_TYPES:
            return Advance({"originalOperationId": operation.operationId})
    return Finish(False, f"reservation {ctx.input.reservationId} has no paid original operation", error={"type": "NotPaid"})


def _original_id(ctx: StepContext) -> str:
    return str(ctx.input.originalOperationId or ctx.output("original")["originalOperationId"])


class _Validate(CallStep):
    """The validation of the flow's kind, on the path form the input asks for."""

    def execute(self, ctx: StepContext) -> Outcome:
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


def charge_flow(kind: str, model: type[ChargeInput], description: str) -> FlowDefinition:
    steps: list[Any] = []
    if kind == "delay_charge":
        steps.append(SleepStep("timer", lambda ctx: ctx.input.runAt.timestamp() if ctx.input.runAt else None))
    steps += [
        CallStep(
            "original",
            Catalogue.get_reservation,
            lambda ctx: Call((ctx.input.reservationId,)),
            result=_original_result,
            when=lambda ctx: ctx.input.originalOperationId is None,
        ),
        _Validate("validate", VALIDATIONS[(kind, "current")], lambda ctx: Call()),
        CallStep("charge", CHARGES[kind], _charge_body, result=_charged),
        read_until_final("result", "charge", note="readBack"),
    ]
    return FlowDefinition(kind, model, tuple(steps), summarize, None, description)


NO_SHOW = charge_flow("no_show", ChargeInput, "no-show charge: validation, /no_shows, result read back")
INCREMENTAL = charge_flow("incremental", ChargeInput, "incremental charge: validation, /incrementals, result read back")
DELAY_CHARGE = charge_flow(
    "delay_charge", DelayChargeInput, "delayed charge: durable timer to runAt, validation, /delay_charges, result read back"
)
