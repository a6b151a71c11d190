"""The gateway client: one generic call under every operation of the catalogue.

``GatewayClient.call(Catalogue.get_order, "ord-1")`` builds the URL from the base URL (which carries
the gateway's path prefix) and the path template, sends ``X-Api-Key``, a fresh ``Correlation-Id``
(UUID4) and, where the operation takes one, the caller's ``Idempotency-Key``; it validates the
request against the operation's model before anything is sent and parses the answer into the
operation's response model. Failures raise the error tree of ``_errors`` and are never retried here:
retries belong to the engine, which knows whether a resend is safe.

The client is synchronous on purpose: measured on these machines a keep-alive ``httpx.Client`` in a
thread or prefork worker beats ``AsyncClient`` by a wide margin (docs/architecture.md, Measured choices).
"""

from __future__ import annotations

import functools
import ssl
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from durapay.config.settings import GatewaySettings
from durapay.config.tracing import OFF, Tracing
from durapay.gateway._base import GatewayModel
from durapay.gateway._catalogue import GatewayOperation
from durapay.gateway._deadline import DeadlineTransport, bounded, deadline_mounts
from durapay.gateway._errors import (
    GatewayError,
    InvalidResponse,
    RequestInvalid,
    error_from_response,
    error_from_transport,
)
from durapay.gateway._models_common import BinaryResponse, EmptyResponse
from durapay.gateway._strict import error_field

Resp = TypeVar("Resp", bound=GatewayModel)

MAX_IDEMPOTENCY_KEY = 63


def check_idempotency_key(key: str) -> str:
    """A key is 1 to 63 printable ASCII characters without spaces (the gateway's limit is 63)."""
    if not key:
        raise ValueError("is empty")
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise ValueError(f"is {len(key)} characters long; the gateway takes at most {MAX_IDEMPOTENCY_KEY}")
    if not key.isascii() or not key.isprintable() or " " in key:
        raise ValueError("must be printable ASCII without spaces")
    return key


def describe_validation_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, reason) of the first problem, e.g. ``("order.amount", "must be a string of digits")``."""
    first = exc.errors()[0]
    field = error_field(first) or "(body)"
    return field, first["msg"].removeprefix("Value error, ")


def _invalid(op: GatewayOperation[Any], field: str, reason: str) -> RequestInvalid:
    return RequestInvalid(f"{op.name}: {field}: {reason}", field=field, reason=reason, operation=op.name)


def validate_request(op: GatewayOperation[Any], request: BaseModel | Mapping[str, Any] | None) -> GatewayModel | None:
    """The request as the operation's model, or RequestInvalid naming the field and the reason."""
    if op.request is None:
        if request is not None:
            raise _invalid(op, "(body)", "this operation takes no request body")
        return None
    if request is None:
        request = {}
    if isinstance(request, op.request):
        return request
    data = request.model_dump(by_alias=True, exclude_none=True) if isinstance(request, BaseModel) else request
    try:
        return op.request.model_validate(data)
    except ValidationError as exc:
        field, reason = describe_validation_error(exc)
        raise _invalid(op, field, reason) from None


def build_path(op: GatewayOperation[Any], path_args: tuple[str, ...]) -> str:
    names = op.path_params
    if len(path_args) != len(names):
        raise _invalid(op, "path", f"takes {len(names)} path argument(s) {list(names)}, got {len(path_args)}")
    path = op.path
    for name, value in zip(names, path_args, strict=True):
        if not isinstance(value, str) or not value:
            raise _invalid(op, name, "must be a non-empty string")
        path = path.replace("{" + name + "}", quote(value, safe=""), 1)
    return path


def _query_params(model: GatewayModel) -> dict[str, str]:
    params: dict[str, str] = {}
    for key, value in model.wire().items():
        params[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return params


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context every gateway client of this process shares, as httpx would build it (certifi's CA
    bundle, or SSL_CERT_FILE / SSL_CERT_DIR). httpx builds one per client, parsing the CA bundle each
    time: 50 ms per engine (more on a busy machine), and the tests build engines by the hundred."""
    return httpx.create_ssl_context()


class GatewayClient:
    """Calls gateway operations. Give it the gateway settings; pass ``transport`` in tests.

    A call, its name's resolution, connect, send and answer together, ends within ``connect_timeout +
    timeout`` of its start (``_deadline``: the timeouts alone bound each read, and an answer trickled a
    byte at a time held a call past the engine's lease), a connection within ``connect_timeout``; through
    the environment's proxy (``HTTPS_PROXY``...) as well."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        transport: httpx.BaseTransport | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self.settings = settings
        #: Each call a span (``gateway <operation>``) around httpx's own (``config.tracing``); off by default.
        self.tracing = tracing
        headers = {
            "X-Api-Key": settings.api_key.get_secret_value(),
            "Accept": "application/json",
            "User-Agent": "durapay",
        }
        if settings.plugin_name:
            headers["x-plugin-name"] = settings.plugin_name
        context = tls_context()
        self._http = httpx.Client(
            base_url=settings.base_url + "/",
            headers=headers,
            timeout=httpx.Timeout(settings.timeout, connect=settings.connect_timeout),
            transport=transport if transport is not None else DeadlineTransport(verify=context),
            # The environment's proxies, each through the deadline's transport (a transport of one's own
            # turns httpx's reading of them off): a test's transport goes direct.
            mounts=deadline_mounts(verify=context) if transport is None else None,
            verify=context,
        )
        #: The longest one call may take, from its start to its answer's last byte.
        self.deadline = settings.connect_timeout + settings.timeout
        if tracing.on:
            tracing.instrument(self._http)

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        op: GatewayOperation[Resp],
        *path_args: str,
        request: BaseModel | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Resp:
        """Call ``op`` once and return its typed answer, or raise a :class:`GatewayError`.

        ``path_args`` fill the path's ``{...}`` parameters in order. ``request`` is the body (POST) or
        the query (GET), as the operation's model or a mapping validated against it.
        """
        if self.tracing.on:
            # The operation's name and path template only: the filled path and the body are the gateway's
            # to see (a card in a body, an id a merchant chose in a path).
            attributes = {"durapay.operation": op.name, "http.request.method": op.method, "url.template": op.path}
            with self.tracing.call_span(f"gateway {op.name}", attributes):
                return self._call(op, path_args, request, idempotency_key)
        return self._call(op, path_args, request, idempotency_key)

    def _call(
        self,
        op: GatewayOperation[Resp],
        path_args: tuple[str, ...],
        request: BaseModel | Mapping[str, Any] | None,
        idempotency_key: str | None,
    ) -> Resp:
        path = build_path(op, path_args).lstrip("/")
        model = validate_request(op, request)
        correlation_id = str(uuid.uuid4())
        headers = {"Correlation-Id": correlation_id}
        if op.idempotency_key:
            if idempotency_key is None:
                raise _invalid(op, "Idempotency-Key", "missing: this operation needs one")
            try:
                headers["Idempotency-Key"] = check_idempotency_key(idempotency_key)
            except ValueError as exc:
                raise _invalid(op, "Idempotency-Key", str(exc)) from None
        elif idempotency_key is not None:
            raise _invalid(op, "Idempotency-Key", "this operation takes none")

        kwargs: dict[str, Any] = {"headers": headers}
        if model is not None and op.request_in == "query":
            kwargs["params"] = _query_params(model)
        elif model is not None:
            kwargs["json"] = model.wire()
        elif op.method == "POST":
            kwargs["content"] = b""
        try:
            with bounded(self.deadline):
                response = self._http.request(op.method, path, **kwargs)
        except httpx.TransportError as exc:
            raise error_from_transport(exc, operation=op.name, correlation_id=correlation_id) from exc
        if not response.is_success:
            raise error_from_response(response, operation=op.name, correlation_id=correlation_id)
        return self._parse(op, response, correlation_id)

    @staticmethod
    def _parse(op: GatewayOperation[Resp], response: httpx.Response, correlation_id: str) -> Resp:
        kind = op.response
        if issubclass(kind, BinaryResponse):
            media = response.headers.get("content-type", "application/octet-stream").split(";")[0].strip()
            return kind(content=response.content, mediaType=media)
        if issubclass(kind, EmptyResponse):
            return kind()
        try:
            return kind.model_validate_json(response.content)
        except ValidationError as exc:
            field, reason = describe_validation_error(exc)
            raise InvalidResponse(
                f"{op.name}: answer does not fit {kind.__name__}: {field}: {reason}",
                operation=op.name,
                correlation_id=correlation_id,
                status_code=response.status_code,
            ) from None


__all__ = ["GatewayClient", "GatewayError", "check_idempotency_key", "validate_request"]
