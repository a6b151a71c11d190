"""``/flows``: start a flow of any kind, read, list, history, signal, cancel, retry.

One ``POST /flows/<kind>`` route per flow kind, each declaring that kind's input model: the OpenAPI
document then shows every kind's fields, and a bad field is a 422 naming it before anything is
written. ``Idempotency-Key`` is the engine's start key: the same key and body give the same flow; the
same key with another body is a 409.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from config.settings import ApiSettings
from service.errors import ErrorBody, conflict, invalid, not_found
from service.timeparse import parse_time
from service.views import flow_brief, flow_view
from workflows.engine import Engine, InputError, NotFound, OperatorError, StartConflict
from workflows.states import FlowState
from workflows.steps import FlowDefinition
from workflows.store import FlowRecord

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    409: {"model": ErrorBody},
    422: {"model": ErrorBody},
}
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=200, description="Same key and body: the same flow."),
]
FlowId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$")]


class FlowList(BaseModel):
    flows: list[dict[str, Any]]
    limit: int
    offset: int
    next_offset: int | None


class SignalAnswer(BaseModel):
    result: str = Field(description="resumed (the flow was waiting for it) or stored (kept until it waits)")
    flow: dict[str, Any]


class CancelRequest(BaseModel):
    reason: str = Field(default="cancelled by operator", min_length=1, max_length=500)


def _uses_customer_url(definition: FlowDefinition) -> bool:
    return any(step.customer_url is not None for step in definition.steps)


def _settled(record: FlowRecord, first_step: str) -> bool:
    """The customer URL is known, or will not come from the first step (it moved on or stopped)."""
    return bool(
        record.customer_url
        or record.step != first_step
        or record.state not in {FlowState.READY, FlowState.RUNNING, FlowState.RETRYING}
    )


def _pauses(engine: Engine, record: FlowRecord, seconds: float) -> Iterator[float]:
    """The rhythm both waits poll at (10 ms growing to 100 ms), for ``seconds`` at most; nothing when
    the flow kind shows no customer URL."""
    if seconds <= 0 or not _uses_customer_url(engine.registry[record.kind]):
        return
    deadline = time.monotonic() + seconds
    pause = 0.01
    while time.monotonic() < deadline:
        yield pause
        pause = min(pause * 1.5, 0.1)


def wait_for_customer_url(engine: Engine, record: FlowRecord, seconds: float) -> FlowRecord:
    """Poll briefly until the flow has a customer URL, has moved past its first step, or stopped."""
    first_step = record.step
    for pause in _pauses(engine, record, seconds):
        if _settled(record, first_step):
            break
        time.sleep(pause)
        record = engine.get(record.id)
    return record


async def await_customer_url(engine: Engine, record: FlowRecord, seconds: float) -> FlowRecord:
    """:func:`wait_for_customer_url` for the API: sleeps without holding a thread, so that many waiting
    starts never starve the receiver of the thread pool."""
    first_step = record.step
    for pause in _pauses(engine, record, seconds):
        if _settled(record, first_step):
            break
        await asyncio.sleep(pause)
        record = await run_in_threadpool(engine.get, record.id)
    return record


def _get(engine: Engine, flow_id: str) -> FlowRecord:
    try:
        return engine.get(flow_id)
    except NotFound:
        raise not_found(f"no flow {flow_id!r}") from None


def _start_route(
    engine: Engine, settings: ApiSettings, kind: str, model: type[BaseModel]
) -> Callable[..., Awaitable[dict[str, Any]]]:
    async def start(
        body: Any,
        idempotency_key: IdempotencyKey = None,
        wait: Annotated[float | None, Query(ge=0, le=60, description="Seconds to wait for the customer URL.")] = None,
        run_at: Annotated[str | None, Query(description="Run later: POSIX seconds or ISO 8601 (a durable timer).")] = None,
    ) -> dict[str, Any]:
        when = None
        if run_at is not None:
            try:
                when = parse_time(run_at, now=engine.clock.now())
            except ValueError as exc:
                raise invalid("query.run_at", str(exc)) from None
        try:
            record = await run_in_threadpool(engine.start, kind, body, idempotency_key, run_at=when)
        except InputError as exc:
            raise invalid(exc.field, exc.reason) from None
        except StartConflict as exc:
            raise conflict(str(exc)) from None
        record = await await_customer_url(engine, record, settings.start_wait_seconds if wait is None else wait)
        return flow_view(record, engine.registry)

    # FastAPI reads the body's model from the signature: give it this kind's input model.
    signature = inspect.signature(start, eval_str=True)
    parameters = [
        p.replace(annotation=Annotated[model, Body()]) if p.name == "body" else p for p in signature.parameters.values()
    ]
    start.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    start.__name__ = f"start_{kind}"
    return start


def flows_router(engine: Engine, settings: ApiSettings) -> APIRouter:
    router = APIRouter(prefix="/flows", tags=["flows"], responses=ERRORS)

    for kind, definition in sorted(engine.registry.items()):
        router.add_api_route(
            f"/{kind}",
            _start_route(engine, settings, kind, definition.input_model),
            methods=["POST"],
            status_code=201,
            summary=f"Start a {kind} flow",
            description=definition.description or kind,
        )

    @router.post("/{kind}", include_in_schema=False)
    def start_unknown(kind: str) -> None:
        raise invalid("kind", f"unknown flow kind {kind!r}; known kinds: {', '.join(sorted(engine.registry))}")

    @router.get("", response_model=FlowList, summary="List flows, newest first")
    def list_flows(
        state: Annotated[FlowState | None, Query()] = None,
        kind: Annotated[str | None, Query(max_length=64)] = None,
        since: Annotated[str | None, Query(description="POSIX seconds, ISO 8601, or an age: 15m, 2h, 7d")] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    ) -> dict[str, Any]:
        if kind is not None and kind not in engine.registry:
            raise invalid("query.kind", f"unknown flow kind; known kinds: {', '.join(sorted(engine.registry))}")
        start = None
        if since is not None:
            try:
                start = parse_time(since, now=engine.clock.now())
            except ValueError as exc:
                raise invalid("query.since", str(exc)) from None
        records = engine.list(state=state, kind=kind, since=start, limit=limit + 1, offset=offset)
        more = len(records) > limit
        return {
            "flows": [flow_brief(record) for record in records[:limit]],
            "limit": limit,
            "offset": offset,
            "next_offset": offset + limit if more else None,
        }

    @router.get("/{flow_id}", summary="One flow: state, step, outputs, outcome, error")
    def get_flow(flow_id: FlowId) -> dict[str, Any]:
        return flow_view(_get(engine, flow_id), engine.registry)

    @router.get("/{flow_id}/history", summary="Every transition of the flow, oldest first")
    def flow_history(flow_id: FlowId) -> dict[str, Any]:
        try:
            return {"id": flow_id, "history": engine.history(flow_id)}
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None

    @router.post(
        "/{flow_id}/signals/{name}", response_model=SignalAnswer, summary="Deliver a signal (3ds_result, form_completed)"
    )
    def signal_flow(
        flow_id: FlowId,
        name: Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_]{0,39}$")],
        payload: Annotated[dict[str, Any] | None, Body(description="The signal's payload, a JSON object")] = None,
    ) -> dict[str, Any]:
        if name == "notification":
            # A notification is money's word only when its security token was checked: the receiver's.
            raise invalid("name", "notification signals come only through the notification receiver (token checked)")
        try:
            result = engine.signal(flow_id, name, payload or {}, by="api")
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        if result == "finished":
            record = _get(engine, flow_id)
            raise conflict(f"flow {flow_id} already ended ({record.state.value}); the signal was not delivered")
        return {"result": result, "flow": flow_view(_get(engine, flow_id), engine.registry)}

    @router.post("/{flow_id}/cancel", summary="Cancel now, or at the end of the step in flight")
    def cancel_flow(flow_id: FlowId, request: Annotated[CancelRequest | None, Body()] = None) -> dict[str, Any]:
        reason = request.reason if request else CancelRequest().reason
        try:
            return flow_view(engine.cancel(flow_id, reason, by="api"), engine.registry)
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        except OperatorError as exc:
            raise conflict(str(exc)) from None

    @router.post("/{flow_id}/retry", summary="Move a failed or needs_attention flow on")
    def retry_flow(flow_id: FlowId) -> dict[str, Any]:
        try:
            return flow_view(engine.retry(flow_id, by="api"), engine.registry)
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        except OperatorError as exc:
            raise conflict(str(exc)) from None

    return router
