"""``/flows``: start a flow of any kind, read, list, history, signal, cancel, retry, refund a late payment.

One ``POST /flows/<kind>`` route per flow kind, each declaring that kind's input model, read strictly
(``gateway._strict``): the OpenAPI document shows every kind's fields, and an unknown or misspelt field
or value is a 422 naming it before anything is written. ``Idempotency-Key`` is the engine's start key:
the same key and body give the same flow; the same key with another body is a 409.

Signals get one route per name a flow kind may be sent from here (``workflows.engine.signals``), each with
its payload's model; ``notification`` has none (only the receiver delivers it).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query, Response
from pydantic import AfterValidator, BaseModel, Field
from starlette.concurrency import run_in_threadpool

from durapay.config.settings import ApiSettings
from durapay.gateway import StrictInput, StrictModel, closest
from durapay.service.errors import ERRORS, ApiError, conflict, invalid, not_found
from durapay.service.schemas import FlowList, FlowView, History, SignalAnswer
from durapay.service.timeparse import RUN_AT_FORMS, RUN_AT_PATTERN, SINCE_FORMS, SINCE_PATTERN, parse_run_at, parse_since
from durapay.service.views import flow_brief, flow_view
from durapay.workflows.engine import (
    RULES,
    TENANT_PATTERN,
    TENANT_RULE,
    Engine,
    FlowDefinition,
    FlowRecord,
    FlowState,
    InputError,
    NotFound,
    OperatorError,
    OrderIdTaken,
    SignalRefused,
    StartConflict,
    UnknownTerminal,
    accepted,
    may_send,
    merchant_identifier,
)
from durapay.workflows.flows.examples import MAKERS, Example, example
from durapay.workflows.listing import CURSOR_PATTERN, BadCursor

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        description="Same key and body: the same flow. Shown whole, so never one that looks like a card number.",
    ),
    AfterValidator(merchant_identifier),
]
FlowId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$")]
#: The order id of the OpenAPI document's examples (fixed: the document is one text).
OPENAPI_TAG = "exopenapi1"


class CancelRequest(StrictModel):
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


def refused(engine: Engine, flow_id: str, exc: Exception) -> ApiError:
    """The 409 of an operator's request on a flow its state does not allow: its reason may name the
    flow's gateway operations, identifiers kept whole (``FlowRecord.identifiers``); any other card number
    in it is masked (``errors.error_response``)."""
    record = engine.store.get(flow_id)
    return conflict(str(exc), keep=record.identifiers if record is not None else frozenset())


def _start_route(
    engine: Engine, settings: ApiSettings, kind: str, model: type[BaseModel], made: Example | None
) -> Callable[..., Awaitable[dict[str, Any]]]:
    async def start(
        body: Any,
        idempotency_key: IdempotencyKey = None,
        wait: Annotated[float | None, Query(ge=0, le=60, description="Seconds to wait for the customer URL.")] = None,
        run_at: Annotated[
            str | None,
            Query(description=f"Run later (a durable timer): {RUN_AT_FORMS}.", json_schema_extra={"pattern": RUN_AT_PATTERN}),
        ] = None,
        terminal: Annotated[
            str | None,
            Query(
                description="The gateway terminal whose key and gate every call of the flow uses (DURAPAY_TERMINALS; "
                "none: default). An unknown one is refused (422) naming the known ones, before anything is written.",
                max_length=32,
            ),
        ] = None,
        tenant: Annotated[
            str | None,
            Query(
                description=f"The merchant's tenant on a platform ({TENANT_RULE}): with the terminal, the key the "
                "steps are dispatched fairly by (docs/operations.md, Fairness).",
                json_schema_extra={"pattern": TENANT_PATTERN.pattern},
            ),
        ] = None,
    ) -> dict[str, Any]:
        when = None
        if run_at is not None:
            try:
                when = parse_run_at(run_at, now=engine.clock.now())
            except ValueError as exc:
                raise invalid("query.run_at", str(exc)) from None
        try:
            record = await run_in_threadpool(
                engine.start,
                kind,
                body,
                idempotency_key,
                run_at=when,
                run_at_asked=run_at or "",
                terminal=terminal,
                tenant=tenant,
            )
        except InputError as exc:
            raise invalid(f"query.{exc.field}" if exc.field in ("terminal", "tenant") else exc.field, exc.reason) from None
        except OrderIdTaken as exc:  # another flow's order id: a conflict with what exists, naming the field
            raise ApiError(409, "conflict", exc.reason, field=exc.field) from None
        except StartConflict as exc:
            raise conflict(str(exc)) from None
        record = await await_customer_url(engine, record, settings.start_wait_seconds if wait is None else wait)
        return flow_view(record, engine.registry)

    # FastAPI reads the body's model from the signature: give it this kind's input model.
    signature = inspect.signature(start, eval_str=True)
    parameters = [
        p.replace(annotation=Annotated[model, StrictInput(), Body(openapi_examples=_examples(kind, made))])
        if p.name == "body"
        else p
        for p in signature.parameters.values()
    ]
    start.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    start.__name__ = f"start_{kind}"
    return start


def _examples(kind: str, made: Example | None) -> dict[str, Any] | None:
    """The OpenAPI document's example of ``POST /flows/{kind}`` (``workflows.flows.examples``; none for a
    kind of a test's own registry): it starts as is against ``durapay dev`` (once: its order id is fixed
    here, ``durapay flows kinds KIND --example`` gives a fresh one each time)."""
    if made is None:
        return None
    again = f"a second start needs another order id: durapay flows kinds {kind} --example gives a fresh one"
    said = f"To act on your own object, replace {made.needs}." if made.needs else again
    return {
        "example": {"summary": f"a {kind} flow", "description": f"Starts as is against durapay dev. {said}", "value": made.data}
    }


def _documented(kind: str) -> Example | None:
    return example(kind, tag=OPENAPI_TAG) if kind in MAKERS else None


def _signal_route(deliver: Callable[[str, str, Any], dict[str, Any]], name: str) -> Callable[..., dict[str, Any]]:
    """The route of one signal name, its body typed by the signal's payload model (read strictly)."""
    rule = RULES.get(name)

    def signal(flow_id: FlowId, payload: Any = None) -> dict[str, Any]:
        data = payload.model_dump(exclude_none=True) if isinstance(payload, BaseModel) else payload
        return deliver(flow_id, name, data)

    body: Any
    if rule is not None and rule.payload is not None and rule.payload_required:
        body = Annotated[rule.payload, StrictInput(), Body(description=rule.description)]
    elif rule is not None and rule.payload is not None:
        body = Annotated[Annotated[rule.payload, StrictInput()] | None, Body(description=rule.description)]
    else:
        body = Annotated[dict[str, Any] | None, Body(description="the signal's payload, a JSON object")]
    signature = inspect.signature(signal, eval_str=True)
    parameters = [p.replace(annotation=body) if p.name == "payload" else p for p in signature.parameters.values()]
    signal.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    signal.__name__ = f"signal_{name}"
    return signal


def flows_router(engine: Engine, settings: ApiSettings) -> APIRouter:
    router = APIRouter(prefix="/flows", tags=["flows"], responses=ERRORS)

    for kind, definition in sorted(engine.registry.items()):
        router.add_api_route(
            f"/{kind}",
            _start_route(
                engine, settings, kind, definition.input_model, example(kind, tag=OPENAPI_TAG) if kind in MAKERS else None
            ),
            methods=["POST"],
            status_code=201,
            response_model=FlowView,
            summary=f"Start a {kind} flow",
            description=definition.description or kind,
        )

    @router.get(
        "",
        response_model=FlowList,
        summary="List flows, newest first, a page at a time (after= the next of a page)",
        description="Newest by creation (with `state`: by the flow's last change), then by id; `since`: created since. "
        "Each page answers `next`, the cursor to pass as `after=` for the following page (null at the end): a position, "
        "not a count, so flows started meanwhile never shift or repeat a page. With `state`, a flow that changes between "
        "two pages moves to the top (a listing from the top shows it). A request reads a bounded number of index "
        "entries: a page may be short, even empty, with a `next`; follow it until `next` is null.",
    )
    def list_flows(
        state: Annotated[FlowState | None, Query()] = None,
        kind: str | None = Query(default=None, json_schema_extra={"enum": sorted(engine.registry)}),
        since: Annotated[
            str | None, Query(description=f"Created since: {SINCE_FORMS}.", json_schema_extra={"pattern": SINCE_PATTERN})
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        after: Annotated[
            str | None, Query(description="the `next` of a page", json_schema_extra={"pattern": CURSOR_PATTERN})
        ] = None,
        terminal: Annotated[
            str | None, Query(description="Only flows of this gateway terminal (DURAPAY_TERMINALS; default included).")
        ] = None,
    ) -> dict[str, Any]:
        if kind is not None and kind not in engine.registry:
            raise invalid("query.kind", f"unknown flow kind; known kinds: {', '.join(sorted(engine.registry))}")
        if terminal is not None and terminal not in engine.terminals.names:
            raise invalid("query.terminal", str(UnknownTerminal(terminal, engine.terminals.names)))
        start = None
        if since is not None:
            try:
                start = parse_since(since, now=engine.clock.now())
            except ValueError as exc:
                raise invalid("query.since", str(exc)) from None
        try:
            page = engine.list(state=state, kind=kind, since=start, limit=limit, after=after, terminal=terminal)
        except BadCursor as exc:
            raise invalid("query.after", str(exc)) from None
        return {"flows": [flow_brief(record) for record in page], "limit": limit, "next": page.next}

    @router.get("/{flow_id}", response_model=FlowView, summary="One flow: state, step, outputs, outcome, error")
    def get_flow(flow_id: FlowId) -> dict[str, Any]:
        record = _get(engine, flow_id)
        return flow_view(record, engine.registry, engine.store.marks(flow_id), refunding=engine.refund_under_way(record))

    @router.get("/{flow_id}/history", response_model=History, summary="Every transition of the flow, oldest first")
    def flow_history(flow_id: FlowId) -> dict[str, Any]:
        try:
            return {"id": flow_id, "history": engine.history(flow_id)}
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None

    def deliver(flow_id: str, name: str, payload: Any) -> dict[str, Any]:
        try:
            result = engine.signal(flow_id, name, payload, by="api")
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        except SignalRefused as exc:
            raise invalid(exc.field, exc.reason) from None
        if result == "finished":
            record = _get(engine, flow_id)
            raise conflict(f"flow {flow_id} already ended ({record.state.value}); the signal was not delivered")
        return {"result": result, "flow": flow_view(_get(engine, flow_id), engine.registry)}

    names = sorted({name for definition in engine.registry.values() for name in accepted(definition)})
    for name in names:
        if may_send(name, "api"):
            router.add_api_route(
                f"/{{flow_id}}/signals/{name}",
                _signal_route(deliver, name),
                methods=["POST"],
                response_model=SignalAnswer,
                summary=f"Deliver a {name} signal",
                description=RULES[name].description if name in RULES else f"the {name} signal",
            )

    @router.post(
        "/{flow_id}/cancel",
        response_model=FlowView,
        summary="Cancel now, at the end of the step in flight, or once the gateway shows no money moved",
        description="200 with the flow `cancelled`; or 202 with `cancel_requested` and the flow still going: a step "
        "is in flight, or money may be in flight at the gateway (`unsettled`: a payment answered PENDING, a refund "
        "whose result is not read yet, a call whose answer was lost). The step then reads the gateway, and the flow "
        "ends `cancelled` if no money moved, `succeeded` if it did (a cancel cannot undo money taken), or "
        "`needs_attention` naming the operation if the gateway cannot tell.",
        responses={202: {"model": FlowView, "description": "cancel requested: the flow reads the gateway first"}},
    )
    def cancel_flow(
        flow_id: FlowId, response: Response, request: Annotated[CancelRequest | None, Body()] = None
    ) -> dict[str, Any]:
        reason = request.reason if request else CancelRequest().reason
        try:
            record = engine.cancel(flow_id, reason, by="api")
            if record.state is not FlowState.CANCELLED:
                response.status_code = 202
            return flow_view(record, engine.registry)
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        except OperatorError as exc:
            raise refused(engine, flow_id, exc) from None

    @router.post("/{flow_id}/retry", response_model=FlowView, summary="Move a failed or needs_attention flow on")
    def retry_flow(flow_id: FlowId) -> dict[str, Any]:
        try:
            return flow_view(engine.retry(flow_id, by="api"), engine.registry)
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        except OperatorError as exc:
            raise refused(engine, flow_id, exc) from None

    @router.post(
        "/{flow_id}/refund-late-payment",
        response_model=FlowView,
        summary="Refund a LatePayment's operation (a refund flow) and close the flow",
        description="For a `needs_attention` flow with error `LatePayment`: starts a `refund` flow of the reported "
        "operation (full amount; asked twice, it refunds once) and answers 202 while it runs. Once the refund "
        "succeeded the flow is closed (asked again, 200 with it closed): a flow that had ended failed or cancelled "
        "is cancelled, its outcome naming the refund flow (`POST /flows/{id}/retry` or `keep-late-payment` accepts "
        "the payment instead); a flow that had succeeded with another payment goes back to `succeeded`, that first "
        "payment still its outcome, the second listed in `operationIds` and `latePayments` with its refund. A refund "
        "that failed is a 409 naming its flow.",
        responses={202: {"model": FlowView, "description": "the refund is under way; its success closes the flow"}},
    )
    def refund_late_payment(
        flow_id: FlowId, response: Response, request: Annotated[CancelRequest | None, Body()] = None
    ) -> dict[str, Any]:
        reason = request.reason if request else "late payment refunded"
        try:
            record = engine.refund_late_payment(flow_id, reason, by="api")
            if record.state is FlowState.NEEDS_ATTENTION:
                response.status_code = 202  # the refund is under way: its success closes the flow
            return flow_view(record, engine.registry, refunding=engine.refund_under_way(record))
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        except OperatorError as exc:
            raise refused(engine, flow_id, exc) from None

    @router.post(
        "/{flow_id}/keep-late-payment",
        response_model=FlowView,
        summary="Keep a LatePayment: the flow's outcome, or a second payment listed beside its first",
        description="For a `needs_attention` flow with error `LatePayment`: the merchant keeps the payment. A flow that "
        "had succeeded with another payment goes back to `succeeded`, the first payment still its outcome, the second "
        "listed in `operationIds` and `latePayments`; any other (ended failed or cancelled, or moved to a new order) "
        "succeeds with it as its outcome. Refused while a refund of it is under way.",
    )
    def keep_late_payment(flow_id: FlowId) -> dict[str, Any]:
        try:
            return flow_view(engine.keep_late_payment(flow_id, by="api"), engine.registry)
        except NotFound:
            raise not_found(f"no flow {flow_id!r}") from None
        except OperatorError as exc:
            raise refused(engine, flow_id, exc) from None

    # Last, so that a method a documented path does not take is a 405 naming that path's methods
    # (Starlette's Allow lists the methods of the first route whose path matches).
    @router.post("/{kind}", include_in_schema=False)
    def start_unknown(
        kind: str, wait: str | None = None, run_at: str | None = None, terminal: str | None = None, tenant: str | None = None
    ) -> None:
        # It takes a start's query (durapay.Client always sends `wait`): the answer is about the kind.
        del wait, run_at, terminal, tenant
        guess = closest(kind, engine.registry)
        hint = f"; did you mean `{guess}`?" if guess else ""
        raise ApiError(404, "not_found", f"no flow kind {kind!r}{hint} (known kinds: {', '.join(sorted(engine.registry))})")

    @router.post("/{flow_id}/signals/{name}", include_in_schema=False)
    def signal_unknown(flow_id: FlowId, name: str, payload: Annotated[Any, Body()] = None) -> dict[str, Any]:
        if name in names:  # a signal some flow takes, though not from here (notification): the engine says why
            return deliver(flow_id, name, payload)
        offered = [known for known in names if may_send(known, "api")]
        guess = closest(name, offered)
        hint = f"; did you mean `{guess}`?" if guess else ""
        raise ApiError(404, "not_found", f"no signal {name!r}{hint} (signals: {', '.join(offered) or 'none'})")

    return router
