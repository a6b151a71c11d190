"""The on face of ``config.tracing``: OpenTelemetry's SDK, imported only when traces are configured.

One :class:`OtelTracing` per process holds the tracer provider: durapay never sets OpenTelemetry's
global provider (a library must not; the app that embeds durapay may have its own), so each part is
handed this provider: FastAPI's native server spans (``fastapi_telemetry``), the httpx instrumentation
of the gateway client (``instrument``), and durapay's own spans.

Two processor-level rules hold for every span, whoever made it:

* the flow running now (``tracing.CURRENT_FLOW``) is stamped on every span started meanwhile
  (``durapay.flow_id``, ``durapay.kind``, ``durapay.terminal``): an httpx span knows nothing of flows;
* durapay's own spans record an error's type, never its text (``exception.message`` of a gateway's
  validation error may quote an input); the attributes durapay writes are names, ids and states only.

Log lines made while a span or a flow is current end with `` [trace=<trace id> flow=<flow id>]``: a
record factory, like the card masking's (``workflows.engine.sensitive``), so it holds whatever handler or format
Celery, uvicorn or the deployment installs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from durapay.config.tracing import CURRENT_FLOW, FlowTag, StepSpan, Tracing

KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT, "consumer": SpanKind.CONSUMER}
_PROPAGATOR = TraceContextTextMapPropagator()


class FlowStamp(SpanProcessor):
    """Stamps the current flow's attributes on every span at its start (an httpx span, FastAPI's)."""

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        tag = CURRENT_FLOW.get()
        if tag is not None:
            span.set_attributes(tag.attributes())

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _StepSpan(StepSpan):
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def ended(self, outcome: str, state_after: str) -> None:
        self.span.set_attributes({"durapay.outcome": outcome, "durapay.state.after": state_after})


class OtelTracing(Tracing):
    """Spans on ``provider``. ``owned``: this face built the provider and shuts it down at ``close``."""

    on = True

    def __init__(self, provider: TracerProvider, *, owned: bool = False) -> None:
        self.provider = provider
        self.owned = owned
        provider.add_span_processor(FlowStamp())
        self.tracer = provider.get_tracer("durapay")
        install_log_ids()

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], exporters: Sequence[str], *, service: str, mask: Callable[[str], str] | None = None
    ) -> OtelTracing:
        """A provider exporting to ``exporters`` in batches (``OTEL_BSP_*``); the resource from
        ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` over ``service``; the sampler from
        ``OTEL_TRACES_SAMPLER``; OTLP's endpoint and headers from ``OTEL_EXPORTER_OTLP_*`` (the SDK reads
        them from the process's environment). ``mask``: applied to every text attribute before export
        (:class:`MaskingExporter`)."""
        named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        # Resource.create lets the attributes it is given win over the environment's: give none then.
        provider = TracerProvider(resource=Resource.create({} if named else {"service.name": service}))
        for name in exporters:
            exporter = _exporter(name)
            provider.add_span_processor(BatchSpanProcessor(MaskingExporter(exporter, mask) if mask else exporter))
        return cls(provider, owned=True)

    def context(self) -> str:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier.get("traceparent", "")

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
        with self._span(name, tag, link=link, attributes=attributes, kind=kind, root=root):
            yield

    @contextlib.contextmanager
    def step_span(
        self, tag: FlowTag, step: str, *, link: str, attempt: int, state_before: str, recovery: bool
    ) -> Iterator[StepSpan]:
        attributes = {
            "durapay.step": step,
            "durapay.attempt": attempt,
            "durapay.state.before": state_before,
            "durapay.recovery": recovery,
        }
        with self._span(f"step {step}", tag, link=link, attributes=attributes, kind="consumer", root=True) as span:
            yield _StepSpan(span)

    @contextlib.contextmanager
    def _span(
        self, name: str, tag: FlowTag, *, link: str, attributes: Mapping[str, Any] | None, kind: str, root: bool
    ) -> Iterator[trace.Span]:
        token = CURRENT_FLOW.set(tag)
        try:
            with self.tracer.start_as_current_span(
                name,
                context=Context() if root else None,
                kind=KINDS[kind],
                links=links(link),
                attributes={**tag.attributes(), **(attributes or {})},
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    yield span
                except BaseException as exc:
                    error(span, exc)
                    raise
        finally:
            CURRENT_FLOW.reset(token)

    @contextlib.contextmanager
    def call_span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
        """A child of the current span (a gateway call inside a step): the flow stamped by ``FlowStamp``."""
        with self.tracer.start_as_current_span(
            name, kind=SpanKind.INTERNAL, attributes=dict(attributes), record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield
            except BaseException as exc:
                error(span, exc)
                raise

    def tag_current(self, tag: FlowTag) -> None:
        if CURRENT_FLOW.get() is None:  # a request's span; never another flow's (a refund started by a step)
            trace.get_current_span().set_attributes(tag.attributes())

    def annotate(self, attributes: Mapping[str, Any]) -> None:
        trace.get_current_span().set_attributes(dict(attributes))

    def instrument(self, client: Any) -> None:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor.instrument_client(client, tracer_provider=self.provider)

    def fastapi_telemetry(self) -> dict[str, Any] | None:
        # Server spans only: operation spans (dependencies, serialization) and FastAPI's own metrics and
        # log records are not durapay's to switch on.
        return {"tracer_provider": self.provider, "metrics": False, "logs": False, "operation_spans": False}

    def flush(self, **_: object) -> None:
        self.provider.force_flush()

    def close(self) -> None:
        if self.owned:
            self.provider.shutdown()


class MaskingExporter(SpanExporter):
    """Exports each span with its text attributes passed through ``mask`` (``workflows.engine.sensitive.mask_text``,
    the one home of what a card number looks like, handed in by the runtime). durapay's own attributes hold
    none; this is for what others record as they got it: a request's path and query in FastAPI's server
    span (an operator who typed a card number into a search), a URL in httpx's."""

    def __init__(self, inner: SpanExporter, mask: Callable[[str], str]) -> None:
        self.inner = inner
        self.mask = mask

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([self._masked(span) for span in spans])

    def _masked(self, span: ReadableSpan) -> ReadableSpan:
        attributes = dict(span.attributes or {})
        masked = {key: self.mask(value) if isinstance(value, str) else value for key, value in attributes.items()}
        if masked == attributes:
            return span
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=masked,
            events=span.events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def links(traceparent: str) -> list[Link]:
    """A link to the span ``traceparent`` names, or none (empty, or not a valid traceparent)."""
    if not traceparent:
        return []
    context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
    return [Link(context)] if context.is_valid else []


def error(span: trace.Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``'s type only: an error's text may quote what it refused."""
    name = type(exc).__name__
    span.set_attribute("error.type", name)
    span.set_status(Status(StatusCode.ERROR, name))


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def install_log_ids() -> None:
    """End every log line made while a span or a flow is current with its trace id and flow id. Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "names_traces", False):
        return

    def naming(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if getattr(record, "trace_named", False):
            # Named by a copy of this factory further in: another factory (the card masking, installed by
            # each runtime built) wrapped it, so the check on the outermost factory above missed it.
            return record
        record.trace_named = True
        context = trace.get_current_span().get_span_context()
        tag = CURRENT_FLOW.get()
        if not context.is_valid and tag is None:
            return record
        ids = []
        if context.is_valid:
            record.trace_id = trace_id = format(context.trace_id, "032x")
            ids.append(f"trace={trace_id}")
        if tag is not None:
            record.flow_id = tag.flow_id
            ids.append(f"flow={tag.flow_id}")
        # Onto the format, the arguments left as they are: a factory outside this one (the card masking)
        # still reads them (an identifier marked whole). The ids hold no ``%``.
        record.msg = f"{record.msg} [{' '.join(ids)}]"
        return record

    naming.names_traces = True  # type: ignore[attr-defined]
    # What the factory it wraps says of itself holds through it: the card masking (``workflows.engine.sensitive``)
    # knows it is installed by that mark on the outermost factory. Hidden, it was installed again over
    # this one, and masked a second time text whose identifiers the first had kept whole.
    naming.masks_card_numbers = getattr(previous, "masks_card_numbers", False)  # type: ignore[attr-defined]
    logging.setLogRecordFactory(naming)
