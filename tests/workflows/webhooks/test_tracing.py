"""A webhook delivery's span (``config.tracing``): a trace of its own, linked to its flow's start,
naming the flow and the endpoint, never the endpoint's URL or secret."""

from __future__ import annotations

import random
from typing import Any

from bench._webhook_receiver import WebhookReceiver
from durapay.config import load_settings
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.webhooks import Webhooks
from tests.spans import Spans, leaks
from tests.workflows.engine_support import ScriptedStep, flow
from tests.workflows.webhooks.test_delivery import tick


def test_each_delivery_is_a_span_linked_to_its_flows_start(
    make_engine: Any, clock: ManualClock, receiver: WebhookReceiver
) -> None:
    spans = Spans()
    engine, _ = make_engine(flow(ScriptedStep("pay")), tracing=spans.tracing)
    settings = load_settings({"webhooks": {"allow_private": True, "timeout": 2.0}})
    webhooks = Webhooks(engine.redis, engine.keys, settings.webhooks, now=clock.now, rng=random.Random(5), tracing=spans.tracing)
    endpoint = webhooks.endpoints.add(receiver.url + "?token=endpoint-query-secret")
    receiver.secrets = [endpoint.secret]
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "pay")
    tick(webhooks)
    assert sorted(got.type for got in receiver.received) == ["flow.created", "flow.succeeded"]

    start = spans.one("start demo")
    for name in ("webhook flow.created", "webhook flow.succeeded"):
        span = spans.one(name)
        attributes = dict(span.attributes or {})
        assert span.parent is None and [link.context.span_id for link in span.links] == [start.context.span_id]
        assert attributes["durapay.flow_id"] == record.id and attributes["durapay.kind"] == "demo"
        assert attributes["durapay.endpoint"] == endpoint.id and attributes["durapay.delivered"] is True
        assert attributes["http.response.status_code"] == 200 and attributes["durapay.attempt"] == 1
    assert not leaks(spans.finished(), {"endpoint secret": endpoint.secret, "endpoint URL": "endpoint-query-secret"})
