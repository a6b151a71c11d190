"""``/kinds`` and ``/pauses``: pause and resume a flow kind (a maintenance window), and the audit list.

While a kind is paused none of its flows runs a step; they wait where they are and go on at the resume
(``workflows.pauses``). An unknown kind is a 404 naming the closest, as ``POST /flows/{kind}`` does. A
read-only key may list; pausing and resuming need an operator key (the gate's rule for every POST).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query

from durapay.gateway import StrictInput
from durapay.service.errors import ERRORS, ApiError, conflict
from durapay.service.ops_schemas import KindList, KindView, PauseLog, PauseRequest, ResumeRequest
from durapay.workflows.engine import Engine
from durapay.workflows.pauses import NotPaused, UnknownKind

KindName = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$")]


def who(surface: str, name: str | None) -> str:
    """``by`` as recorded: the surface (api, cli, console), and the person's name when given."""
    return f"{surface}:{name}" if name else surface


def kind_views(engine: Engine, only: str | None = None) -> list[dict[str, Any]]:
    """Every flow kind (or ``only``), with its pause and the flows it holds: the API's, the CLI's and the
    console's one reading."""
    paused = engine.pauses.paused()
    kinds = [only] if only is not None else sorted(engine.registry)
    held = engine.pauses.held_counts(kind for kind in kinds if kind in paused)
    return [
        {
            "kind": kind,
            "description": engine.registry[kind].description,
            "paused": kind in paused,
            "pause": paused[kind].view() if kind in paused else None,
            "held": held.get(kind, 0),
        }
        for kind in kinds
    ]


def _unknown(exc: UnknownKind) -> ApiError:
    return ApiError(404, "not_found", str(exc))


def kinds_router(engine: Engine) -> APIRouter:
    router = APIRouter(tags=["kinds"], responses=ERRORS)

    @router.get("/kinds", response_model=KindList, summary="The flow kinds, each with its pause if paused")
    def list_kinds() -> dict[str, Any]:
        return {"kinds": kind_views(engine)}

    @router.post(
        "/kinds/{kind}/pause",
        response_model=KindView,
        summary="Pause a flow kind: none of its flows runs a step until it is resumed",
        description="Flows wait where they are (nothing ends; money in flight stays recorded); signals are recorded and "
        "read after the resume; schedules of the kind fire nothing and their occurrences follow their `missed` policy "
        "at the resume. A pause in force is answered as it is. 404 for an unknown kind (naming the closest).",
    )
    def pause(kind: KindName, body: Annotated[PauseRequest, StrictInput(), Body()]) -> dict[str, Any]:
        try:
            engine.pauses.pause(kind, body.reason, by=who("api", body.by))
        except UnknownKind as exc:
            raise _unknown(exc) from None
        return kind_views(engine, kind)[0]

    @router.post(
        "/kinds/{kind}/resume",
        response_model=KindView,
        summary="Resume a paused flow kind: its flows go on at once",
        description="`released`: the flows the pause held that are due again now. 409 when the kind is not paused.",
    )
    def resume(kind: KindName, body: Annotated[ResumeRequest | None, Body()] = None) -> dict[str, Any]:
        try:
            released = engine.pauses.resume(kind, by=who("api", body.by if body else None))
        except UnknownKind as exc:
            raise _unknown(exc) from None
        except NotPaused as exc:
            raise conflict(str(exc)) from None
        return {**kind_views(engine, kind)[0], "released": released}

    @router.get("/pauses", response_model=PauseLog, summary="Pauses and resumes, newest first (who, when, why)")
    def pauses(limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
        return {"pauses": engine.pauses.log(limit)}

    return router
