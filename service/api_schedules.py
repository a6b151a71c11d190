"""``/schedules``: recurring MIT charges. Create, read, list, history, pause, resume, change the amount,
cancel (``DELETE`` is a cancel, not an erase: the record and its history are kept for
``DURAPAY_SCHEDULES__RETENTION``), and resolve an occurrence whose flow is gone (what the gateway
shows: ``charged`` or ``not_charged``).

The body of ``POST /schedules`` is ``workflows.schedules.ScheduleInput``; ``Idempotency-Key`` makes a
create idempotent exactly as for flows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query
from pydantic import AfterValidator, Field

from durapay.gateway import Amount, StrictInput, StrictModel
from durapay.service.errors import ERRORS, conflict, invalid, not_found
from durapay.service.schemas import History, ScheduleList, ScheduleView
from durapay.workflows.engine import InputError, NotFound, OperatorError, StartConflict, merchant_identifier
from durapay.workflows.schedules import Resolution, ScheduleInput, ScheduleRecord, Schedules, ScheduleState

ScheduleId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$")]


class AmountChange(StrictModel):
    amount: Amount  # from the next occurrence on; described by Amount: its bound in each currency


class CancelRequest(StrictModel):
    reason: str = Field(default="cancelled by operator", min_length=1, max_length=500)


def _act(action: Callable[[], ScheduleRecord], schedule_id: str) -> dict[str, Any]:
    try:
        return action().summary()
    except NotFound:
        raise not_found(f"no schedule {schedule_id!r}") from None
    except InputError as exc:
        raise invalid(exc.field, exc.reason) from None
    except OperatorError as exc:
        raise conflict(str(exc)) from None


def schedules_router(schedules: Schedules) -> APIRouter:
    router = APIRouter(prefix="/schedules", tags=["schedules"], responses=ERRORS)

    @router.post("", status_code=201, response_model=ScheduleView, summary="Create a schedule")
    def create_schedule(
        body: Annotated[ScheduleInput, StrictInput(), Body()],
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200), AfterValidator(merchant_identifier)
        ] = None,
    ) -> dict[str, Any]:
        try:
            return schedules.create(body, key=idempotency_key).summary()
        except InputError as exc:
            raise invalid(exc.field, exc.reason) from None
        except StartConflict as exc:
            raise conflict(str(exc)) from None

    @router.get("", response_model=ScheduleList, summary="List schedules, newest first")
    def list_schedules(
        state: Annotated[ScheduleState | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    ) -> dict[str, Any]:
        records = schedules.list(state=state.value if state else None, limit=limit + 1, offset=offset)
        more = len(records) > limit
        return {
            "schedules": [record.summary() for record in records[:limit]],
            "limit": limit,
            "offset": offset,
            "next_offset": offset + limit if more else None,
        }

    @router.get("/{schedule_id}", response_model=ScheduleView, summary="One schedule: rule, next run, counts, open attempts")
    def get_schedule(schedule_id: ScheduleId) -> dict[str, Any]:
        return _act(lambda: schedules.get(schedule_id), schedule_id)

    @router.get("/{schedule_id}/history", response_model=History, summary="Every event of the schedule, oldest first")
    def schedule_history(schedule_id: ScheduleId) -> dict[str, Any]:
        try:
            return {"id": schedule_id, "history": schedules.history(schedule_id)}
        except NotFound:
            raise not_found(f"no schedule {schedule_id!r}") from None

    @router.patch("/{schedule_id}", response_model=ScheduleView, summary="Change the amount from the next occurrence on")
    def change_amount(schedule_id: ScheduleId, change: AmountChange) -> dict[str, Any]:
        return _act(lambda: schedules.change_amount(schedule_id, change.amount, by="api"), schedule_id)

    @router.post("/{schedule_id}/pause", response_model=ScheduleView, summary="Pause: fire nothing until resumed")
    def pause(schedule_id: ScheduleId) -> dict[str, Any]:
        return _act(lambda: schedules.pause(schedule_id, by="api"), schedule_id)

    @router.post(
        "/{schedule_id}/resume",
        response_model=ScheduleView,
        summary="Resume a paused or needs_attention schedule",
        description="409 for a needs_attention schedule with an occurrence whose flow is gone: resolve it first.",
    )
    def resume(schedule_id: ScheduleId) -> dict[str, Any]:
        return _act(lambda: schedules.resume(schedule_id, by="api"), schedule_id)

    @router.post(
        "/{schedule_id}/resolve",
        response_model=ScheduleView,
        summary="Say what the gateway shows for an occurrence whose flow is gone (charged or not_charged)",
        description="For a `needs_attention` schedule whose occurrence's flow expired before its outcome was read: "
        "`charged` counts it as a charge (`last` names it, with `operationId` if given); `not_charged` closes it "
        "without a charge. Either way the occurrence is never fired again (never charged twice); then resume. "
        "409 for a schedule not in `needs_attention`, an occurrence with no open attempt, or a flow that still "
        "exists (its own outcome decides).",
    )
    def resolve(schedule_id: ScheduleId, body: Annotated[Resolution, StrictInput(), Body()]) -> dict[str, Any]:
        return _act(
            lambda: schedules.resolve(schedule_id, body.occurrence, body.outcome, operation_id=body.operationId, by="api"),
            schedule_id,
        )

    @router.post("/{schedule_id}/cancel", response_model=ScheduleView, summary="Cancel: no further charges")
    def cancel(schedule_id: ScheduleId, request: Annotated[CancelRequest | None, Body()] = None) -> dict[str, Any]:
        reason = request.reason if request else CancelRequest().reason
        return _act(lambda: schedules.cancel(schedule_id, reason, by="api"), schedule_id)

    @router.delete("/{schedule_id}", response_model=ScheduleView, summary="Cancel (kept for the schedules' retention)")
    def delete(schedule_id: ScheduleId) -> dict[str, Any]:
        return _act(lambda: schedules.cancel(schedule_id, "cancelled by operator", by="api"), schedule_id)

    return router
