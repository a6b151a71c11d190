"""Traces' switch and faces (``config.tracing``, ``config._otel``): off unless OTEL_* asks, nothing of the
SDK imported when off, flow ids on every span and in every log line made meanwhile."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durapay.config import SettingsError
from durapay.config.tracing import OFF, FlowTag, configured, from_environ
from durapay.workflows.engine.sensitive import Identifier, install_log_masking
from tests.spans import Spans

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": ""}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none, console"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        # The SDK's own default (otlp when unset) is not durapay's: an endpoint alone turns nothing on.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ],
)
def test_traces_are_on_only_when_an_exporter_is_named(environ: dict[str, str], on: bool) -> None:
    assert configured(environ) is on
    if not on:
        assert from_environ(environ) is OFF


def test_an_exporter_durapay_does_not_make_is_refused_naming_the_choices() -> None:
    with pytest.raises(SettingsError, match=r"console, otlp or none, not zipkin"):
        from_environ({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_request_headers_copied_into_spans_are_refused_they_carry_keys() -> None:
    with pytest.raises(SettingsError, match=r"X-Api-Key"):
        from_environ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST": ".*"})


@pytest.mark.parametrize("exporter", ["console", "otlp"])
def test_each_exporter_is_built_on_a_provider_of_its_own(exporter: str) -> None:
    tracing = from_environ({"OTEL_TRACES_EXPORTER": exporter})
    try:
        assert tracing.on and tracing is not OFF
        assert tracing.context() == ""  # no span current: nothing to keep on a record
    finally:
        tracing.close()


PROBE = """
import json, sys
BLOCK = [name for name in sys.argv[1].split(",") if name]

class Blocker:
    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == name or fullname.startswith(name + ".") for name in BLOCK):
            raise ImportError(f"blocked: {fullname}", name=fullname)
        return None

sys.meta_path.insert(0, Blocker())
import durapay.workflows.engine.api, durapay.tasks.celery_tasks, durapay.service.runtime, durapay.service.app
from durapay.config.tracing import OFF, from_environ
from durapay.config import SettingsError
result = {"off": from_environ({}) is OFF}
result["modules"] = sorted(name for name in sys.modules if name.startswith(("opentelemetry", "durapay.config._otel")))
try:
    from_environ({"OTEL_TRACES_EXPORTER": "console"}).close()
    result["on"] = "built"
except SettingsError as exc:
    result["on"] = str(exc)
print(json.dumps(result))
"""


def probe(block: str = "") -> dict[str, object]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    answer = subprocess.run(
        [sys.executable, "-c", PROBE, block], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return dict(json.loads(answer.stdout.strip().splitlines()[-1]))


def test_with_no_traces_configured_durapay_imports_nothing_of_its_tracing() -> None:
    """Every process's modules imported, tracing not configured: neither durapay's on face nor the SDK's
    tracing nor an instrumentation or exporter is imported. (The OpenTelemetry *API* and the SDK's
    metrics are: FastAPI imports the API for its own telemetry, and redis-py imports the metrics SDK
    when it is installed; neither makes a span or sends anything unless configured.)"""
    result = probe()
    assert result["off"] is True
    modules = [str(name) for name in result["modules"]]  # type: ignore[attr-defined]
    ours = ("durapay.config._otel", "opentelemetry.sdk.trace", "opentelemetry.instrumentation", "opentelemetry.exporter")
    assert not [name for name in modules if name.startswith(ours)], modules


def test_without_the_otel_extra_durapay_runs_and_asking_for_traces_names_the_extra() -> None:
    result = probe("opentelemetry.sdk,opentelemetry.instrumentation,opentelemetry.exporter")
    assert result["off"] is True
    assert "install durapay[otel]" in str(result["on"]), result


def test_every_span_started_for_a_flow_carries_it_and_errors_keep_their_type_only() -> None:
    spans = Spans()
    tag = FlowTag("f1", "moto")
    with pytest.raises(ValueError), spans.tracing.flow_span("outer", tag), spans.tracing.call_span("inner", {"x": 1}):
        raise ValueError("card 4349940199004549 refused")
    inner, outer = spans.one("inner"), spans.one("outer")
    for span in (inner, outer):
        assert span.attributes is not None
        assert (span.attributes["durapay.flow_id"], span.attributes["durapay.kind"], span.attributes["durapay.terminal"]) == (
            "f1",
            "moto",
            "default",
        )
        assert span.attributes["error.type"] == "ValueError" and span.status.description == "ValueError"
        assert not span.events  # no exception event: its message may quote an input
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id


def test_a_root_span_starts_a_trace_of_its_own_linked_to_the_kept_context() -> None:
    spans = Spans()
    tag = FlowTag("f2", "mit")
    with spans.tracing.flow_span("start mit", tag):
        kept = spans.tracing.context()
        with spans.tracing.step_span(tag, "pay", link=kept, attempt=1, state_before="ready", recovery=False) as step:
            step.ended("succeeded", "succeeded")
    start, pay = spans.one("start mit"), spans.one("step pay")
    assert kept.startswith("00-") and format(start.context.trace_id, "032x") in kept
    assert pay.parent is None and pay.context.trace_id != start.context.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in pay.links] == [
        (start.context.trace_id, start.context.span_id)
    ]
    assert pay.attributes is not None
    assert pay.attributes["durapay.state.after"] == "succeeded" and pay.attributes["durapay.step"] == "pay"


def test_a_kept_context_that_does_not_parse_gives_no_link() -> None:
    spans = Spans()
    with spans.tracing.step_span(FlowTag("f3", "mit"), "pay", link="junk", attempt=0, state_before="", recovery=True):
        pass
    assert spans.one("step pay").links == ()


def test_log_lines_made_for_a_flow_carry_its_trace_and_flow_ids(caplog: pytest.LogCaptureFixture) -> None:
    """Once, however many runtimes the process built (each installs the card masking's factory on top)."""
    spans = Spans()
    install_log_masking()
    Spans()
    with caplog.at_level(logging.INFO, logger="durapay.test"):
        with spans.tracing.flow_span("start moto", FlowTag("f4", "moto")):
            logging.getLogger("durapay.test").info("working on %s", "it")
        logging.getLogger("durapay.test").info("after")
    trace_id = format(spans.one("start moto").context.trace_id, "032x")
    during, after = (record.getMessage() for record in caplog.records[-2:])
    assert during == f"working on it [trace={trace_id} flow=f4]"
    assert after == "after"


def test_a_flow_started_inside_another_flows_span_leaves_that_span_its_own() -> None:
    """A step that starts a flow (a late payment's refund): the step's span keeps its flow's attributes,
    the new flow's start span has the new one's."""
    spans = Spans()
    with spans.tracing.flow_span("step refund", FlowTag("f-paid", "hpp")):
        spans.tracing.tag_current(FlowTag("f-refund", "refund"))
        with spans.tracing.flow_span("start refund", FlowTag("f-refund", "refund")):
            pass
    assert (spans.one("step refund").attributes or {})["durapay.flow_id"] == "f-paid"
    assert (spans.one("start refund").attributes or {})["durapay.flow_id"] == "f-refund"


def test_a_request_span_begun_before_any_flow_is_named_for_the_flow_it_started() -> None:
    spans = Spans()
    with spans.tracing.call_span("POST /flows/moto", {}):
        spans.tracing.tag_current(FlowTag("f-new", "moto"))
    assert (spans.one("POST /flows/moto").attributes or {})["durapay.flow_id"] == "f-new"


def test_the_card_masking_is_not_installed_again_over_the_trace_naming(caplog: pytest.LogCaptureFixture) -> None:
    """Each runtime installs the card masking: installed over the naming a second time, it masked again
    text whose identifiers (a Luhn-valid operation id) the first had kept whole."""
    install_log_masking()
    spans = Spans()
    top = logging.getLogRecordFactory()
    install_log_masking()
    assert logging.getLogRecordFactory() is top
    with caplog.at_level(logging.INFO, logger="durapay.test"), spans.tracing.flow_span("step pay", FlowTag("f5", "moto")):
        logging.getLogger("durapay.test").info("operation %s", Identifier("4349940199004549"))
    assert caplog.records[-1].getMessage().startswith("operation 4349940199004549 [trace=")
