"""What the demo shows: one line per finished flow while it runs, then a table and where to look next.

A :class:`Row` is one flow (or the schedule itself): what it demonstrates, its kind, the steps it went
through, how it ended and how that compares with what was expected, and how long it took. The demo's
exit code is 0 only when every row is as expected.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table


@dataclass
class Row:
    name: str
    kind: str
    flow_id: str
    steps: list[str]
    state: str
    expected: str
    seconds: float
    note: str = ""
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.state == self.expected and not self.problem


def print_row(console: Console, row: Row) -> None:
    mark = "[green]ok[/green]" if row.ok else "[red]UNEXPECTED[/red]"
    detail = row.problem or row.note
    console.print(
        f"  {mark} {row.name:<44} {row.kind:<19} {row.state:<10} {row.seconds:6.2f}s  {' > '.join(row.steps)}"
        + (f"  [dim]{detail}[/dim]" if detail else ""),
        highlight=False,
    )


def summary_table(rows: list[Row]) -> Table:
    table = Table(title=f"durapay demo: {sum(r.ok for r in rows)}/{len(rows)} flows ended as expected")
    for column in ("#", "flow", "kind", "id", "steps", "outcome", "time"):
        table.add_column(column, overflow="fold")
    for number, row in enumerate(rows, start=1):
        outcome = row.state if row.ok else f"[red]{row.state} (expected {row.expected}) {row.problem}[/red]"
        table.add_row(str(number), row.name, row.kind, row.flow_id, " > ".join(row.steps), outcome, f"{row.seconds:.2f}s")
    return table


@dataclass
class Places:
    """Where the running parts are, for the closing notes."""

    api_url: str
    api_key: str
    simulator_url: str
    redis_url: str
    data_dir: str
    log_dir: str
    #: How to run ``durapay`` from this shell: ``durapay`` on the PATH, else the path it was run by.
    cli: str = "durapay"


def cli_command() -> str:
    """``durapay`` when the shell finds this one on its PATH, else the path this process was run by
    (``.venv/bin/durapay`` while the virtualenv is not activated)."""
    ran = Path(sys.argv[0])
    found = shutil.which("durapay")
    if ran.name != "durapay" or (found is not None and Path(found).resolve() == ran.resolve()):
        return "durapay"
    return str(ran)


def next_steps(places: Places, *, keep: bool) -> str:
    """While the parts run (``--keep``): their URLs and the key. After: where the demo's flows are kept.

    The demo's store is its own (``demo.stack``): the commands name its folder, since the data folder's
    own store does not hold the demo's flows."""
    cli = places.cli
    look = f"DURAPAY_DATA_DIR={places.data_dir} {cli}"
    if not keep:
        return "\n".join(
            [
                "Where to look next:",
                "  The demo's flows are in its own store, apart from your data; to look at them:",
                f"              {look} flows ls",
                f"              {look} flows show <id>",
                f"  Data        {places.data_dir} (Valkey with AOF; worker logs in {places.log_dir})",
                f"  Explore the running system (the web console, API docs, /metrics, the simulator): {cli} demo --keep",
                f"  Run it all for your own flows (console, API, worker, scheduler, simulator): {cli} dev",
            ]
        )
    env = f"DURAPAY_REDIS_URL={places.redis_url}"
    return "\n".join(
        [
            "Where to look next:",
            f"  Console     {places.api_url}/console  (sign in with the key {places.api_key})",
            f"  API docs    {places.api_url}/docs  (X-Api-Key: {places.api_key})",
            f"  Flows       curl -H 'X-Api-Key: {places.api_key}' {places.api_url}/flows",
            f"  Metrics     curl -H 'X-Api-Key: {places.api_key}' {places.api_url}/metrics",
            f"  Simulator   {places.simulator_url}/_sim/operations  (what the gateway saw)",
            f"  CLI         {look} flows ls   (or {env} {cli} flows ls)",
            f"              {look} flows show <id>",
            f"              {look} schedules ls",
            f"  Data        {places.data_dir} (the demo's own Valkey with AOF; worker logs in {places.log_dir})",
            "Everything keeps running (--keep); press Ctrl-C to stop.",
        ]
    )
