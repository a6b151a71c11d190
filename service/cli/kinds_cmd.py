"""``durapay kinds ls|pause|resume|log``: pause and resume a flow kind for a maintenance window.

While a kind is paused none of its flows runs a step: they wait where they are and go on at the resume
(``workflows.pauses``; docs/operations.md, Pausing a flow kind). Like the other flow commands these talk
to Redis directly through the engine; ``by`` is recorded as ``cli:<name>`` (``--by``, default the login
name).
"""

from __future__ import annotations

import getpass
from typing import Annotated, Any

import typer

from durapay.service.cli import completion
from durapay.service.cli._common import BadOption, Output, runtime
from durapay.service.cli._output import echo_json, print_rows, when

# The engine's parts are imported inside the commands: importing this module is what completing
# ``durapay kinds ...`` in the shell costs (service/cli/completion.py).

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")]
ByOption = Annotated[str | None, typer.Option("--by", help="Who asks (recorded as cli:<name>; default: the login name).")]

kinds_app = typer.Typer(help="Pause and resume flow kinds (maintenance windows).", no_args_is_help=True)


def _who(name: str | None) -> str:
    from durapay.service.api_kinds import who

    try:
        return who("cli", name or getpass.getuser())
    except OSError:  # no login name (a container without a user entry)
        return who("cli", name)


def _print_kinds(views: list[dict[str, Any]]) -> None:
    rows = [
        [
            view["kind"],
            "paused" if view["paused"] else "running",
            (view["pause"] or {}).get("by", ""),
            when((view["pause"] or {}).get("at")),
            (view["pause"] or {}).get("reason", ""),
            str(view["held"]) if view["paused"] else "",
        ]
        for view in views
    ]
    print_rows("flow kinds", ("kind", "state", "by", "since", "reason", "held"), rows, ids=frozenset({"kind"}))


@kinds_app.command("ls")
def list_kinds(as_json: JsonFlag = False) -> None:
    """Every flow kind: running or paused (by whom, since when, why, flows held)."""
    from durapay.service.api_kinds import kind_views

    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        views = kind_views(rt.engine)
    if as_json:
        echo_json(views)
    else:
        _print_kinds(views)


@kinds_app.command("pause")
def pause(
    kind: Annotated[str, typer.Argument(help="The flow kind (durapay kinds ls).", autocompletion=completion.kinds)],
    reason: Annotated[str, typer.Option("--reason", help="Why (in the audit list and each held flow's history).")],
    by: ByOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Pause a flow kind: none of its flows runs a step until it is resumed; nothing ends, signals are
    still recorded, its schedules fire nothing (their missed policy applies at the resume)."""
    from durapay.service.api_kinds import kind_views
    from durapay.workflows.pauses import UnknownKind

    out = Output(as_json)
    if not reason.strip() or len(reason) > 500:
        out.fail("invalid_input", "give a reason of 1 to 500 characters", field="--reason")
    with runtime(out, writes=True) as rt, out.errors():
        try:
            rt.engine.pauses.pause(kind, reason.strip(), by=_who(by))
        except UnknownKind as exc:
            raise BadOption("KIND", str(exc)) from None
        view = kind_views(rt.engine, kind)[0]
    if as_json:
        echo_json(view)
    else:
        pause_of = view["pause"]
        typer.echo(f"paused {kind} (by {pause_of['by']} at {when(pause_of['at'])}: {pause_of['reason']})")


@kinds_app.command("resume")
def resume(
    kind: Annotated[str, typer.Argument(help="The paused flow kind.", autocompletion=completion.kinds)],
    by: ByOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Resume a paused flow kind: the flows it held go on at once."""
    from durapay.service.api_kinds import kind_views
    from durapay.workflows.pauses import NotPaused, UnknownKind

    out = Output(as_json)
    with runtime(out, writes=True) as rt, out.errors():
        try:
            released = rt.engine.pauses.resume(kind, by=_who(by))
        except UnknownKind as exc:
            raise BadOption("KIND", str(exc)) from None
        except NotPaused as exc:
            out.fail("conflict", str(exc), code=1)
        view = {**kind_views(rt.engine, kind)[0], "released": released}
    if as_json:
        echo_json(view)
    else:
        typer.echo(f"resumed {kind}: {released} flow(s) released")


@kinds_app.command("log")
def log(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many entries (newest first).")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """The audit list of pauses and resumes: who, when, why."""
    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        entries = rt.engine.pauses.log(limit)
    if as_json:
        echo_json(entries)
        return
    rows = [
        [
            when(entry.get("at")),
            entry["action"],
            entry["kind"],
            entry.get("by", ""),
            entry.get("reason", ""),
            str(entry.get("released", "")),
        ]
        for entry in entries
    ]
    print_rows("pauses", ("time", "action", "kind", "by", "reason", "released"), rows, ids=frozenset())


def register(app: typer.Typer) -> None:
    app.add_typer(kinds_app, name="kinds")
