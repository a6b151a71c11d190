"""``durapay start`` and ``durapay flows ls|show|signal|cancel|retry|kinds``: flows from the terminal.

These talk to Redis directly through the engine (the same calls the HTTP API makes), so an operator on
a machine with the settings needs no API key. What they show is masked like the API's answers.

``start --wait`` follows the flow to its end and exits with its outcome (0 succeeded, 1 failed or
cancelled, 3 needs_attention, 4 still going when the wait ran out); the customer's URL (hosted page,
link, form) is printed on stderr as soon as the flow has one, so that someone can pay while it waits.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from durapay.service.cli import completion
from durapay.service.cli._common import BadOption, ExitCode, Output, exit_code_for, one_of, read_json_input, runtime
from durapay.service.cli._output import console, describe_error, echo_json, print_record, print_rows, when
from durapay.service.timeparse import RUN_AT_FORMS, SINCE_FORMS, parse_run_at, parse_since
from durapay.workflows.engine import STOPPED, FlowState

if TYPE_CHECKING:
    from durapay.workflows.engine import Engine

# The engine's views and the API's helpers are imported inside the commands: importing this module is
# what completing ``durapay flows ...`` in the shell costs (service/cli/completion.py).

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")]

flows_app = typer.Typer(help="List, inspect and steer flows.", no_args_is_help=True)


def _flow_fields(view: dict[str, Any], money: str = "") -> list[tuple[str, str]]:
    from durapay.service.views import operation_time

    fields = [("id", view["id"])]
    for name in ("kind", "state", "step", "order_id", "customer_url", "attempt", "tenant"):
        if view.get(name) not in (None, ""):
            fields.append((name, str(view[name])))
    if view.get("terminal") not in (None, "", "default"):  # one terminal: shown as before
        fields.append(("terminal", str(view["terminal"])))
    definition = view.get("definition") or {}
    if definition.get("version"):
        fields.append(("definition", f"{definition['kind']} {definition['version']}"))
    fields += [
        ("created", when(view.get("created"))),
        ("updated", when(view.get("updated"))),
        ("steps done", ", ".join(view.get("steps_done") or []) or "-"),
        ("actions", ", ".join(view.get("actions") or []) or "-"),
    ]
    if view.get("outcome"):
        outcome = view["outcome"]
        fields.append(("result", str(outcome.get("result", ""))))
        if outcome.get("reason"):
            fields.append(("reason", str(outcome["reason"])))
        operation = outcome.get("operation") if isinstance(outcome.get("operation"), dict) else None
        if operation and operation.get("operationId"):  # what a refund or a capture names
            made = when(operation_time(outcome, view.get("outputs")))
            made = f" at {made}" if made else ""
            fields.append(("operation", f"{operation['operationId']} {operation.get('operationType') or ''}".strip() + made))
    if money:
        fields.append(("amount", money))
    if view.get("error"):
        fields.append(("error", describe_error(view["error"])))
    for mark in view.get("attention") or []:  # a reconciliation's mark: for a person, the state is as it was
        fields.append(("attention", f"{mark.get('category')}: {mark.get('what')} (report {mark.get('report')})"))
    return fields


def _print_flow(view: dict[str, Any], history: list[dict[str, Any]] | None = None) -> None:
    from durapay.service.views import money_text

    print_record(f"flow {view['id']}", _flow_fields(view, money_text(view.get("outcome"), view.get("input"))))
    if history:
        rows = [
            [
                when(entry.get("t")),
                entry.get("from") or "",
                entry.get("to") or "",
                entry.get("step") or "",
                entry.get("by") or "",
                entry.get("what") or "",
            ]
            for entry in history
        ]
        print_rows("history", ("time", "from", "to", "step", "by", "what"), rows, ids=frozenset(), piped_prefix="history")


def _announce_customer_url(out: Output, view: dict[str, Any]) -> None:
    """The customer's URL on stderr, at once: the flow waits for that customer."""
    if out.json:
        line = {"id": view["id"], "state": view["state"], "customer_url": view["customer_url"]}
        print(json.dumps(line), file=sys.stderr, flush=True)
    else:
        print(f"flow {view['id']}: customer URL {view['customer_url']}", file=sys.stderr, flush=True)


def _wait_for_end(out: Output, engine: Engine, flow_id: str, seconds: float, announced: bool) -> dict[str, Any]:
    """Follow the flow until it stops (showing its state on a terminal); None when the wait runs out."""
    from durapay.service.views import flow_view

    deadline = time.monotonic() + seconds
    with Console(stderr=True).status(f"flow {flow_id}: starting") as status:
        while True:
            record = engine.get(flow_id)
            status.update(f"flow {flow_id}: {record.state.value} at {record.step}")
            if record.customer_url and not announced:
                _announce_customer_url(out, flow_view(record, engine.registry))
                announced = True
            if record.state in STOPPED or time.monotonic() >= deadline:
                return flow_view(record, engine.registry)
            time.sleep(0.1)


def start(
    kind: Annotated[str, typer.Argument(help="Flow kind (durapay flows kinds).", autocompletion=completion.kinds)],
    json_input: Annotated[str, typer.Option("--json-input", help="JSON input: a file, or - for stdin.")] = "-",
    key: Annotated[str | None, typer.Option("--key", help="Start key: the same key and input give the same flow.")] = None,
    run_at: Annotated[str | None, typer.Option("--run-at", help=f"Run later: {RUN_AT_FORMS}.")] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="The merchant's tenant on a platform (its fairness key, with the terminal).")
    ] = None,
    wait: Annotated[float, typer.Option("--wait", help="Wait up to N seconds for the flow to end; exit with its outcome.")] = 0.0,
    terminal: Annotated[
        str | None, typer.Option("--terminal", help="The gateway terminal its calls use (DURAPAY_TERMINALS; none: default).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Start a flow of KIND with the JSON input; print its id, state and customer URL.

    With --wait, exit 0 if the flow succeeded, 1 if it failed or was cancelled, 3 if it needs
    attention, 4 if it was still going when the wait ran out.
    """
    from durapay.service.api_flows import wait_for_customer_url
    from durapay.service.views import flow_view

    out = Output(as_json)
    with out.errors():
        data = read_json_input(json_input, option="--json-input", expected=f"the {kind} flow's input as a JSON object")
    if not isinstance(data, dict):
        out.fail("invalid_input", "the input must be a JSON object", field="--json-input")
    with runtime(out, writes=True) as rt, out.errors():
        try:
            when_at = parse_run_at(run_at, now=rt.engine.clock.now()) if run_at else None
        except ValueError as exc:
            raise BadOption("--run-at", str(exc)) from None
        one_of(kind, rt.engine.registry, "kind", "flow kind")
        record = rt.engine.start(
            kind, data, key, run_at=when_at, run_at_asked=run_at or "", terminal=terminal, tenant=tenant
        )  # read strictly
        view = flow_view(wait_for_customer_url(rt.engine, record, rt.settings.api.start_wait_seconds), rt.engine.registry)
        if wait > 0:
            if view.get("customer_url"):
                _announce_customer_url(out, view)
            view = _wait_for_end(out, rt.engine, record.id, wait, announced=bool(view.get("customer_url")))
    if as_json:
        echo_json(view)
    else:
        _print_flow(view)
    if wait <= 0:
        return
    state = FlowState(view["state"])
    if state not in STOPPED:
        out.fail(
            "timed_out",
            f"flow {view['id']} still {state.value} at step {view['step']} after {wait:g}s; it goes on",
            code=ExitCode.TIMED_OUT,
        )
    raise typer.Exit(exit_code_for(state))


@flows_app.command("ls")
def list_flows(
    state: Annotated[
        str | None,
        typer.Option(
            help=f"Only flows in this state: {', '.join(s.value for s in FlowState)}.", autocompletion=completion.states
        ),
    ] = None,
    kind: Annotated[
        str | None, typer.Option(help="Only flows of this kind (durapay flows kinds).", autocompletion=completion.kinds)
    ] = None,
    since: Annotated[str | None, typer.Option(help=f"Created since: {SINCE_FORMS}.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    after: Annotated[str | None, typer.Option("--after", help="A cursor (a page's next): the flows after it.")] = None,
    terminal: Annotated[str | None, typer.Option(help="Only flows of this gateway terminal (DURAPAY_TERMINALS).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List flows, newest first, a page at a time; prints the cursor of the next page (piped: one
    tab-separated line per flow, no header, and the cursor on stderr)."""
    from durapay.service.views import flow_brief, money_text
    from durapay.workflows.listing import BadCursor

    out = Output(as_json)
    with out.errors():
        wanted = FlowState(one_of(state, [s.value for s in FlowState], "--state", "state")) if state is not None else None
    with runtime(out) as rt, out.errors():
        if kind is not None:
            one_of(kind, rt.engine.registry, "--kind", "flow kind")
        if terminal is not None:
            one_of(terminal, rt.engine.terminals.names, "--terminal", "terminal")
        try:
            start_at = parse_since(since, now=rt.engine.clock.now()) if since else None
        except ValueError as exc:
            raise BadOption("--since", str(exc)) from None
        try:
            page = rt.engine.list(state=wanted, kind=kind, since=start_at, limit=limit, after=after, terminal=terminal)
        except BadCursor as exc:
            raise BadOption("--after", str(exc)) from None
    briefs = [flow_brief(record) for record in page]
    amounts = [money_text(record.outcome, record.input) for record in page]
    if as_json:
        echo_json({"flows": briefs, "limit": limit, "next": page.next})  # the shape of GET /flows
        return
    rows = [
        [
            brief["id"],
            brief["kind"],
            brief["state"],
            brief["step"],
            amount,
            brief["order_id"] or "",
            when(brief["updated"]),
        ]
        for brief, amount in zip(briefs, amounts, strict=True)
    ]
    columns = ("id", "kind", "state", "step", "amount", "order", "updated")
    print_rows(
        f"flows ({len(briefs)}); next: {page.next or '-'}",
        columns,
        rows,
        ids=frozenset({"id", "state", "order"}),
        cut=("kind", "step"),  # the money column is never cut; on 80 columns the time goes, not the amount
        drop=("updated",),
    )
    if page.next and not console().is_terminal:  # piped: stdout stays one line per flow
        typer.echo(f"next: {page.next}", err=True)


@flows_app.command("show")
def show(flow_id: completion.FlowId, as_json: JsonFlag = False) -> None:
    """One flow with its history."""
    from durapay.service.views import flow_view

    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        record = rt.engine.get(flow_id)
        view = flow_view(record, rt.engine.registry, rt.engine.store.marks(flow_id), refunding=rt.engine.refund_under_way(record))
        history = rt.engine.history(flow_id)
    if as_json:
        echo_json({**view, "history": history})
        return
    _print_flow(view, history)


@flows_app.command("signal")
def signal(
    flow_id: completion.FlowId,
    name: Annotated[str, typer.Argument(help="3ds_result or form_completed (notification comes only through the receiver).")],
    payload: Annotated[str | None, typer.Option(help="The payload as a JSON object, a file, or - for stdin.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Deliver a signal to a flow (resumes it if it waits for that signal)."""
    from durapay.service.views import flow_view

    out = Output(as_json)
    data: Any = {}
    if payload is not None:
        with out.errors():
            data = _json_or_file(payload)
    if not isinstance(data, dict):
        out.fail("invalid_input", "the payload must be a JSON object", field="--payload")
    with runtime(out, writes=True) as rt, out.errors():
        result = rt.engine.signal(flow_id, name, data, by="cli")
        view = flow_view(rt.engine.get(flow_id), rt.engine.registry)
    if result == "finished":
        out.fail("conflict", f"flow {flow_id} already ended ({view['state']}); the signal was not delivered")
    if as_json:
        echo_json({"result": result, "flow": view})
        return
    typer.echo(f"{flow_id}: signal {name} {result}; flow {view['state']} at {view['step']}")


@flows_app.command("cancel")
def cancel(
    flow_id: completion.FlowId,
    reason: Annotated[str, typer.Option(help="Why; kept in the flow's outcome.")] = "cancelled by operator",
    as_json: JsonFlag = False,
) -> None:
    """Cancel a flow now, at the end of the step in flight, or, while money may be in flight at the
    gateway, once a read of the gateway shows none moved (the flow then ends cancelled; succeeded if
    the money moved; needs_attention if the gateway cannot tell)."""
    from durapay.service.views import flow_view

    out = Output(as_json)
    with runtime(out, writes=True) as rt, out.errors():
        view = flow_view(rt.engine.cancel(flow_id, reason, by="cli"), rt.engine.registry)
    if as_json:
        echo_json(view)
        return
    extra = ""
    if view.get("cancel_requested") and view["state"] != "cancelled":
        inflight = view.get("unsettled") or {}
        extra = (
            f" (cancel requested: money may be in flight ({inflight.get('op')}); the gateway is read first)"
            if inflight
            else " (cancel requested: at the end of the step in flight)"
        )
    typer.echo(f"{flow_id}: {view['state']}{extra}")


@flows_app.command("retry")
def retry(flow_id: completion.FlowId, as_json: JsonFlag = False) -> None:
    """Move a failed or needs_attention flow on."""
    from durapay.service.views import flow_view

    out = Output(as_json)
    with runtime(out, writes=True) as rt, out.errors():
        view = flow_view(rt.engine.retry(flow_id, by="cli"), rt.engine.registry)
    if as_json:
        echo_json(view)
        return
    typer.echo(f"{flow_id}: {view['state']} at {view['step']}")


@flows_app.command("kinds")
def kinds(
    kind: Annotated[
        str | None, typer.Argument(help="One kind: its steps (and with --example, an input).", autocompletion=completion.kinds)
    ] = None,
    example: Annotated[
        bool, typer.Option("--example", help="Print a valid input of KIND as JSON, to start as is: | durapay start KIND.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """The flow kinds durapay runs, with their steps; with KIND --example, an input that starts as is
    against durapay dev (what to replace, for a kind acting on an earlier payment or contract, on stderr)."""
    from durapay.workflows.engine import registry
    from durapay.workflows.flows.examples import example as example_of

    out = Output(as_json)
    with out.errors():
        REGISTRY = registry(out.settings().flows.names)
    if kind is not None:
        with out.errors():
            one_of(kind, REGISTRY, "kind", "flow kind")
    elif example:
        out.fail("usage", "give the KIND whose example to print: durapay flows kinds hpp --example", field="--example")
    if example and kind is not None:
        made = example_of(kind)
        echo_json(made.data)  # the input alone, with --json or without: it is what start reads
        if made.needs:
            typer.echo(f"to act on your own object, replace {made.needs}", err=True)
        return
    rows: list[dict[str, Any]] = [
        {"kind": name, "steps": [step.name for step in definition.steps], "description": definition.description}
        for name, definition in sorted(REGISTRY.items())
        if kind is None or name == kind
    ]
    if as_json:
        echo_json(rows)
        return
    table = [[row["kind"], " > ".join(row["steps"]), row["description"]] for row in rows]
    print_rows("flow kinds", ("kind", "steps", "description"), table, ids=frozenset({"kind"}))


def _json_or_file(text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            return json.loads(stripped)
        except ValueError as exc:
            raise BadOption("--payload", f"not JSON: {exc}") from None
    return read_json_input(text, option="--payload", expected="the signal's payload as a JSON object")


@flows_app.command("manifest")
def manifest(as_json: JsonFlag = False) -> None:
    """The definitions this code runs: per kind its versions (current first) and their steps, as JSON
    (the manifest ``durapay deploy check --manifest`` reads)."""
    from durapay.workflows.deploys import manifest as manifest_of
    from durapay.workflows.engine import registry

    out = Output(as_json)
    with out.errors():
        kinds = registry(out.settings().flows.names)
    echo_json(manifest_of(kinds))  # JSON with --json or without: it is what deploy check reads


@flows_app.command("versions")
def versions(as_json: JsonFlag = False) -> None:
    """Per kind and version: the flows counted (not finished, or failed or cancelled and still kept: a retry
    or a late payment can bring them back), the oldest, the latest deadline, "drained" at zero (a previous
    version may be dropped from the code once drained)."""
    from durapay.service.cli.deploy_cmd import versions_rows
    from durapay.workflows.deploys import versions_report
    from durapay.workflows.schedules import Schedules

    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        report = versions_report(rt.engine, schedules=Schedules(rt.engine))
    if as_json:
        echo_json({"versions": report})
        return
    columns = ("kind", "version", "flows counted", "oldest", "latest deadline")
    print_rows("versions", columns, versions_rows(report), ids=frozenset({"version"}))


def register(app: typer.Typer) -> None:
    app.command("start")(start)
    app.add_typer(flows_app, name="flows")
