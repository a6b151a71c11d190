"""What a handler receives (:class:`Call`), what it returns (:class:`Reply`) and how it refuses (:class:`SimError`).

Every gateway operation is one synchronous function ``handler(sim, call) -> Reply`` run under the
state's lock; the HTTP pipeline (``_app``) does the protocol around it. Errors follow docs/gateway.md
(Protocol): 400 and 500 carry ``{"errors": [{"code", "description"}]}``; 401 and 404 carry no body.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from durapay.gateway import ERROR_CODES, GatewayModel, GatewayOperation

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

M = TypeVar("M", bound=GatewayModel)


class SimError(Exception):
    """A refusal the handler answers with: status, and for 400/5xx the gateway's error code."""

    def __init__(self, status: int, code: str | None = None, description: str | None = None) -> None:
        self.status = status
        self.code = code
        self.description = description if description is not None else ERROR_CODES.get(code or "", "")
        super().__init__(f"{status} {code or ''} {self.description}".strip())

    @classmethod
    def invalid(cls, field: str, reason: str) -> SimError:
        """400 PS0026 naming the field: ``Invalid order.orderId parameter: orderId already used``."""
        return cls(400, "PS0026", f"Invalid {field} parameter: {reason}")

    @classmethod
    def rejected(cls, code: str, detail: str | None = None) -> SimError:
        """400 with a code of the reference list, its description, and the detail after a colon."""
        text = ERROR_CODES[code]
        return cls(400, code, f"{text}: {detail}" if detail else text)

    @classmethod
    def not_found(cls) -> SimError:
        return cls(404)

    def reply(self) -> Reply:
        if self.status in (401, 404) or self.code is None:
            return Reply(status=self.status)
        return Reply(status=self.status, body=error_body(self.code, self.description))


def error_body(code: str, description: str) -> dict[str, Any]:
    return {"errors": [{"code": code, "description": description}]}


@dataclass(frozen=True)
class Reply:
    """An answer: JSON ``body`` (None = no body) or raw ``content`` of ``media_type``."""

    status: int = 200
    body: Any = None
    content: bytes | None = None
    media_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def render(self) -> bytes:
        if self.content is not None:
            return self.content
        if self.body is None:
            return b""
        return json.dumps(self.body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Call:
    """One validated request to a gateway operation."""

    op: GatewayOperation[Any]
    params: dict[str, str]
    request: GatewayModel | None
    raw: dict[str, Any]
    idempotency_key: str | None
    correlation_id: str | None
    root_url: str
    path: str
    #: The terminal whose key made the call (``SimulatorConfig.terminal_keys``).
    terminal: str = "default"

    def body(self, model: type[M]) -> M:
        """The validated request as ``model`` (the catalogue's request model of this operation)."""
        if not isinstance(self.request, model):
            raise TypeError(f"{self.op.name}: request is {type(self.request).__name__}, not {model.__name__}")
        return self.request

    @property
    def origin(self) -> Origin:
        return Origin(self.op.name, self.path, self.idempotency_key, self.correlation_id)


@dataclass(frozen=True)
class Origin:
    """Who acted on an operation: a catalogue operation (with its key), or a simulator page."""

    name: str
    path: str
    idempotency_key: str | None = None
    correlation_id: str | None = None

    def step(self, result: str) -> dict[str, Any]:
        """The inspection record of this action's effect on an operation."""
        return {
            "operation": self.name,
            "path": self.path,
            "idempotencyKey": self.idempotency_key,
            "correlationId": self.correlation_id,
            "result": result,
        }


Handler = Callable[["Simulator", Call], Reply]


def ok(body: Any = None) -> Reply:
    return Reply(status=200, body=body)


def parse_minor(value: str | None, field_name: str) -> int | None:
    """A query amount (digits, minor units), or a PS0026 naming the field."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise SimError.invalid(field_name, "must be a string of digits in minor units")
    return int(value)
