"""``/bulk``: retry or cancel every flow a filter matches (``workflows.bulk``).

``POST /bulk/dry-run`` answers what the action would do (the count, a sample with each flow's money, the
money at stake by currency, what would be skipped and why) and changes no flow; it keeps the flows it
listed for its confirmation. ``POST /bulk`` records the action and answers 202 at once with its progress,
a runner acting in the background. The dry run answers a ``plan`` token of its own, which the action
confirming it carries: it then acts on the dry run's flows only, each as it was shown (a flow changed
since is skipped as ``changed``); the same ``plan`` (or the same ``Idempotency-Key``) posted again answers
the same record, progress included; a new dry run is a new action; a ``plan`` for another action or
filter, or no longer kept, is a 409. ``GET /bulk/{id}`` follows it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query
from pydantic import Field, create_model

from durapay.gateway import StrictInput
from durapay.gateway._strict import did_you_mean
from durapay.service.api_kinds import who
from durapay.service.errors import ERRORS, ApiError, conflict, invalid, not_found
from durapay.service.ops_schemas import BulkList, BulkPlan, BulkRequest, BulkView
from durapay.service.timeparse import parse_since
from durapay.workflows.bulk import FILTERS, BulkActions, BulkFilter, TooMany, Unconfirmable, UnknownBulk
from durapay.workflows.engine import Engine, UnknownTerminal

BulkId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$")]


def request_model(engine: Engine) -> type[BulkRequest]:
    """:class:`BulkRequest` with ``kind`` one of the engine's kinds (the OpenAPI document lists them; a
    misspelt one is refused naming the closest)."""
    kinds = StrEnum("FlowKind", {kind: kind for kind in sorted(engine.registry)})  # type: ignore[misc]
    model: type[BulkRequest] = create_model("BulkRequest", __base__=BulkRequest, kind=(kinds | None, Field(default=None)))
    return model


def bulk_filter(engine: Engine, request: BulkRequest) -> BulkFilter:
    """The request's filter with its times resolved; an unknown kind refused (:class:`ValueError` as
    ``field: reason``: the Python and CLI callers give a kind as text)."""
    if request.kind is not None and str(request.kind) not in engine.registry:
        known = sorted(engine.registry)
        hint = did_you_mean(str(request.kind), known)
        raise ValueError(f"kind: unknown flow kind {request.kind!r}{hint} (known: {', '.join(known)})")
    if request.terminal is not None and request.terminal not in engine.terminals.names:
        raise ValueError(f"terminal: {UnknownTerminal(request.terminal, engine.terminals.names)}")
    now = engine.clock.now()
    times: dict[str, float | None] = {}
    for name in ("since", "until"):
        text = getattr(request, name)
        try:
            times[name] = parse_since(text, now=now) if text is not None else None
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    kind = str(request.kind) if request.kind is not None else None
    return BulkFilter(kind, request.state, request.error, times["since"], times["until"], request.terminal)


def given(request: BulkRequest) -> dict[str, Any]:
    """The filter as the caller gave it (what the action's id is derived from)."""
    return {name: str(value) for name in FILTERS if (value := getattr(request, name)) is not None}


def _refused(exc: ValueError) -> ApiError:
    field, _, reason = str(exc).partition(": ")
    return invalid(field, reason)


def _with_body(route: Callable[..., dict[str, Any]], model: type[BulkRequest]) -> Callable[..., dict[str, Any]]:
    """FastAPI reads the body's model from the signature: give it the model whose kinds are the engine's."""
    signature = inspect.signature(route, eval_str=True)
    parameters = [
        p.replace(annotation=Annotated[model, StrictInput(), Body()]) if p.name == "body" else p
        for p in signature.parameters.values()
    ]
    route.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return route


def bulk_router(engine: Engine, bulk: BulkActions) -> APIRouter:
    router = APIRouter(prefix="/bulk", tags=["bulk"], responses=ERRORS)
    model = request_model(engine)

    def dry_run(body: Any) -> dict[str, Any]:
        request: BulkRequest = body
        try:
            return bulk.plan(request.action, bulk_filter(engine, request), asked=given(request)).view()
        except TooMany as exc:
            raise invalid("(body)", str(exc)) from None
        except ValueError as exc:
            raise _refused(exc) from None

    def post(
        body: Any,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
    ) -> dict[str, Any]:
        request: BulkRequest = body
        try:
            wanted = bulk_filter(engine, request)
            return bulk.post(
                request.action, wanted, by=who("api", request.by), given=given(request), key=idempotency_key, plan=request.plan
            )
        except Unconfirmable as exc:
            raise conflict(str(exc)) from None
        except TooMany as exc:
            raise invalid("(body)", str(exc)) from None
        except ValueError as exc:
            raise _refused(exc) from None

    router.post(
        "/dry-run",
        response_model=BulkPlan,
        summary="What a bulk retry or cancel would do: the count, a sample, the money at stake, what it would skip and why",
        description="Changes no flow. Keeps the flows it lists, each with its state and version, for an hour: the "
        "action confirming its `plan` acts on those only. 422 for a filter that matches more than "
        "DURAPAY_BULK__MAX_FLOWS flows (narrow it).",
    )(_with_body(dry_run, model))
    router.post(
        "",
        status_code=202,
        response_model=BulkView,
        summary="Retry or cancel every flow the filter matches, in the background",
        description="Answers at once with the action's progress (`done` + `skipped` of `total`); each flow is retried "
        "or cancelled exactly as its own route would (a flow with money in flight is asked to cancel and ends as the "
        "engine allows), at DURAPAY_BULK__RATE flows a second, its history naming the action. Send the dry run's `plan` "
        "with the same action and filter: the action acts on the flows that dry run listed, each only if it has not "
        "changed since (another state or version: skipped, counted in `changed`); the same `plan` again (or the same "
        "Idempotency-Key) answers the same action, a new dry run's is a new action; with neither, each post is a new "
        "action on the flows matching then; a plan for another action or filter, one no longer kept (an hour) or a key "
        "reused for another action or filter is a 409.",
    )(_with_body(post, model))

    @router.get("", response_model=BulkList, summary="Bulk actions, newest first")
    def listing(limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
        return {"bulk": bulk.list(limit)}

    @router.get("/{bulk_id}", response_model=BulkView, summary="One bulk action and its progress")
    def one(bulk_id: BulkId) -> dict[str, Any]:
        try:
            return bulk.get(bulk_id)
        except UnknownBulk:
            raise not_found(f"no bulk action {bulk_id!r}") from None

    return router
