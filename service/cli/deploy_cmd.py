"""``durapay deploy check``: before shipping a build, every flow in flight against the build's definitions.

Run from anywhere that reaches the store (a deploy pipeline, with the new build's manifest:
``durapay flows manifest --json > manifest.json`` in the new build, then ``durapay deploy check
--manifest manifest.json`` against production's store). Per kind and version: how many flows (every
flow not finished, and failed and cancelled ones while kept: ``workflows.deploys.COUNTED``), in which
states, at which steps, whether the build can continue them, the latest business deadline among them;
exit 1 naming every flow and schedule the build would leave with no code to run it (docs/deploys.md,
The pipeline check).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from durapay.service.cli._common import ExitCode, Output, runtime
from durapay.service.cli._output import echo_json, print_rows, when

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")]
deploy_app = typer.Typer(help="Check a deploy against the flows in flight.", no_args_is_help=True)


def _manifest_of(out: Output, path: Path | None, registry: Any) -> dict[str, Any]:
    from durapay.workflows.deploys import manifest

    if path is None:
        return manifest(registry)
    try:
        given = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        out.fail(
            "invalid_input", f"{path}: not a manifest ({exc}): make it with durapay flows manifest --json", field="--manifest"
        )
    kinds = given.get("kinds") if isinstance(given, dict) else None
    if not isinstance(kinds, dict) or not all(isinstance(entries, list) for entries in kinds.values()):
        out.fail(
            "invalid_input",
            f"{path}: no kinds object of versions: make it with durapay flows manifest --json",
            field="--manifest",
        )
    return {"kinds": kinds}


@deploy_app.command("check")
def check(
    manifest_file: Annotated[
        Path | None,
        typer.Option(
            "--manifest", help="The manifest of the build about to ship (durapay flows manifest --json); default: this code."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Can the build (its manifest, or the code installed here) continue every flow in flight and every
    schedule? Exit 1 naming the flows it would leave with no code to run them."""
    from durapay.workflows import deploys
    from durapay.workflows.schedules import Schedules

    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        kinds = _manifest_of(out, manifest_file, rt.engine.registry)["kinds"]
        groups = deploys.check(deploys.in_flight(rt.engine, schedules=Schedules(rt.engine)), kinds)
    stranded = deploys.stranded(groups)
    report = {
        "ok": not stranded,
        "counted": deploys.COUNTED_TEXT,
        "groups": [group.shown() for group in groups],
        "stranded": stranded,
    }
    if as_json:
        echo_json(report)
    else:
        rows = [
            [
                group.kind,
                group.version or "-",
                str(group.count) + (f" + {group.schedules} schedules" if group.schedules else ""),
                ", ".join(f"{name} {n}" for name, n in sorted(group.states.items())) or "-",
                ", ".join(f"{name} {n}" for name, n in sorted(group.steps.items())) or "-",
                "yes" if group.runnable else f"NO: {group.reason}",
                when(group.latest_deadline) if group.latest_deadline else "-",
            ]
            for group in groups
        ]
        print_rows(
            "in flight",
            ("kind", "version", "flows", "states", "steps", "can continue", "latest deadline"),
            rows,
            ids=frozenset({"version"}),
        )
        typer.echo(f"counted: {deploys.COUNTED_TEXT}", err=True)
        schedules = [schedule_id for group in groups if not group.runnable for schedule_id in group.schedule_ids]
        named = set(schedules)
        flows = [flow_id for flow_id in stranded if flow_id not in named]
        if flows:
            typer.echo(f"{len(flows)} flows would be left with no code to run them: {' '.join(flows)}", err=True)
        if schedules:
            typer.echo(
                f"{len(schedules)} schedules would be left with no code for their charges: {' '.join(schedules)}", err=True
            )
        if not stranded:
            typer.echo("ok: the build can continue every flow counted and every schedule", err=True)
    if stranded:
        raise typer.Exit(ExitCode.FAILED)


def versions_rows(report: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            row["kind"],
            str(row["version"] or "-") + (" (current)" if row["current"] else "") + ("" if row["held"] else " (not held)"),
            "drained" if row["drained"] else str(row["count"]) + (f" + {row['schedules']} schedules" if row["schedules"] else ""),
            when(row["oldest"]) if row["oldest"] else "-",
            when(row["latest_deadline"]) if row["latest_deadline"] else "-",
        ]
        for row in report
    ]


def register(app: typer.Typer) -> None:
    app.add_typer(deploy_app, name="deploy")
