"""Traces of flows (OpenTelemetry): off unless the process's environment configures them.

Every part of durapay that makes a span (the API's start, a step, a gateway call, a resume, a webhook
delivery) is handed one :class:`Tracing`. This module is its off face and imports nothing of
OpenTelemetry: :data:`OFF` does nothing, and a caller on a hot path (the engine's start, a step) asks
``tracing.on`` once and skips the rest. :func:`from_environ` builds the on face (``config._otel``, which
imports the SDK) only when :func:`configured` says the environment asks for traces.

"Configured" means ``OTEL_TRACES_EXPORTER`` names an exporter other than ``none`` (``console``, ``otlp``)
and ``OTEL_SDK_DISABLED`` is not ``true``. Unlike the SDK's own default (``otlp`` when unset), an unset
variable means off: a deployment that never heard of OpenTelemetry pays nothing and sends nothing.

A flow's trace context (its W3C ``traceparent``) is kept on its record (:data:`TRACE_FIELD`), written at
create only when tracing is on. A step run later (a timer, a wait's end, a recovery after a crash) starts
a span of its own *linked* to that context: a child would outlive its parent by days.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: ``durapay.terminal`` of a flow whose start named no terminal (``workflows.engine.terminals``; a record off it names its own).
from durapay.config.settings import DEFAULT_TERMINAL

#: The flow record's field holding the flow's trace context (a ``traceparent``), when tracing was on at create.
TRACE_FIELD = "trace"
#: The instrumentations' switches that copy request headers into span attributes: refused (see from_environ).
CAPTURED_HEADERS = (
    "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST",
    "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST",
)
#: The exporters :func:`configured` accepts (``config._otel`` builds them).
EXPORTERS = frozenset({"console", "otlp"})


@dataclass(frozen=True)
class FlowTag:
    """Which flow the code running now works for: every span started meanwhile carries it, and every log
    line names it (``config._otel``)."""

    flow_id: str
    kind: str
    terminal: str = DEFAULT_TERMINAL

    def attributes(self) -> dict[str, str]:
        return {"durapay.flow_id": self.flow_id, "durapay.kind": self.kind, "durapay.terminal": self.terminal}


#: The flow of the step, start or resume running in this thread or task (None: none).
CURRENT_FLOW: contextvars.ContextVar[FlowTag | None] = contextvars.ContextVar("durapay_flow", default=None)


class StepSpan:
    """What a step's span is told when the step ends (the on face records it; this one ignores it)."""

    def ended(self, outcome: str, state_after: str) -> None:
        """``outcome``: what the step's run returned (``succeeded``, ``stale``...); ``state_after``: the
        flow's state as the completion wrote it ("" when nothing was written)."""


class Tracing:
    """The off face: makes no span, writes no trace context, imports nothing. ``on`` is False."""

    on = False

    def context(self) -> str:
        """The current span's ``traceparent`` (to keep on a flow's record), or "" when none."""
        return ""

    @contextlib.contextmanager
    def flow_span(
        self,
        name: str,
        tag: FlowTag,
        *,
        link: str = "",
        attributes: Mapping[str, Any] | None = None,
        kind: str = "internal",
        root: bool = False,
    ) -> Iterator[None]:
        """A span for work done for one flow. ``link``: the flow's kept ``traceparent``, linked to.
        ``root``: start a trace of its own (work that runs later than its cause: a step, a delivery)
        rather than a child of whatever span is current. ``kind``: internal, server, client, consumer."""
        yield

    @contextlib.contextmanager
    def step_span(
        self, tag: FlowTag, step: str, *, link: str, attempt: int, state_before: str, recovery: bool
    ) -> Iterator[StepSpan]:
        """A step's span: a root span linked to the flow's trace, named ``step <step>``."""
        yield StepSpan()

    @contextlib.contextmanager
    def call_span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
        """A child of the current span for one call (a gateway operation), the current flow stamped on it."""
        yield

    def tag_current(self, tag: FlowTag) -> None:
        """Name the flow on the span current now (the API request's server span, which began before the
        flow's id was known); not when the current span is already another flow's (a step that starts a
        flow: a late payment's refund)."""

    def annotate(self, attributes: Mapping[str, Any]) -> None:
        """Add ``attributes`` (names, ids, states: never a value a merchant or a customer typed) to the current span."""

    def instrument(self, client: Any) -> None:
        """Trace the HTTP calls of an ``httpx.Client`` (the gateway client's)."""

    def fastapi_telemetry(self) -> dict[str, Any] | None:
        """FastAPI's ``telemetry=`` argument: its server spans on this face's provider (None: FastAPI's default)."""
        return None

    def flush(self, **_: object) -> None:
        """Export what is waiting in the batches now (a Celery pool child about to exit: its receiver)."""

    def close(self) -> None:
        """Export what is left and stop (the runtime's close)."""


#: The one off face: every part built without tracing shares it.
OFF = Tracing()


def configured(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for traces (see the module's docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = {name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()}
    return bool(names - {"none"})


def from_environ(environ: Mapping[str, str], *, service: str = "durapay", mask: Callable[[str], str] | None = None) -> Tracing:
    """:data:`OFF`, or the on face built from the standard ``OTEL_*`` variables. Raises
    ``SettingsError`` (before anything starts) when traces are asked for and cannot be made: an unknown
    exporter, request headers asked to be captured (:data:`CAPTURED_HEADERS`), or the ``otel`` extra not
    installed. ``mask``: what every text attribute passes through before it is exported (the runtime gives
    ``workflows.engine.sensitive.mask_text``: a card number a request's URL carried is masked in its server span)."""
    if not configured(environ):
        return OFF
    from durapay.config.settings import SettingsError

    names = {name.strip().lower() for name in environ["OTEL_TRACES_EXPORTER"].split(",") if name.strip()} - {"none"}
    unknown = names - EXPORTERS
    if unknown:
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER={environ['OTEL_TRACES_EXPORTER']}: durapay exports traces to {', '.join(sorted(EXPORTERS))} "
            f"or none, not {', '.join(sorted(unknown))}"
        )
    captured = [name for name in CAPTURED_HEADERS if environ.get(name, "").strip()]
    if captured:
        # The gateway client's requests carry its API key in a header: a captured header is an attribute.
        raise SettingsError(
            f"{', '.join(captured)} is set: durapay's HTTP calls carry keys in their headers (X-Api-Key, Authorization), "
            "which would be exported as span attributes; unset it"
        )
    try:
        from durapay.config import _otel
    except ImportError as exc:
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed ({exc.name}): install durapay[otel], "
            "or unset OTEL_TRACES_EXPORTER"
        ) from None
    return _otel.OtelTracing.from_environ(environ, sorted(names), service=service, mask=mask)
