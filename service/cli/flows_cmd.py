"""``durapay start`` and ``durapay flows ls|show|signal|cancel|retry|kinds``: flows from the terminal.

These talk to Redis directly through the engine (the same calls the HTTP API makes), so an operator on
a machine with the settings needs no API key. What they show is masked like the API's answers.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from service.api_flows import wait_for_customer_url
from service.cli._common import console, echo_json, fail, operator_errors, read_json_input, runtime, when
from service.timeparse import RUN_AT_FORMS, SINCE_FORMS, parse_run_at, parse_since
from service.views import flow_brief, flow_view
from workflows.engine import Engine
from workflows.inputs import read_input
from workflows.states import STOPPED, FlowState

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

flows_app = typer.Typer(help="List, inspect and steer flows.", no_args_is_help=True)


def _print_flow(view: dict[str, Any], history: list[dict[str, Any]] | None = None) -> None:
    out = console()
    table = Table(title=f"flow {view['id']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name in ("kind", "state", "step", "order_id", "customer_url", "attempt"):
        if view.get(name) not in (None, ""):
            table.add_row(name, str(view[name]))
    table.add_row("created", when(view.get("created")))
    table.add_row("updated", when(view.get("updated")))
    table.add_row("steps done", ", ".join(view.get("steps_done") or []) or "-")
    if view.get("outcome"):
        outcome = view["outcome"]
        table.add_row("result", str(outcome.get("result", "")))
        if outcome.get("reason"):
            table.add_row("reason", str(outcome["reason"]))
    if view.get("error"):
        table.add_row("error", str(view["error"]))
    out.print(table)
    if history:
        log = Table(title="history")
        for column in ("time", "from", "to", "step", "by", "what"):
            log.add_column(column, overflow="fold")
        for entry in history:
            log.add_row(
                when(entry.get("t")),
                entry.get("from") or "",
                entry.get("to") or "",
                entry.get("step") or "",
                entry.get("by") or "",
                entry.get("what") or "",
            )
        out.print(log)


def _wait_with_progress(engine: Engine, flow_id: str, seconds: float) -> dict[str, Any]:
    """Wait for the flow to stop, showing its state and step as they change."""
    deadline = time.monotonic() + seconds
    out = console()
    with out.status(f"flow {flow_id}: starting") as status:
        while True:
            record = engine.get(flow_id)
            status.update(f"flow {flow_id}: {record.state.value} at {record.step}")
            if record.state in STOPPED:
                return flow_view(record, engine.registry)
            if time.monotonic() >= deadline:
                fail(f"flow {flow_id} still {record.state.value} at step {record.step} after {seconds:g}s")
            time.sleep(0.1)


def start(
    kind: Annotated[str, typer.Argument(help="Flow kind (durapay flows kinds).")],
    json_input: Annotated[str, typer.Option("--json-input", help="JSON input: a file, or - for stdin.")] = "-",
    key: Annotated[str | None, typer.Option("--key", help="Start key: the same key and input give the same flow.")] = None,
    run_at: Annotated[str | None, typer.Option("--run-at", help=f"Run later: {RUN_AT_FORMS}.")] = None,
    wait: Annotated[float, typer.Option("--wait", help="Wait up to N seconds for the flow to end, showing progress.")] = 0.0,
    as_json: JsonFlag = False,
) -> None:
    """Start a flow of KIND with the JSON input; print its id, state and customer URL."""
    with operator_errors():
        data = read_json_input(json_input)
    if not isinstance(data, dict):
        fail("the input must be a JSON object")
    with runtime() as rt, operator_errors():
        when_at = parse_run_at(run_at, now=rt.engine.clock.now()) if run_at else None
        record = rt.engine.start(kind, read_input(rt.engine.registry, kind, data), key, run_at=when_at)
        view = flow_view(wait_for_customer_url(rt.engine, record, rt.settings.api.start_wait_seconds), rt.engine.registry)
        if wait > 0:
            view = _wait_with_progress(rt.engine, record.id, wait)
    if as_json:
        echo_json(view)
        return
    _print_flow(view)


@flows_app.command("ls")
def list_flows(
    state: Annotated[FlowState | None, typer.Option(help="Only flows in this state.")] = None,
    kind: Annotated[str | None, typer.Option(help="Only flows of this kind.")] = None,
    since: Annotated[str | None, typer.Option(help=f"Newer than: {SINCE_FORMS}.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: JsonFlag = False,
) -> None:
    """List flows, newest first."""
    with runtime() as rt, operator_errors():
        if kind is not None and kind not in rt.engine.registry:
            fail(f"unknown flow kind {kind!r}; known kinds: {', '.join(sorted(rt.engine.registry))}")
        start_at = parse_since(since, now=rt.engine.clock.now()) if since else None
        records = rt.engine.list(state=state, kind=kind, since=start_at, limit=limit, offset=offset)
    briefs = [flow_brief(record) for record in records]
    if as_json:
        echo_json(briefs)
        return
    table = Table(title=f"flows ({len(briefs)})")
    for column in ("id", "kind", "state", "step", "order", "updated", "result"):
        table.add_column(column)
    for brief in briefs:
        table.add_row(
            brief["id"],
            brief["kind"],
            brief["state"],
            brief["step"],
            brief["order_id"] or "",
            when(brief["updated"]),
            brief["result"] or "",
        )
    console().print(table)


@flows_app.command("show")
def show(flow_id: str, as_json: JsonFlag = False) -> None:
    """One flow with its history."""
    with runtime() as rt, operator_errors():
        view = flow_view(rt.engine.get(flow_id), rt.engine.registry)
        history = rt.engine.history(flow_id)
    if as_json:
        echo_json({**view, "history": history})
        return
    _print_flow(view, history)


@flows_app.command("signal")
def signal(
    flow_id: str,
    name: Annotated[str, typer.Argument(help="3ds_result or form_completed (notification comes only through the receiver).")],
    payload: Annotated[str | None, typer.Option(help="The payload as a JSON object, a file, or - for stdin.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Deliver a signal to a flow (resumes it if it waits for that signal)."""
    data: Any = {}
    if payload is not None:
        with operator_errors():
            data = _json_or_file(payload)
    if not isinstance(data, dict):
        fail("the payload must be a JSON object")
    with runtime() as rt, operator_errors():
        result = rt.engine.signal(flow_id, name, data, by="cli")
        view = flow_view(rt.engine.get(flow_id), rt.engine.registry)
    if result == "finished":
        fail(f"flow {flow_id} already ended ({view['state']}); the signal was not delivered")
    if as_json:
        echo_json({"result": result, "flow": view})
        return
    typer.echo(f"{flow_id}: signal {name} {result}; flow {view['state']} at {view['step']}")


@flows_app.command("cancel")
def cancel(
    flow_id: str,
    reason: Annotated[str, typer.Option(help="Why; kept in the flow's outcome.")] = "cancelled by operator",
    as_json: JsonFlag = False,
) -> None:
    """Cancel a flow now, or at the end of the step in flight."""
    with runtime() as rt, operator_errors():
        view = flow_view(rt.engine.cancel(flow_id, reason, by="cli"), rt.engine.registry)
    if as_json:
        echo_json(view)
        return
    extra = " (at the end of the step in flight)" if view.get("cancel_requested") and view["state"] != "cancelled" else ""
    typer.echo(f"{flow_id}: {view['state']}{extra}")


@flows_app.command("retry")
def retry(flow_id: str, as_json: JsonFlag = False) -> None:
    """Move a failed or needs_attention flow on."""
    with runtime() as rt, operator_errors():
        view = flow_view(rt.engine.retry(flow_id, by="cli"), rt.engine.registry)
    if as_json:
        echo_json(view)
        return
    typer.echo(f"{flow_id}: {view['state']} at {view['step']}")


@flows_app.command("kinds")
def kinds(as_json: JsonFlag = False) -> None:
    """The flow kinds durapay runs, with their steps."""
    from workflows.flows import REGISTRY

    rows: list[dict[str, Any]] = [
        {"kind": kind, "steps": [step.name for step in definition.steps], "description": definition.description}
        for kind, definition in sorted(REGISTRY.items())
    ]
    if as_json:
        echo_json(rows)
        return
    table = Table(title="flow kinds")
    for column in ("kind", "steps", "description"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["kind"], " > ".join(row["steps"]), row["description"])
    console().print(table)


def _json_or_file(text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        import json

        try:
            return json.loads(stripped)
        except ValueError as exc:
            raise ValueError(f"--payload is not JSON: {exc}") from None
    return read_json_input(text)


def register(app: typer.Typer) -> None:
    app.command("start")(start)
    app.add_typer(flows_app, name="flows")
