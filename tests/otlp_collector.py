"""A trace collector for tests whose spans are made in other processes (a worker that is SIGKILLed):
OTLP over HTTP/protobuf, what ``OTEL_TRACES_EXPORTER=otlp`` sends, on a free port of 127.0.0.1.

Each span received is kept as a :class:`Received` (ids as the hex a ``traceparent`` spells them).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Received:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    #: (trace id, span id) of each link.
    links: tuple[tuple[str, str], ...]
    attributes: dict[str, Any] = field(hash=False)
    #: Every other value the exporter sent with it: events' names and attributes, links' attributes, the status's text.
    extra: tuple[str, ...] = ()
    resource: dict[str, Any] = field(default_factory=dict, hash=False)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: _value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


class Collector:
    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest.FromString(body)
                collector.take(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {item.key: _value(item.value) for item in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    extra = [span.status.message]
                    for event in span.events:
                        extra += [event.name, *(str(_value(item.value)) for item in event.attributes)]
                    for link in span.links:
                        extra += [str(_value(item.value)) for item in link.attributes]
                    received = Received(
                        span.name,
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        {item.key: _value(item.value) for item in span.attributes},
                        tuple(value for value in extra if value),
                        resource,
                    )
                    with self.lock:
                        self.spans.append(received)

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.spans)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
