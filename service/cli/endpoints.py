"""``durapay endpoints``: the gateway catalogue as a table, as JSON, or as docs/gateway.md's Markdown."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from durapay.gateway import CATALOGUE
from durapay.service.cli._output import print_rows


def markdown_table() -> str:
    """docs/gateway.md's endpoint table, generated from the catalogue (tests/test_readme.py keeps that page in step)."""
    lines = [
        "| # | Method | Path | Operation (task `durapay.gateway.<operation>`) | Version | Idempotency-Key | Retry safe |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, op in enumerate(CATALOGUE, start=1):
        lines.append(
            f"| {number} | {op.method} | `{op.path}` | `{op.name}` | {op.version.value} | "
            f"{'yes' if op.idempotency_key else ''} | {'yes' if op.retry_safe else 'reconcile first'} |"
        )
    return "\n".join(lines)


def endpoints(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of objects.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the Markdown table of docs/gateway.md.")] = False,
) -> None:
    """List every operation of the gateway: method, path, version, Idempotency-Key, retry safety."""
    if as_json:
        typer.echo(json.dumps([op.describe() for op in CATALOGUE], indent=2))
        return
    if markdown:
        typer.echo(markdown_table())
        return
    rows = [
        [
            op.method,
            op.path,
            op.name,
            op.version.value,
            "yes" if op.idempotency_key else "",
            "yes" if op.retry_safe else "no",
            op.reconcile.value if op.reconcile else "",
        ]
        for op in CATALOGUE
    ]
    columns = ("method", "path", "operation", "version", "idem. key", "retry safe", "reconcile")
    print_rows(f"Gateway operations ({len(CATALOGUE)})", columns, rows, ids=frozenset({"path", "operation"}))


def register(app: typer.Typer) -> None:
    app.command("endpoints")(endpoints)
