"""The API's server spans (FastAPI's native telemetry on durapay's provider): a request's URL is recorded
as sent, so a card number typed into a query reaches the exporter masked (``config._otel.MaskingExporter``
with ``workflows.engine.sensitive.mask_text``, as ``build_runtime`` sets it up)."""

from __future__ import annotations

import random

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from durapay.config import load_settings
from durapay.service.app import create_app
from durapay.service.runtime import build_runtime
from durapay.workflows.engine.sensitive import mask_text
from tests.spans import Spans, leaks

API_KEY = "trace-api-test-key-0123456789"
PAN = "4349940199004549"


def test_a_card_number_in_a_requests_query_is_masked_in_its_server_span(redis_url: str, key_prefix: str) -> None:
    spans = Spans(mask=mask_text)
    raw = InMemorySpanExporter()  # the same spans as FastAPI made them, unmasked
    spans.provider.add_span_processor(SimpleSpanProcessor(raw))
    settings = load_settings({"engine": {"key_prefix": key_prefix}, "api": {"key": API_KEY}})
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(1), tracing=spans.tracing)
    try:
        api = TestClient(create_app(runtime), headers={"X-Api-Key": API_KEY})
        answer = api.get("/flows", params={"q": PAN})
        assert answer.status_code >= 400, answer.text  # refused: an unknown parameter
    finally:
        runtime.close()
    (made,) = [span for span in raw.get_finished_spans() if span.kind.name == "SERVER"]
    assert PAN in str((made.attributes or {}).get("url.query")), "FastAPI records the query as sent"
    (exported,) = [span for span in spans.finished() if span.kind.name == "SERVER"]
    assert (exported.attributes or {}).get("http.response.status_code") == answer.status_code
    assert not leaks(spans.finished(), {"card number": PAN, "API key": API_KEY})
    assert "4549" in str((exported.attributes or {}).get("url.query")), "masked as durapay masks: the last four kept"
