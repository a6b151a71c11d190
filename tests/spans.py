"""Traces in tests: the SDK's in-memory exporter behind durapay's on face (``config._otel``).

Each :class:`Spans` has a provider of its own (durapay never sets OpenTelemetry's global one), exporting
each span as it ends (``SimpleSpanProcessor``), so a test reads them at once, without waiting for a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durapay.config._otel import MaskingExporter, OtelTracing


class Spans:
    """``mask``: export through ``MaskingExporter`` as a runtime does (by default the spans as made, so that
    a test of what durapay's spans hold does not lean on the masking)."""

    def __init__(self, mask: Callable[[str], str] | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        exporter: SpanExporter = MaskingExporter(self.exporter, mask) if mask else self.exporter
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracing = OtelTracing(self.provider)

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, (name, [span.name for span in self.finished()])
        return found[0]

    def of_flow(self, flow_id: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if (span.attributes or {}).get("durapay.flow_id") == flow_id]

    def close(self) -> None:
        self.provider.shutdown()


def exported_values(spans: list[ReadableSpan]) -> Iterator[tuple[str, str, Any]]:
    """Every value an exporter would send, as (span name, where, value): names, attributes, events'
    and links' attributes, status descriptions, resources."""
    for span in spans:
        yield span.name, "name", span.name
        for key, value in (span.attributes or {}).items():
            yield span.name, key, value
        for event in span.events:
            yield span.name, f"event {event.name}", event.name
            for key, value in (event.attributes or {}).items():
                yield span.name, f"event {event.name} {key}", value
        for link in span.links:
            for key, value in (link.attributes or {}).items():
                yield span.name, f"link {key}", value
        if span.status.description:
            yield span.name, "status", span.status.description
        for key, value in span.resource.attributes.items():
            yield span.name, f"resource {key}", value


def leaks(spans: list[ReadableSpan], secrets: dict[str, str]) -> list[tuple[str, str, str]]:
    """Which of ``secrets`` (what it is: its text) any exported value holds: (span, where, what)."""
    found = []
    for name, where, value in exported_values(spans):
        text = str(value)
        found.extend((name, where, what) for what, secret in secrets.items() if secret and secret in text)
    return found
