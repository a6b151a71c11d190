"""``/_sim/``: the simulator's own JSON endpoints for tests, demos and people (no API key needed).

============================================  ==========================================================
``GET /_sim/health``                          ``{"status": "ok", "inFlight": N, "serving": {op: n}}``
                                              (gateway requests now served, all and per operation)
``POST /_sim/reset``                          forget everything (records, keys, scripts, notifications,
                                              faults back to the start-up settings, clock offset 0)
``GET|POST|DELETE /_sim/faults``              read, add to (a rule, ``rules``, ``latency_ms``...), clear
``POST /_sim/faults/release``                 the requests held by ``late`` rules act now, oldest first:
                                              ``{"released": [status, ...]}``
``GET|POST /_sim/clock``                      ``{"now", "offsetSeconds"}``; move it with
                                              ``{"advance_seconds": N}`` or ``{"now": "<iso>"}``
``GET /_sim/operations``                      recorded operations with the key that created each;
                                              filters ``orderId operation idempotencyKey operationType
                                              operationResult operationId``
``GET /_sim/notifications``                   the delivery log; filters ``orderId``, ``state``
``GET|POST|DELETE /_sim/scripts``             queued outcomes: ``{"contractId"|"pan", "outcomes": [...]}``
``GET|POST /_sim/pending``                    read, or add a rule ``{"operation", "count", "final",
                                              "settle_after"}``: the next requests to that money
                                              operation (or, for ``page_payment``, the next payments on
                                              a customer's page) answer PENDING (``_pending``)
``POST /_sim/pending/settle``                 settle ``{"operationId"}`` or every held operation now:
                                              ``{"settled": [id, ...]}``
``GET|POST /_sim/settings``                   ``{"auto_complete_ms": N|null}``
``GET /_sim/state``                           the whole state snapshot (as ``--state-file`` writes it)
============================================  ==========================================================

Moving the clock sweeps expiries at once, so a test sees an expired link right after the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from durapay.simulator._clock import iso, parse_iso
from durapay.simulator._faults import FaultsError

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

OPERATION_FILTERS = {
    "orderId": "order_id",
    "operation": "operation",
    "idempotencyKey": "idempotency_key",
    "operationType": "operation_type",
    "operationResult": "operation_result",
    "operationId": "operation_id",
}


class AdminError(ValueError):
    """A refused admin request; answered 400 ``{"error": message}``."""


async def _json(request: Request) -> dict[str, Any]:
    data = await request.body()
    if not data.strip():
        return {}
    try:
        parsed = await request.json()
    except ValueError as exc:
        raise AdminError(f"body is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise AdminError("body must be a JSON object")
    return parsed


def _guarded(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(await handler(request))
        except (AdminError, FaultsError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    return endpoint


def admin_routes(sim: Simulator) -> list[BaseRoute]:
    async def health(request: Request) -> dict[str, Any]:
        return {"status": "ok", "inFlight": sim.in_flight, "serving": dict(sim.serving)}

    async def reset(request: Request) -> dict[str, Any]:
        sim.reset()
        return {"reset": True}

    async def faults(request: Request) -> dict[str, Any]:
        if request.method == "DELETE":
            sim.faults.clear()
        elif request.method == "POST":
            return sim.faults.update(await _json(request))
        return sim.faults.describe()

    async def release(request: Request) -> dict[str, Any]:
        return {"released": [await act() for act in sim.faults.take_late()]}

    def clock_answer() -> dict[str, Any]:
        return {"now": iso(sim.clock.now()), "offsetSeconds": sim.clock.offset_seconds}

    async def clock(request: Request) -> dict[str, Any]:
        if request.method == "POST":
            body = await _json(request)
            if "advance_seconds" in body:
                seconds = body["advance_seconds"]
                if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                    raise AdminError("advance_seconds: must be a number")
                sim.clock.advance(float(seconds))
            elif "now" in body:
                try:
                    moment: datetime = parse_iso(str(body["now"]))
                except ValueError as exc:
                    raise AdminError(f"now: not an ISO 8601 timestamp: {exc}") from None
                sim.clock.set(moment)
            else:
                raise AdminError("give advance_seconds or now")
            sim.sweep()
        return clock_answer()

    async def operations(request: Request) -> dict[str, Any]:
        filters = {OPERATION_FILTERS[k]: v for k, v in request.query_params.items() if k in OPERATION_FILTERS}
        return {"operations": sim.state.find_operations(**filters)}

    async def notifications(request: Request) -> dict[str, Any]:
        found = sim.notifier.deliveries()
        for name, field in (("orderId", "orderId"), ("state", "state")):
            wanted = request.query_params.get(name)
            if wanted is not None:
                found = [delivery for delivery in found if delivery[field] == wanted]
        return {"notifications": found}

    async def scripts(request: Request) -> dict[str, Any]:
        body = await _json(request) if request.method == "POST" else {}
        # Never await while holding the state's lock: the event loop's other tasks share this thread.
        with sim.state.lock:
            if request.method == "DELETE":
                sim.state.scripts.clear()
            elif request.method == "POST":
                outcomes = body.get("outcomes")
                if not isinstance(outcomes, list) or not outcomes:
                    raise AdminError("outcomes: must be a non-empty list of outcome tokens")
                try:
                    sim.state.scripts.push(outcomes, contract_id=body.get("contractId"), pan=body.get("pan"))
                except ValueError as exc:
                    raise AdminError(str(exc)) from None
            return {"scripts": sim.state.scripts.snapshot()}

    async def pending(request: Request) -> dict[str, Any]:
        if request.method == "POST":
            try:
                return sim.pending.arm(await _json(request))
            except ValueError as exc:
                raise AdminError(str(exc)) from None
        return sim.pending.describe()

    async def settle(request: Request) -> dict[str, Any]:
        operation_id = (await _json(request)).get("operationId")
        if operation_id is not None and not isinstance(operation_id, str):
            raise AdminError("operationId: must be a string")
        try:
            return {"settled": sim.pending.settle(operation_id)}
        except KeyError:
            raise AdminError(f"operation {operation_id} is not PENDING by a pend rule") from None

    async def settings(request: Request) -> dict[str, Any]:
        if request.method == "POST":
            body = await _json(request)
            if "auto_complete_ms" in body:
                value = body["auto_complete_ms"]
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise AdminError("auto_complete_ms: must be a non-negative integer or null")
                sim.auto_complete_ms = value
        return {"auto_complete_ms": sim.auto_complete_ms}

    async def state(request: Request) -> dict[str, Any]:
        return sim.state.snapshot()

    def route(path: str, handler: Callable[[Request], Awaitable[Any]], *methods: str) -> Route:
        return Route(path, _guarded(handler), methods=list(methods))

    return [
        route("/_sim/health", health, "GET"),
        route("/_sim/reset", reset, "POST"),
        route("/_sim/faults", faults, "GET", "POST", "DELETE"),
        route("/_sim/faults/release", release, "POST"),
        route("/_sim/clock", clock, "GET", "POST"),
        route("/_sim/operations", operations, "GET"),
        route("/_sim/notifications", notifications, "GET"),
        route("/_sim/scripts", scripts, "GET", "POST", "DELETE"),
        route("/_sim/pending", pending, "GET", "POST"),
        route("/_sim/pending/settle", settle, "POST"),
        route("/_sim/settings", settings, "GET", "POST"),
        route("/_sim/state", state, "GET"),
    ]
