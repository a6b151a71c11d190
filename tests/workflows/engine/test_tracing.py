"""The engine's spans (``config.tracing``): a start keeps its trace context on the record, each step is a
span linked to it, a recovery after a dead worker says so; with tracing off the start sends Redis exactly
the commands it sends with it on, less the one field."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.config.tracing import OFF, TRACE_FIELD, Tracing
from durapay.tasks.outcomes import Advance
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from tests.spans import Spans
from tests.waiting import wait_until
from tests.workflows.engine_support import T0, ScriptedStep, Sent, flow, wait_step


@pytest.fixture(scope="module")
def monitored_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey of this file's own: MONITOR sees this test's commands only."""
    server = EmbeddedValkey(Path(tmp_path_factory.mktemp("monitored-valkey")))
    server.start()
    yield server.url
    server.stop()


def monitored(url: str, action: Callable[[], Any]) -> tuple[list[str], list[str]]:
    """The commands ``action`` sent to the server at ``url`` (MONITOR's text of each, in order): those
    sent by the client (each one round trip, or a pipeline's part), and those its scripts ran inside."""
    seen: list[str] = []
    inside: list[str] = []
    watcher = redis.Redis.from_url(url)
    client = redis.Redis.from_url(url)

    def watch() -> None:
        with watcher.monitor() as monitor:
            for command in monitor.listen():
                (inside if command.get("client_type") == "lua" else seen).append(str(command["command"]))
                if command["command"] == "ECHO end-of-action":
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    wait_until(lambda: client.echo("begin") and "ECHO begin" in seen, what="MONITOR to see this client")
    begin = max(index for index, command in enumerate(seen) if command == "ECHO begin")
    inside.clear()
    action()
    client.echo("end-of-action")
    thread.join(timeout=30)
    assert not thread.is_alive()
    watcher.close()
    client.close()
    return [command for command in seen[begin + 1 : -1] if command != "ECHO begin"], inside


def shape(command: str) -> tuple[str, ...]:
    """A command's name (and a script's digest): what stays the same between two starts."""
    words = command.split()
    return tuple(words[:2]) if words[0].upper() in {"EVALSHA", "EVAL", "SCRIPT"} else (words[0],)


def test_the_start_sends_the_same_commands_with_tracing_off_and_the_field_only_when_on(monitored_url: str) -> None:
    client = redis.Redis.from_url(monitored_url)
    spans = Spans()

    def engine(prefix: str, tracing: Tracing) -> Engine:
        settings = load_settings({"engine": {"key_prefix": prefix, "partitions": 3}})
        registry = {"demo": flow(ScriptedStep("pay"))}
        return Engine(settings, client, registry, sender=Sent(), clock=ManualClock(T0), tracing=tracing)

    off, on = engine("off", OFF), engine("on", spans.tracing)
    off.start("demo", {"amount": 5}, key="warm")  # scripts loaded, durability probed: both engines share them
    on.start("demo", {"amount": 5}, key="warm")
    spans.exporter.clear()
    ids: dict[str, str] = {}
    plain, plain_inside = monitored(monitored_url, lambda: ids.setdefault("off", off.start("demo", {"amount": 5}, key="k1").id))
    traced, traced_inside = monitored(monitored_url, lambda: ids.setdefault("on", on.start("demo", {"amount": 5}, key="k1").id))
    assert plain and plain_inside, "the start sent a script, and the script wrote"
    # The same round trips, the same scripts: the trace context rides in the create's fields.
    assert [shape(command) for command in plain] == [shape(command) for command in traced]
    assert not [command for command in plain + plain_inside if TRACE_FIELD in command.split()]
    assert not [command for command in plain if f'{TRACE_FIELD}\\":' in command or f'"{TRACE_FIELD}":' in command]

    # Inside the create script: the same commands, its one HSET of the record's fields naming that field.
    def record_hset(commands: list[str]) -> str:
        (hset,) = [command for command in commands if command.split()[0] == "HSET" and ":flow:" in command.split()[1]]
        return hset

    assert TRACE_FIELD in record_hset(traced_inside).split() and TRACE_FIELD not in record_hset(plain_inside).split()
    assert [command.split()[0] for command in traced_inside] == [command.split()[0] for command in plain_inside]
    assert TRACE_FIELD not in off.store.get(ids["off"]).fields  # type: ignore[union-attr]
    kept = on.store.get(ids["on"]).fields[TRACE_FIELD]  # type: ignore[union-attr]
    start = spans.one("start demo").context
    assert kept.startswith(f"00-{start.trace_id:032x}-{start.span_id:016x}-"), "the start span's context (W3C traceparent)"


def test_each_step_is_a_span_linked_to_the_flows_start(make_engine: Any, clock: ManualClock) -> None:
    spans = Spans()
    first, second = ScriptedStep("first"), ScriptedStep("second", reconciles=[Advance({"adopted": True})])
    engine, _ = make_engine(flow(first, second), engine={"follow_steps": 0}, tracing=spans.tracing)
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "first") == "ready"
    # A worker claims the second step and dies: its span never ends (nothing exported); the next try,
    # after the lease, reads the gateway first and says it recovers.
    dead = engine.claim(record.id, "second", worker="dead")
    assert not isinstance(dead, str)
    clock.advance(engine.lease + 1)
    assert engine.run_step(record.id, "second", worker="new") == "succeeded"

    start = spans.one("start demo")
    steps = [spans.one("step first"), spans.one("step second")]
    for span in [start, *steps]:
        assert span.attributes is not None
        assert span.attributes["durapay.flow_id"] == record.id and span.attributes["durapay.kind"] == "demo"
        assert span.attributes["durapay.terminal"] == "default"
    for span in steps:
        assert span.parent is None, "a step runs later than its start: a trace of its own, linked"
        assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
            (start.context.trace_id, start.context.span_id)
        ]
    first_span, second_span = (dict(span.attributes or {}) for span in steps)
    assert first_span["durapay.state.before"] == "ready" and first_span["durapay.state.after"] == "ready"
    assert first_span["durapay.outcome"] == "ready" and first_span["durapay.recovery"] is False
    assert second_span["durapay.state.before"] == "running", "taken over from the dead worker"
    assert second_span["durapay.recovery"] is True and second_span["durapay.attempt"] == 2
    assert second_span["durapay.state.after"] == "succeeded"


def test_a_signal_is_a_span_linked_to_the_flows_start_under_the_current_one(make_engine: Any) -> None:
    spans = Spans()
    engine, _ = make_engine(flow(wait_step("customer")), tracing=spans.tracing)
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "customer") == "waiting"
    with spans.tracing.call_span("request", {}):  # as a request's server span: no flow current
        assert engine.signal(record.id, "paid", {"ok": True}) == "resumed"
    request, signal, start = spans.one("request"), spans.one("signal paid"), spans.one("start demo")
    assert signal.parent is not None and signal.parent.span_id == request.context.span_id
    assert [link.context.span_id for link in signal.links] == [start.context.span_id]
    assert (signal.attributes or {})["durapay.result"] == "resumed"
    assert (request.attributes or {})["durapay.flow_id"] == record.id, "the request's span names the flow it signalled"


def test_a_flow_started_with_tracing_off_runs_its_steps_with_tracing_on(make_engine: Any) -> None:
    """A record written before tracing was turned on (or by a process without it) has no trace context:
    its steps' spans carry no link, and nothing fails."""
    spans = Spans()
    step = ScriptedStep("only")
    engine, _ = make_engine(flow(step))
    record = engine.start("demo", {"amount": 5})
    engine.tracing = spans.tracing
    assert engine.run_step(record.id, "only") == "succeeded"
    assert spans.one("step only").links == ()
    assert engine.get(record.id).state is FlowState.SUCCEEDED


def test_flows_started_in_a_batch_each_keep_a_start_of_their_own(make_engine: Any) -> None:
    """A schedule's occurrences (``start_many``): no request to belong to, a start span each to link to."""
    spans = Spans()
    engine, _ = make_engine(flow(ScriptedStep("pay")), tracing=spans.tracing)
    ids = engine.start_many([("demo", {"amount": 5}, "b1"), ("demo", {"amount": 6}, "b2")])
    starts = {(span.attributes or {})["durapay.flow_id"]: span for span in spans.named("start demo")}
    assert set(starts) == set(ids)
    for flow_id in ids:
        assert isinstance(flow_id, str)
        kept = engine.get(flow_id).fields[TRACE_FIELD]
        assert kept.split("-")[2] == f"{starts[flow_id].context.span_id:016x}"
        engine.run_step(flow_id, "pay")
        (step,) = [span for span in spans.named("step pay") if (span.attributes or {})["durapay.flow_id"] == flow_id]
        assert [link.context.span_id for link in step.links] == [starts[flow_id].context.span_id]


def test_the_spans_of_a_flow_on_a_terminal_name_it(make_engine: Any) -> None:
    spans = Spans()
    engine, _ = make_engine(flow(ScriptedStep("pay")), tracing=spans.tracing, terminals={"it": {"api_key": "key-of-it"}})
    record = engine.start("demo", {"amount": 5}, terminal="it")
    assert engine.run_step(record.id, "pay") == "succeeded"
    for name in ("start demo", "step pay"):
        assert (spans.one(name).attributes or {})["durapay.terminal"] == "it", name
