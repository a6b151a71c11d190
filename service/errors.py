"""One shape for every error the HTTP API answers, and the handlers that produce it.

Why: a merchant's backend should handle errors by status and one JSON shape, never parse a traceback.
Every refusal is ``{"error": <code>, "reason": <one line>}`` plus ``"field"`` for bad input (422):

| status | ``error`` | when |
|---|---|---|
| 401 | ``unauthorized`` | missing or wrong API key |
| 403 | ``forbidden`` | a read-only key asked to act (anything but GET) |
| 404 | ``not_found`` | no such flow, schedule, flow kind or signal |
| 405 | ``method_not_allowed`` | the path takes other methods (``Allow`` lists them) |
| 409 | ``conflict`` | the state does not allow it (cancel a finished flow, an Idempotency-Key reused) |
| 413 | ``too_large`` | a body above the limit |
| 415 | ``unsupported_encoding`` | a body that is not UTF-8 (UTF-16, UTF-32, a byte order mark, another charset;
``service.inbound``); ``unsupported_media_type``: a body that is neither JSON nor a console form |
| 429 | ``too_many_attempts`` | too many failed authentications (``service.throttle``); ``Retry-After`` |
| 422 | ``invalid_input`` | any input that does not validate, a body that is not JSON (or nested deeper than
``inbound.MAX_DEPTH``, a lone surrogate, a control character where the field cannot hold one, a number out of
range: refused at the input boundary) included; ``field`` names it (``order.amount``, ``query.limit``,
``header.Idempotency-Key``, ``(path)``, ``(body)``) |
| 500 | ``internal`` | a bug: logged on the server with a reference, never shown |
| 503 | ``unavailable`` | Redis unreachable, or not ready, or a card-carrying start with no card key configured |

There is no 400: a body that cannot be parsed is invalid input like any other (422, field ``(body)``).
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from durapay.gateway import error_field
from durapay.gateway._strict import did_you_mean
from durapay.service.inbound import shown
from durapay.workflows.engine import CardKeyMissing, NotDurable, mask_text

log = logging.getLogger("durapay.api")


class ErrorBody(BaseModel):
    """The body of every error answer."""

    error: str
    reason: str
    field: str | None = None


#: The error answers every protected route documents (``responses=`` of its router).
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong API key (checked before the body is read)"},
    403: {"model": ErrorBody, "description": "a read-only key (DURAPAY_API__KEYS) asked to act"},
    404: {"model": ErrorBody, "description": "no such flow, schedule, flow kind or signal"},
    409: {"model": ErrorBody, "description": "the state does not allow it, or an Idempotency-Key reused"},
    413: {"model": ErrorBody, "description": "a body above DURAPAY_API__MAX_BODY_BYTES"},
    415: {
        "model": ErrorBody,
        "description": "a body that is not UTF-8 JSON (RFC 8259 §8.1): UTF-16, UTF-32, a byte order mark, another charset, "
        "another media type",
    },
    429: {
        "model": ErrorBody,
        "description": "too many failed authentications from this address or key prefix (DURAPAY_API__AUTH_FAILURES); "
        "Retry-After gives the seconds to wait",
    },
    422: {"model": ErrorBody, "description": "invalid input; `field` names it"},
    503: {"model": ErrorBody, "description": "the flow store (Redis) is unavailable; try again"},
}


class ApiError(Exception):
    """Raised by a route to answer an error: ``raise ApiError(409, "conflict", "flow f1 already ended")``.
    ``keep``: identifiers the reason is built from (a flow's operation ids, ``sensitive.identifiers``),
    whole in the answer; every other card number in it is masked (:func:`error_response`)."""

    def __init__(
        self, status: int, error: str, reason: str, *, field: str | None = None, keep: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.field = field
        self.keep = keep


def invalid(field: str, reason: str) -> ApiError:
    return ApiError(422, "invalid_input", reason, field=field)


def not_found(reason: str) -> ApiError:
    return ApiError(404, "not_found", reason)


def conflict(reason: str, *, keep: frozenset[str] = frozenset()) -> ApiError:
    return ApiError(409, "conflict", reason, keep=keep)


def error_response(
    status: int,
    error: str,
    reason: str,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    keep: frozenset[str] = frozenset(),
) -> JSONResponse:
    """The one shape of an error answer. Every answer is made here, so no answer repeats a card number:
    a reason or a field quoting the input (a currency "got '4349...'", an unknown field or kind named
    by one, a filter echoed) has it masked (``workflows.engine.sensitive``; ``keep``: identifiers whole), and
    its control characters and lone surrogates escaped (``service.inbound.shown``)."""
    body: dict[str, Any] = {"error": error, "reason": shown(mask_text(reason, keep))}
    if field is not None:
        body["field"] = shown(mask_text(field))
    return JSONResponse(body, status_code=status, headers=headers)


def describe_request_error(exc: RequestValidationError) -> tuple[str, str]:
    """(field, reason) of the first problem: ``("query.limit", "Input should be less than or equal to 500")``."""
    errors = exc.errors()
    if not errors:
        return "(request)", "invalid request"
    first = errors[0]
    path = error_field(first)
    location = path.split(".") if path else []
    if location and location[0] == "body":
        location = location[1:] or ["(body)"]
    field = ".".join(location) or "(request)"
    reason = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if field == "(body)" and ": " in reason:  # a model-level check names its field in its message
        field, reason = reason.split(": ", 1)
    if first.get("type") == "enum" and isinstance(first.get("input"), str):  # ?state=faild: name the closest
        known = re.findall(r"'([^']*)'", str((first.get("ctx") or {}).get("expected", "")))
        reason += did_you_mean(first["input"], known)
    if first.get("type") == "json_invalid":
        field, reason = "(body)", f"body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}"
    return field, reason


_STATUS_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 409: "conflict", 413: "too_large"}


def documented_methods(app: FastAPI, path: str) -> str:
    """The methods the OpenAPI document gives ``path``: its concrete path if it has one (``/flows/moto``),
    else every templated path it fits (``/flows/{flow_id}``), as OpenAPI matches them. Starlette's own
    ``Allow`` names the methods of the first route whose path matches, which is not always the path's."""
    documented: dict[str, tuple[re.Pattern[str], list[str]]] | None = getattr(app.state, "documented_paths", None)
    if documented is None:
        documented = {}
        for template, operations in app.openapi()["paths"].items():
            parts = ["[^/]+" if part.startswith("{") else re.escape(part) for part in template.split("/")]
            documented[template] = (re.compile("^" + "/".join(parts) + "$"), [method.upper() for method in operations])
        app.state.documented_paths = documented
    if path in documented:
        return ", ".join(sorted(documented[path][1]))
    fitting = {method for pattern, methods in documented.values() if pattern.match(path) for method in methods}
    return ", ".join(sorted(fitting))


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception to :class:`ErrorBody`; an unexpected one is logged with a reference."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.error, exc.reason, field=exc.field, keep=exc.keep)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        field, reason = describe_request_error(exc)
        return error_response(422, "invalid_input", reason, field=field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not parse the body (e.g. JSON nested too deeply)
            return error_response(
                422, "invalid_input", "the body is not valid JSON (malformed, or nested too deeply)", field="(body)"
            )
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = documented_methods(app, request.url.path) or headers.get("Allow", "")
        code = _STATUS_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail), headers=headers or None)

    @app.exception_handler(redis.RedisError)
    async def _redis(request: Request, exc: redis.RedisError) -> JSONResponse:
        log.warning("%s %s: Redis unavailable: %s", request.method, request.url.path, exc)
        return error_response(503, "unavailable", "the flow store (Redis) is unavailable; try again")

    @app.exception_handler(NotDurable)
    async def _not_durable(request: Request, exc: NotDurable) -> JSONResponse:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return error_response(503, "unavailable", "the write could not be made durable in time; try again")

    @app.exception_handler(CardKeyMissing)
    async def _card_key(request: Request, exc: CardKeyMissing) -> JSONResponse:
        # A configuration error of this deployment, not of the request: nothing was written; retry once set.
        log.error("%s %s: %s", request.method, request.url.path, exc)
        return error_response(503, "unavailable", str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        reference = uuid.uuid4().hex[:12]
        log.exception("%s %s failed (reference %s)", request.method, request.url.path, reference)
        return error_response(500, "internal", f"internal error; the server log has the details (reference {reference})")
