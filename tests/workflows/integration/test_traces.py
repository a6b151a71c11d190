"""One flow's trace end to end (issue 40, item 3): the API over ASGI, steps run as a worker runs them,
the simulator over HTTP, the SDK's in-memory exporter.

A 3-step card payment with a 3DS challenge: started by ``POST /flows/three_steps`` (FastAPI's server
span), waits for the customer, is resumed by ``POST /flows/{id}/signals/3ds_result``; its payment call is
made by a worker that dies before writing the answer (it claims, calls, and never completes: what a
SIGKILL after the gateway committed leaves), and the next worker takes the step over after the lease and
reads the gateway first. Every span names its flow; every step and gateway call has its span; the step
spans link to the start; no card number, CVV, token or key is in anything an exporter would send.

Steps are run here with ``engine.run_step`` (what the Celery task calls), so that the dying worker is
exactly placed; nothing is sent to Celery.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from durapay.config.tracing import OFF, TRACE_FIELD
from durapay.service.app import create_app
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.clock import OffsetClock
from durapay.workflows.engine.states import FlowState
from tests.spans import Spans, leaks
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_flows import CHALLENGE, card, order, session

API_KEY = "trace-test-api-key-0123456789"
CVV = "987"


class Traced:
    def __init__(self, runtime: Runtime, spans: Spans, clock: OffsetClock, simulator: SimulatorServer) -> None:
        self.runtime, self.spans, self.clock, self.simulator = runtime, spans, clock, simulator
        self.api = TestClient(create_app(runtime), headers={"X-Api-Key": API_KEY})

    def drive(self, flow_id: str, *, until: str | None = None) -> Any:
        """Run the flow's steps as a worker would, while it is ready (and not at ``until``)."""
        engine = self.runtime.engine
        for _ in range(20):
            record = engine.get(flow_id)
            if record.state is not FlowState.READY or record.step == until:
                return record
            engine.run_step(flow_id, record.step, worker="w1")
        raise AssertionError(f"flow {flow_id} did not stop in 20 steps")


@pytest.fixture
def traced(redis_url: str, key_prefix: str, simulator: SimulatorServer) -> Iterator[Traced]:
    simulator.admin.clear_faults()
    spans = Spans()
    clock = OffsetClock()
    settings = stack_settings(key_prefix, simulator.base_url, api={"key": API_KEY})
    runtime = build_runtime(settings, redis_url=redis_url, clock=clock, rng=random.Random(3), tracing=spans.tracing)
    runtime.engine.sender = None  # steps run in the test (Traced.drive), none through Celery
    yield Traced(runtime, spans, clock, simulator)
    runtime.close()
    spans.close()


def secrets(traced: Traced, pan: str, *extra: str) -> dict[str, str]:
    settings = traced.runtime.settings
    found = {
        "card number": pan,
        "gateway API key": settings.gateway.api_key.get_secret_value(),
        "durapay API key": API_KEY,
        "card key": settings.card.keys[0].get_secret_value().split(":", 1)[1],
    }
    found.update({f"value {index}": value for index, value in enumerate(extra) if value})
    return found


def attribute(span: Any, name: str) -> Any:
    return (span.attributes or {}).get(name)


@pytest.mark.integration
def test_a_3ds_flow_with_a_worker_lost_mid_call_is_one_linked_trace_with_nothing_secret(traced: Traced) -> None:
    answer = traced.api.post("/flows/three_steps", json={"order": order(), "card": {**card(CHALLENGE), "cvv": CVV}})
    assert answer.status_code in {200, 201, 202}, answer.text
    flow_id = answer.json()["id"]
    waiting = traced.drive(flow_id)
    assert waiting.state is FlowState.WAITING, waiting.summary()
    init = waiting.outputs["init"]
    pares = traced.simulator.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"])
    resumed = traced.api.post(f"/flows/{flow_id}/signals/3ds_result", json={"PaRes": pares})
    assert resumed.status_code == 200, resumed.text
    before_payment = traced.drive(flow_id, until="payment")
    assert before_payment.step == "payment", before_payment.summary()

    # A worker claims the payment, calls the gateway, and dies before it writes the answer: a process of
    # its own, whose spans (its step's never ended) never reach the exporter.
    engine = traced.runtime.engine
    other = build_runtime(traced.runtime.settings, redis_url=traced.runtime.redis_url, clock=traced.clock, tracing=OFF)
    try:
        dying = other.engine.claim(flow_id, "payment", worker="dying")
        assert not isinstance(dying, str), dying
        other.engine.protocol.run(dying)
    finally:
        other.close()
    paid = traced.simulator.admin.operations(order_id=before_payment.order_id)
    assert [op for op in paid if op["operationType"] in {"AUTHORIZATION", "CAPTURE"}], "its call reached the gateway"
    traced.clock.offset += engine.lease + 1  # its lease runs out: the dispatcher would send the step again
    assert engine.run_step(flow_id, "payment", worker="w2") == "succeeded"
    done = engine.get(flow_id)
    assert done.state is FlowState.SUCCEEDED, done.summary()

    spans = traced.spans
    mine = spans.of_flow(flow_id)
    names = [span.name for span in mine]
    assert {"step init", "step challenge", "step validation", "step payment"} <= set(names), names
    assert {"gateway three_steps_init", "gateway three_steps_validation"} <= set(names), names
    assert "signal 3ds_result" in names and "start three_steps" in names, names
    # Everything exported is the flow's: server spans, durapay's, and httpx's own client spans.
    assert len(mine) == len(spans.finished()), sorted({span.name for span in spans.finished()} - set(names))
    for span in mine:
        assert attribute(span, "durapay.kind") == "three_steps" and attribute(span, "durapay.terminal") == "default"
    servers = [span for span in mine if span.kind.name == "SERVER"]
    assert len(servers) == 2, "the start's request and the signal's"
    assert [span.name for span in mine if span.kind.name == "CLIENT"], "httpx's spans of the gateway calls"

    # One trace per request, the steps' linked to the start's: every span is in the start's trace, or in
    # a trace whose root links to it.
    start = spans.one("start three_steps")
    assert start.parent is not None and start.parent.span_id == servers[0].context.span_id, "the start under its request"
    assert engine.get(flow_id).fields[TRACE_FIELD].split("-")[2] == f"{start.context.span_id:016x}"
    roots = {span.context.trace_id: span for span in mine if span.parent is None}
    for trace_id, root in roots.items():
        if trace_id != start.context.trace_id and root.kind.name != "SERVER":
            assert [link.context.span_id for link in root.links] == [start.context.span_id], root.name
    signal = spans.one("signal 3ds_result")
    assert [link.context.span_id for link in signal.links] == [start.context.span_id]

    # The payment: the dying worker's call, then the take-over that read the gateway first.
    payment = spans.named("step payment")
    assert len(payment) == 1, "the dying worker's step span never ended: only the take-over's"
    taken = payment[0]
    assert attribute(taken, "durapay.recovery") is True and attribute(taken, "durapay.state.before") == "running"
    assert attribute(taken, "durapay.outcome") == "succeeded" and attribute(taken, "durapay.state.after") == "succeeded"
    reads = [span for span in mine if span.parent is not None and span.parent.span_id == taken.context.span_id]
    assert reads and all(span.name.startswith("gateway ") for span in reads), [span.name for span in reads]
    assert "gateway three_steps_payment" not in [span.name for span in reads], "reconciled, not called again"

    values = [pares, init["threeDSAuthRequest"], json.dumps(init.get("securityToken") or "")[1:-1]]
    assert not leaks(spans.finished(), secrets(traced, CHALLENGE, *values))
    cvvs = [(span.name, key) for span in spans.finished() for key, value in (span.attributes or {}).items() if str(value) == CVV]
    assert not cvvs


@pytest.mark.integration
def test_a_notification_that_resumes_a_flow_is_in_its_trace(traced: Traced) -> None:
    """A hosted page paid: the gateway's notification (taken from the simulator's delivery log, posted to
    the receiver) is a server span naming the flow, with the resume under it, linked to the start."""
    answer = traced.api.post("/flows/hpp", json={"order": order(), "paymentSession": session()})
    assert answer.status_code in {200, 201, 202}, answer.text
    flow_id = answer.json()["id"]
    waiting = traced.drive(flow_id)
    assert waiting.state is FlowState.WAITING, waiting.summary()
    traced.simulator.admin.complete_hpp(waiting.order_id)
    sent = traced.simulator.admin.wait_for_notifications(lambda log: bool(log), order_id=waiting.order_id)
    body = sent[-1]["body"]
    path = traced.runtime.settings.receiver.path
    received = traced.api.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert received.status_code == 200, received.text
    done = traced.drive(flow_id)
    assert done.state is FlowState.SUCCEEDED, done.summary()

    spans = traced.spans
    by_id = {span.context.span_id: span for span in spans.finished()}
    notified, resume, start = spans.one("notification"), spans.one("signal notification"), spans.one("start hpp")
    assert attribute(resume, "durapay.flow_id") == flow_id and attribute(resume, "durapay.by") == "notification"
    for span in (notified, resume):
        assert [link.context.span_id for link in span.links] == [start.context.span_id]
    assert resume.parent is not None and resume.parent.span_id == notified.context.span_id
    assert notified.parent is not None
    request = by_id[notified.parent.span_id]
    assert request.kind.name == "SERVER" and attribute(request, "durapay.flow_id") == flow_id
    assert attribute(notified, "durapay.answer") == 200 and attribute(notified, "durapay.kind") == "hpp"
    read = [
        span for span in spans.named("gateway get_operation") if span.parent and span.parent.span_id == notified.context.span_id
    ]
    assert read, "the receiver's read-back of the notified operation, under the notification"
    assert len(spans.of_flow(flow_id)) == len(spans.finished()), "every span exported is the flow's"
    assert not leaks(spans.finished(), secrets(traced, "", str(body.get("securityToken") or "")))
