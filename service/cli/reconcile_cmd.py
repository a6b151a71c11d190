"""``durapay reconcile``: every operation of a window at the gateway against the flows (docs/operations.md,
Reconciliation).

Exit status 0 when nothing is wrong (every operation accounted for, the whole window read), 1 when
something is (a mismatch, a part of the window not read), 2 for a usage or configuration error. The
report is kept (``DURAPAY_RECONCILE__RETENTION_DAYS``); ``--latest`` prints the newest kept one without
calling the gateway.
"""

from __future__ import annotations

from typing import Annotated

import typer

from durapay.service.cli._common import BadOption, Output, one_of, runtime
from durapay.service.cli._output import echo_json, when
from durapay.service.timeparse import SINCE_FORMS, parse_since
from durapay.workflows.reconciliation import CATEGORIES, IN_FLIGHT, Reconciler, Report, exit_status
from durapay.workflows.reconciliation.findings import TITLES


def text_lines(report: Report) -> list[str]:
    """The report for a person: a summary line, then each category with its findings."""
    verdict = "nothing wrong" if report.ok else f"{len(report.mismatches)} mismatch(es)"
    if report.interrupted:
        verdict = "interrupted"
    elif report.running:
        verdict = "running"
    lines = [
        f"reconciliation {report.id}: {when(report.since)} to {when(report.until)}: {report.operations} operations, "
        f"{report.flows} flows, {report.calls} gateway calls: {verdict}"
    ]
    if report.interrupted:
        lines.append(f"interrupted: {report.interrupted}")
    if report.error:
        lines.append(f"not read: {report.error}")
    lines += [f"not read: {gap}" for gap in report.gaps]
    for category in CATEGORIES:
        found = [finding for finding in report.findings if finding.category == category]
        if not found and category == IN_FLIGHT:
            continue
        lines.append(f"{TITLES[category]}: {len(found)}")
        lines += [f"  {finding.what}" for finding in found]
    return lines


def reconcile(
    since: Annotated[str, typer.Option(help=f"Start of the window: {SINCE_FORMS}.")] = "24h",
    until: Annotated[str | None, typer.Option(help=f"End of the window (default: now): {SINCE_FORMS}.")] = None,
    latest: Annotated[bool, typer.Option("--latest", help="Print the newest kept report; call nothing.")] = False,
    terminal: Annotated[
        str, typer.Option("--terminal", help="The gateway terminal to read (DURAPAY_TERMINALS; each is its own run).")
    ] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON (errors too, on stderr).")] = False,
) -> None:
    """Read every operation of the window from the gateway and match each to its flow: money without a
    flow, a flow without its money, money the flow does not show, and what is still in flight.

    Exit status 0 when nothing is wrong, 1 when something is.
    """
    out = Output(as_json)
    with runtime(out, writes=True) as rt, out.errors():
        one_of(terminal, rt.engine.terminals.names, "--terminal", "terminal")
        reconciler = Reconciler(rt.engine, terminal=terminal)
        if latest:
            found = reconciler.reports.latest()
            if found is None:
                out.fail("not_found", "no reconciliation report is kept (run durapay reconcile)")
            report = found
        else:
            now = rt.engine.clock.now()
            try:
                start = parse_since(since, now=now)
            except ValueError as exc:
                raise BadOption("--since", str(exc)) from None
            try:
                end = parse_since(until, now=now) if until else None
            except ValueError as exc:
                raise BadOption("--until", str(exc)) from None
            try:
                report = reconciler.run(start, end)
            except ValueError as exc:
                raise BadOption("--until" if until else "--since", str(exc)) from None
    if as_json:
        echo_json(report.wire())
    else:
        typer.echo("\n".join(text_lines(report)))
    raise typer.Exit(exit_status(report))


def register(app: typer.Typer) -> None:
    app.command("reconcile")(reconcile)
