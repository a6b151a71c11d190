"""``durapay bulk retry|cancel|ls|show``: retry or cancel every flow a filter matches.

``--dry-run`` prints what the action would do (how many flows match, how many it would skip and why,
the money at stake by currency, a sample with each flow's amount) and changes no flow; the dry run is
kept for its confirmation. Without it the dry run is shown and the action asked for confirmation
(``--yes`` skips the question): it is then recorded and acted on in the background by the workers
(``workflows.bulk``, at ``DURAPAY_BULK__RATE`` flows a second), on the flows the dry run listed only,
each as it was shown (one changed since is skipped); ``--wait`` follows its progress to the end. The
action carries its dry run's token (``plan``): each command is a new dry run, so a new action on the
flows the filter matches now; ``--plan`` confirms the dry run printed before, with the same filter
(shown again as it was; another action or filter is refused: exit 1), and the same token again is the
same action (its progress is shown, nothing is done twice), as is the same ``--key``. Each flow's
history names the action (``bulk:<id> cli:<name>``).
"""

from __future__ import annotations

import getpass
import re
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from durapay.service.cli import completion
from durapay.service.cli._common import BadOption, ExitCode, Output, one_of, runtime
from durapay.service.cli._output import echo_json, print_rows, when
from durapay.service.timeparse import SINCE_FORMS, parse_since
from durapay.workflows.engine import FlowState

if TYPE_CHECKING:
    from durapay.service.runtime import Runtime
    from durapay.workflows.bulk import Action, BulkActions, BulkFilter, Plan

# The engine's parts are imported inside the commands: importing this module is what completing
# ``durapay bulk ...`` in the shell costs (service/cli/completion.py).

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")]
#: How long ``--wait`` follows an action at most, and how often it reads its progress.
WAIT_LIMIT = 3600.0
POLL = 0.5

bulk_app = typer.Typer(help="Retry or cancel every flow a filter matches (a dry run first).", no_args_is_help=True)


def _bulk(rt: Runtime) -> BulkActions:
    from durapay.workflows.bulk import BulkActions

    return rt.bulk or BulkActions(rt.engine, rt.settings.bulk)


def _filter(
    engine: Any,
    kind: str | None,
    state: str | None,
    since: str | None,
    until: str | None,
    error: str | None,
    terminal: str | None = None,
) -> BulkFilter:
    if kind is not None:
        one_of(kind, engine.registry, "--kind", "flow kind")
    if terminal is not None:
        one_of(terminal, engine.terminals.names, "--terminal", "terminal")
    chosen = FlowState(one_of(state, [s.value for s in FlowState], "--state", "state")) if state is not None else None
    now = engine.clock.now()
    times: dict[str, float | None] = {}
    for name, text in (("since", since), ("until", until)):
        try:
            times[name] = parse_since(text, now=now) if text is not None else None
        except ValueError as exc:
            raise BadOption(f"--{name}", str(exc)) from None
    from durapay.workflows.bulk import BulkFilter

    return BulkFilter(kind, chosen, error, times["since"], times["until"], terminal)


def _print_plan(plan: Plan) -> None:
    from durapay.gateway import format_money

    view = plan.view()
    typer.echo(
        f"{plan.action}: {view['count']} flow(s) match; {view['would_skip']} would be skipped "
        f"(plan {plan.token}, kept until {when(view['kept_until'])})"
    )
    money = ", ".join(format_money(minor, currency) for currency, minor in view["totals"].items()) or "none named"
    typer.echo(f"  at stake (the {view['count'] - view['would_skip']} flow(s) it would act on): {money}")
    for reason, count in sorted(view["skips"].items(), key=lambda item: -item[1]):
        typer.echo(f"  skipped {count}: {reason}")
    rows = [
        [flow["id"], flow["kind"], flow["state"], format_money(flow["amount"], flow["currency"]), when(flow["created"])]
        for flow in view["sample"]
    ]
    if rows:
        print_rows("sample", ("id", "kind", "state", "amount", "created"), rows, ids=frozenset({"id", "amount"}))


def _progress(record: dict[str, Any]) -> str:
    handled = record["done"] + record["skipped"]
    changed = f", {record['changed']} of them changed since the dry run" if record.get("changed") else ""
    return (
        f"bulk {record['id']} ({record['action']}): {record['status']}, {handled}/{record['total']} "
        f"({record['done']} done, {record['skipped']} skipped{changed})"
    )


def _act(
    action: Action,
    kind: str | None,
    state: str | None,
    error: str | None,
    since: str | None,
    until: str | None,
    terminal: str | None,
    *,
    dry_run: bool,
    yes: bool,
    wait: bool,
    key: str | None,
    plan_token: str | None,
    by: str | None,
    as_json: bool,
) -> None:
    from durapay.workflows.bulk import FILTERS, PlanNotKept, TooMany, Unconfirmable

    out = Output(as_json)
    with runtime(out, writes=True) as rt, out.errors():
        if plan_token is not None and not re.fullmatch(r"[0-9a-f]{32}", plan_token):
            raise BadOption("--plan", f"{plan_token!r} is not a dry run's plan token (32 hex digits, as --dry-run prints it)")
        bulk = _bulk(rt)
        wanted = _filter(rt.engine, kind, state, since, until, error, terminal)
        values = (kind, state, error, since, until, terminal)
        given = {name: value for name, value in zip(FILTERS, values, strict=True) if value is not None}
        plan: Plan | None = None
        try:  # with --plan: that dry run, shown as it was made (its times fixed then)
            plan = bulk.confirms(plan_token, action, given) if plan_token else bulk.plan(action, wanted, asked=given)
        except TooMany as exc:
            out.fail("invalid_input", str(exc), field="--since")
        except PlanNotKept:
            pass  # confirmed already (the post answers its action) or not kept (the post refuses it)
        except Unconfirmable as exc:
            out.fail("conflict", str(exc), field="--plan", code=ExitCode.FAILED)
        if dry_run:
            if plan is None:
                gone = f"the dry run {plan_token} is not kept (or confirmed already): make a new dry run"
                out.fail("conflict", gone, field="--plan", code=ExitCode.FAILED)
            echo_json(plan.view()) if as_json else _print_plan(plan)
            return
        if not yes and plan is not None:
            if as_json:
                out.fail("invalid_input", "pass --yes to act (or --dry-run to look first)", field="--yes")
            _print_plan(plan)
            typer.confirm(f"{action} {len(plan.ids)} flow(s)?", abort=True)
        token = plan_token or (plan.token if plan is not None else None)
        try:
            record = bulk.post(action, wanted, by=_who(by), given=given, key=key, plan=token)
        except TooMany as exc:
            out.fail("invalid_input", str(exc), field="--since")
        except Unconfirmable as exc:
            out.fail("conflict", str(exc), field="--key" if key else "--plan", code=ExitCode.FAILED)
        deadline = time.monotonic() + WAIT_LIMIT
        while wait and record["status"] == "running" and time.monotonic() < deadline:
            if not as_json:
                typer.echo(_progress(record), err=True)
            time.sleep(POLL)
            record = bulk.get(record["id"])
    if as_json:
        echo_json(record)
    else:
        typer.echo(_progress(record))
    if wait and record["status"] == "running":
        raise typer.Exit(ExitCode.TIMED_OUT)


def _who(name: str | None) -> str:
    try:
        return f"cli:{name or getpass.getuser()}"
    except OSError:
        return f"cli:{name}" if name else "cli"


KindOption = Annotated[str | None, typer.Option("--kind", help="Flows of this kind.", autocompletion=completion.kinds)]
StateOption = Annotated[
    str | None, typer.Option("--state", help="Flows in this state (failed, waiting...).", autocompletion=completion.states)
]
ErrorOption = Annotated[str | None, typer.Option("--error", help="Flows whose error has this type or code.")]
SinceOption = Annotated[str | None, typer.Option("--since", help=f"Created since: {SINCE_FORMS}.")]
UntilOption = Annotated[str | None, typer.Option("--until", help=f"Created until: {SINCE_FORMS}.")]
TerminalOption = Annotated[str | None, typer.Option("--terminal", help="Flows of this gateway terminal (DURAPAY_TERMINALS).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Show what would be done; change nothing.")]
Yes = Annotated[bool, typer.Option("--yes", help="Act without asking (after a dry run of your own).")]
Wait = Annotated[bool, typer.Option("--wait", help="Follow the progress to the end.")]
Key = Annotated[str | None, typer.Option("--key", help="The action's key: the same key is the same action.")]
PlanOption = Annotated[
    str | None,
    typer.Option(
        "--plan",
        help="Confirm this dry run (its printed plan token), with the same filter: it acts on the flows that dry run "
        "listed; the same token again is the same action.",
    ),
]
By = Annotated[str | None, typer.Option("--by", help="Who asks (recorded as cli:<name>; default: the login name).")]


def _action_command(action: Action, doc: str) -> None:
    """Declare ``durapay bulk <action>``: retry and cancel take the same filter and options."""

    def command(
        kind: KindOption = None,
        state: StateOption = None,
        error: ErrorOption = None,
        since: SinceOption = None,
        until: UntilOption = None,
        terminal: TerminalOption = None,
        dry_run: DryRun = False,
        yes: Yes = False,
        wait: Wait = False,
        key: Key = None,
        plan: PlanOption = None,
        by: By = None,
        as_json: JsonFlag = False,
    ) -> None:
        _act(
            action,
            kind,
            state,
            error,
            since,
            until,
            terminal,
            dry_run=dry_run,
            yes=yes,
            wait=wait,
            key=key,
            plan_token=plan,
            by=by,
            as_json=as_json,
        )

    command.__doc__ = doc
    command.__name__ = action
    bulk_app.command(action)(command)


_action_command(
    "retry",
    """Retry every matching flow (a needs_attention flow moves on, a failed one starts again), exactly as
    `durapay flows retry` would; the others are skipped with the reason.""",
)
_action_command(
    "cancel",
    """Cancel every matching flow, exactly as `durapay flows cancel` would (money in flight: asked to
    cancel, ended as the engine allows).""",
)


@bulk_app.command("ls")
def list_actions(as_json: JsonFlag = False) -> None:
    """The newest bulk actions with their progress."""
    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        records = _bulk(rt).list(rt.settings.bulk.kept)
    if as_json:
        echo_json(records)
        return
    rows = [
        [
            r["id"],
            r["action"],
            r["status"],
            f"{r['done'] + r['skipped']}/{r['total']}",
            str(r["skipped"]),
            r["by"],
            when(r["created"]),
        ]
        for r in records
    ]
    print_rows("bulk actions", ("id", "action", "status", "progress", "skipped", "by", "created"), rows, ids=frozenset({"id"}))


@bulk_app.command("show")
def show(bulk_id: Annotated[str, typer.Argument(help="The bulk action's id.")], as_json: JsonFlag = False) -> None:
    """One bulk action: its filter, progress, and the flows it skipped with the reasons."""
    from durapay.workflows.bulk import UnknownBulk

    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        try:
            record = _bulk(rt).get(bulk_id)
        except UnknownBulk:
            out.fail("not_found", f"no bulk action {bulk_id!r}", code=ExitCode.FAILED)
    if as_json:
        echo_json(record)
        return
    typer.echo(_progress(record))
    typer.echo(f"filter: {', '.join(f'{k}={v}' for k, v in record['filter'].items() if v is not None)}")
    for reason, count in record["skips"].items():
        typer.echo(f"  skipped {count}: {reason}")


def register(app: typer.Typer) -> None:
    app.add_typer(bulk_app, name="bulk")
