"""The result of a chaos run: the numbers, the findings, and how they print (a table, or JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from service.chaos.reconcile import Findings

#: Findings printed per class (the JSON has them all).
SHOWN = 10


@dataclass
class ChaosReport:
    seed: int
    duration: float
    lose_last_writes: bool
    flows: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    not_acknowledged: int = 0
    worker_kills: int = 0
    scheduler_kills: int = 0
    redis_restarts: int = 0
    cuts: list[dict[str, Any]] = field(default_factory=list)
    fault_rules: int = 0
    faults_fired: int = 0
    findings: Findings = field(default_factory=Findings)
    finished: bool = False
    recover_seconds: float | None = None
    schedule: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    folder: str = ""
    #: With --lose-last-writes: whether the server's WAITAOF waited for the fsync (None: not checked).
    waitaof_honest: bool | None = None
    #: The AOF fsync policy of the Valkey the run started (None: a configured Redis).
    appendfsync: str | None = "always"

    @property
    def ok(self) -> bool:
        return self.findings.clean and self.finished and not self.problems

    def rows(self) -> list[tuple[str, str]]:
        lost_bytes = sum(int(cut["lost_bytes"]) for cut in self.cuts)
        policy = f"AOF {self.appendfsync}, " if self.appendfsync else ""
        restarts = f"{self.redis_restarts}" + (
            f" ({policy}cut {len(self.cuts)}x, {lost_bytes} bytes lost)" if self.lose_last_writes else f" ({policy}kept)"
        )
        findings = self.findings
        recover = "-" if self.recover_seconds is None else f"{self.recover_seconds:.1f} s"
        states = ", ".join(f"{count} {state}" for state, count in sorted(findings.states.items()))
        return [
            ("flows", f"{self.flows} ({states})" if states else str(self.flows)),
            ("kinds", ", ".join(f"{count} {kind}" for kind, count in sorted(self.kinds.items())) or "-"),
            (
                "kills",
                f"{self.worker_kills + self.scheduler_kills} ({self.worker_kills} worker, {self.scheduler_kills} scheduler)",
            ),
            ("restarts", f"{restarts} Redis"),
            ("faults", f"{self.faults_fired} fired ({self.fault_rules} rules)"),
            ("lost", str(len(findings.lost))),
            ("charged twice", str(len(findings.charged_twice))),
            ("charged, not succeeded", str(len(findings.not_reflected))),
            ("succeeded, not charged", str(len(findings.unpaid))),
            ("stuck", str(len(findings.stuck))),
            ("events lost / made up", f"{len(findings.events_lost)} / {len(findings.events_made_up)}"),
            ("time to recover", f"{recover} after the last fault"),
            ("schedule", ", ".join(f"{key} {value}" for key, value in self.schedule.items()) or "-"),
            *self._server_row(),
        ]

    def _server_row(self) -> list[tuple[str, str]]:
        if self.waitaof_honest is None:
            return []
        if self.waitaof_honest:
            return [("server WAITAOF", "answers after its fsync")]
        return [("server WAITAOF", "answers BEFORE its fsync: a host crash can lose acknowledged writes")]

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["ok"] = self.ok
        body["findings"] = {**asdict(self.findings), "clean": self.findings.clean}
        return body


def print_report(console: Console, report: ChaosReport) -> None:
    title = f"durapay chaos, seed {report.seed}" + (", --lose-last-writes" if report.lose_last_writes else "")
    table = Table(title=title, show_header=False)
    table.add_column("what", style="bold")
    table.add_column("result")
    for name, value in report.rows():
        table.add_row(name, value)
    console.print(table)
    findings = report.findings
    for name, lines in (
        ("lost", findings.lost),
        ("charged twice", findings.charged_twice),
        ("charged, not succeeded", findings.not_reflected),
        ("succeeded, not charged", findings.unpaid),
        ("stuck", findings.stuck),
        ("event lost", findings.events_lost),
        ("event made up", findings.events_made_up),
        ("problems", report.problems),
    ):
        for line in lines[:SHOWN]:
            console.print(f"  {name}: {line}", highlight=False, markup=False)
        if len(lines) > SHOWN:
            console.print(f"  {name}: ... and {len(lines) - SHOWN} more (--json lists them all)", highlight=False)
    verdict = "[green]nothing wrong[/green]" if report.ok else "[red]something went wrong[/red]"
    console.print(f"{verdict} (logs and data in {report.folder})")
