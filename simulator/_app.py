"""The ASGI app: one route per catalogue operation under the gateway's path prefix, plus ``/_sim/``.

Each gateway request goes through one pipeline, in this order:

1. ``X-Api-Key`` must be the simulator's key, else 401 with no body.
2. Faults are drawn for the operation. An ``error``, ``drop`` or (non-committing) ``hang`` fault acts
   now, after the latency, without touching the state.
3. ``Idempotency-Key`` where the catalogue takes one (PS0025 missing or too long); the JSON body (PS0035)
   or the query is validated with the operation's request model (PS0026 naming the field).
4. A keyed request claims its key and holds it through the latency (``asyncio.sleep``, so concurrent
   requests overlap): a duplicate arriving meanwhile waits, then gets the stored answer replayed (or
   PS0025 if its request differs).
5. The handler runs synchronously under the state's lock; a keyed answer is stored in the same step.
6. ``commit_then_fail`` (500 or a dropped connection) or a committing ``hang`` spoil the delivery.

A ``late`` fault answers like ``error`` (or ``drop``) once the request is read and validated, and keeps
it: steps 4 and 5 run when ``/_sim/faults/release`` says, as for a request that reached the gateway
after its client had given up.

Every answer carries ``cid``, a fresh UUID, as the real gateway does. Routes are registered with the
literal paths first, so ``GET /orders/paybylink`` never reaches ``GET /orders/{orderId}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from durapay.gateway import CATALOGUE, GatewayOperation, check_idempotency_key, describe_validation_error
from durapay.simulator import _backoffice, _build, _direct, _links, _reservations, _structures, _three_steps
from durapay.simulator._admin_routes import admin_routes
from durapay.simulator._core import Simulator
from durapay.simulator._faults import FaultRule
from durapay.simulator._idempotency import IdempotencyGate, fingerprint
from durapay.simulator._pages import page_routes
from durapay.simulator._protocol import Call, Handler, Reply, SimError, error_body
from durapay.simulator._state import SimulatorState

log = logging.getLogger("simulator")
TRANSPORT_KEY = "simulator.transport"
Endpoint = Callable[[Request], Awaitable[Response]]


def all_handlers() -> dict[str, Handler]:
    """Every catalogue operation's handler; refuses to build an app that would miss one."""
    handlers: dict[str, Handler] = {}
    for module in (_direct, _links, _three_steps, _build, _backoffice, _structures, _reservations):
        handlers.update(module.HANDLERS)
    missing = [op.name for op in CATALOGUE if op.name not in handlers]
    extra = sorted(set(handlers) - {op.name for op in CATALOGUE})
    if missing or extra:
        raise RuntimeError(f"simulator handlers out of step with the catalogue: missing {missing}, unknown {extra}")
    return handlers


def routing_order() -> list[GatewayOperation[Any]]:
    """The catalogue with literal paths before parameterised ones (a stable sort by parameter count)."""
    return sorted(CATALOGUE, key=lambda op: len(op.path_params))


def respond(reply: Reply) -> Response:
    headers = {"cid": str(uuid.uuid4()), **reply.headers}
    body = reply.render()
    media_type = reply.media_type if body else None
    return Response(content=body, status_code=reply.status, media_type=media_type, headers=headers)


async def drop_connection(request: Request) -> Response:
    """Close the TCP connection without an answer: the client sees the server disconnect."""
    transport = request.scope.get(TRANSPORT_KEY)
    if transport is None:
        raise RuntimeError("dropping a connection needs the simulator's uvicorn server (no transport in scope)")
    transport.close()
    # Let uvicorn notice the closed connection so it does not try to answer on it.
    for _ in range(3):
        await asyncio.sleep(0)
    return Response(status_code=500)


def _fault_reply(rule: FaultRule) -> Reply:
    status = rule.answer_status
    headers = {"Retry-After": str(rule.retry_after)} if status == 429 else {}
    description = f"simulated {rule.mode} fault (HTTP {status})"
    return Reply(status=status, body=error_body("PS0000", description), headers=headers)


class GatewayPipeline:
    """The protocol around every handler (see the module docstring for the order of the steps)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.gate = IdempotencyGate(sim.state)
        self.prefix = sim.config.path_prefix

    def endpoint(self, op: GatewayOperation[Any], handler: Handler) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            return await self.serve(op, handler, request)

        endpoint.__name__ = op.name
        return endpoint

    async def serve(self, op: GatewayOperation[Any], handler: Handler, request: Request) -> Response:
        self.sim.in_flight += 1
        self.sim.serving[op.name] += 1
        try:
            return await self._serve(op, handler, request)
        finally:
            self.sim.in_flight -= 1
            self.sim.serving[op.name] -= 1
            if not self.sim.serving[op.name]:
                del self.sim.serving[op.name]

    async def _serve(self, op: GatewayOperation[Any], handler: Handler, request: Request) -> Response:
        terminal = self.sim.config.terminal_of(request.headers.get("x-api-key"))
        if terminal is None:
            return respond(Reply(status=401))
        faults = self.sim.faults.for_request(op.name, terminal)
        latency, action = faults.latency_seconds, faults.action
        mode = action.mode if action is not None else None
        if action is not None and (mode in ("error", "drop") or (mode == "hang" and not action.commit)):
            await asyncio.sleep(latency)
            if mode == "error":
                return respond(_fault_reply(action))
            if mode == "drop":
                return await drop_connection(request)
            await asyncio.sleep(action.seconds)
            return respond(_fault_reply(action.model_copy(update={"status": 503})))
        try:
            call = await self._call(op, request, terminal)
            if action is not None and mode == "late":
                self.sim.faults.hold_late(lambda: self._act_late(handler, call))
                await asyncio.sleep(latency)
                return await drop_connection(request) if action.drop else respond(_fault_reply(action))
            if call.idempotency_key is None:
                await asyncio.sleep(latency)
                reply = self._run(handler, call, None)
            else:
                reply = await self._run_keyed(handler, call, latency)
        except SimError as exc:
            await asyncio.sleep(latency)
            return respond(exc.reply())
        if action is not None and mode == "commit_then_fail":
            return await drop_connection(request) if action.drop else respond(_fault_reply(action))
        if action is not None and mode == "hang":
            await asyncio.sleep(action.seconds)
        return respond(reply)

    async def _act_late(self, handler: Handler, call: Call) -> int:
        """A held ``late`` request acts now (its key claimed now, so an earlier retry's answer is replayed)."""
        if call.idempotency_key is None:
            return self._run(handler, call, None).status
        return (await self._run_keyed(handler, call, 0.0)).status

    async def _run_keyed(self, handler: Handler, call: Call, latency: float) -> Reply:
        """Claim the key, then act (the key is held through the latency, so a duplicate waits), or replay."""
        key = call.idempotency_key or ""
        print_ = fingerprint(call.op.method, call.path, call.raw)
        stored = await self.gate.claim(key, print_)
        if stored is not None:
            await asyncio.sleep(latency)
            return stored.reply()
        try:
            await asyncio.sleep(latency)
            return self._run(handler, call, print_)
        finally:
            self.gate.release(key)

    async def _call(self, op: GatewayOperation[Any], request: Request, terminal: str = "default") -> Call:
        key: str | None = None
        if op.idempotency_key:
            key = request.headers.get("idempotency-key")
            if not key:
                raise SimError(400, "PS0025", "The idempotency key is wrong or missing: no Idempotency-Key header")
            try:
                check_idempotency_key(key)
            except ValueError as exc:
                raise SimError(400, "PS0025", f"The idempotency key is wrong: Idempotency-Key {exc}") from None
        raw: dict[str, Any] = {}
        if op.request is not None and op.method == "GET":
            raw = dict(request.query_params)
        elif op.request is not None:
            data = await request.body()
            if data.strip():
                try:
                    parsed = json.loads(data)
                except ValueError as exc:
                    raise SimError(400, "PS0035", f"JSON processing error: {exc}") from None
                if not isinstance(parsed, dict):
                    raise SimError(400, "PS0035", "JSON processing error: the body must be a JSON object")
                raw = parsed
        model = None
        if op.request is not None:
            try:
                model = op.request.model_validate(raw)
            except ValidationError as exc:
                field, reason = describe_validation_error(exc)
                raise SimError.invalid(field, reason) from None
        path = request.url.path.removeprefix(self.prefix)
        return Call(
            op=op,
            params=dict(request.path_params),
            request=model,
            raw=raw,
            idempotency_key=key,
            correlation_id=request.headers.get("correlation-id"),
            root_url=str(request.base_url).rstrip("/"),
            path=path,
            terminal=terminal,
        )

    def _run(self, handler: Handler, call: Call, print_: str | None) -> Reply:
        with self.sim.state.lock:
            terminals = bool(self.sim.config.terminal_keys)
            try:
                if terminals:
                    _own_terminal(self.sim.state, call)
                    orders, operations = len(self.sim.state.orders), self.sim.state.operations_made
                reply = handler(self.sim, call)
                if terminals:
                    _record_terminal(self.sim.state, call, orders, operations)
            except SimError as exc:
                reply = exc.reply()
            except Exception as exc:
                log.exception("simulator handler %s failed", call.op.name)
                return Reply(status=500, body=error_body("PS0000", f"simulator error in {call.op.name}: {exc}"))
            if call.op.method == "POST":
                self.sim.state.dirty = True
            if print_ is not None and call.idempotency_key is not None:
                self.gate.store(call.idempotency_key, print_, call.op.name, reply)
            return reply


def _touched_order(state: SimulatorState, call: Call) -> str | None:
    """The existing order a call acts on or reads (by its path: an order or an operation), if any."""
    if "orderId" in call.params:
        return call.params["orderId"]
    operation = state.operations.get(call.params.get("operationId", ""))
    return operation.order_id if operation is not None else None


def _own_terminal(state: SimulatorState, call: Call) -> None:
    """A call on another terminal's order or operation is a 404: a terminal's key sees its own only."""
    order_id = _touched_order(state, call)
    owner = state.order_terminals.get(order_id) if order_id else None
    if owner is not None and owner != call.terminal:
        state.terminal_refusals += 1
        log.warning("simulator: %s by terminal %r on order %s of terminal %r: 404", call.op.name, call.terminal, order_id, owner)
        raise SimError.not_found()


def _record_terminal(state: SimulatorState, call: Call, orders: int, operations: int) -> None:
    """Record the terminal of the orders a call made (new orders, and the orders of new operations)."""
    made = [order_id for _, order_id in zip(range(len(state.orders) - orders), reversed(state.orders), strict=False)]
    for operation_id in state.operation_ids_after(operations):
        operation = state.operations.get(operation_id)
        if operation is not None:
            made.append(operation.order_id)
    for order_id in made:
        state.order_terminals.setdefault(order_id, call.terminal)


def gateway_routes(sim: Simulator) -> list[BaseRoute]:
    handlers = all_handlers()
    pipeline = GatewayPipeline(sim)
    prefix = sim.config.path_prefix
    return [
        Route(prefix + op.path, pipeline.endpoint(op, handlers[op.name]), methods=[op.method], name=op.name)
        for op in routing_order()
    ]


async def _empty_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    return Response(status_code=status, headers={"cid": str(uuid.uuid4())})


class ExposeTransport:
    """Outermost ASGI layer: hands the connection's transport to the app (for dropped-connection faults)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            cycle = getattr(send, "__self__", None)
            scope[TRANSPORT_KEY] = getattr(cycle, "transport", None)
        await self.app(scope, receive, send)


def build_app(sim: Simulator) -> ASGIApp:
    """The whole simulator as one ASGI app (serve it with one uvicorn worker)."""
    routes = [*gateway_routes(sim), *admin_routes(sim), *page_routes(sim)]
    app = Starlette(routes=routes, exception_handlers={404: _empty_error, 405: _empty_error})
    return ExposeTransport(app)
