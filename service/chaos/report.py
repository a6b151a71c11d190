"""The result of a chaos run: the numbers, the findings, and how they print (a table, or JSON).

Two times after the last chaos event (the campaign's end, when the faults are cleared), from each flow's
history (:func:`recovery`): the engine's own recovery ("time to recover"), and the time flows spent
waiting on a deadline that is not the engine's: a customer who has not paid yet, a link's expiry, an
adopted link read every five minutes (the ``waiting`` state and its deadline), a timer the flow's input
set (``sleeping``, a delayed charge's ``runAt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from durapay.service.chaos.reconcile import Findings

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
    #: The engine's own recovery: from the last chaos event until every flow had finished, the time each
    #: (and the flow it follows) spent waiting on a customer's or a timer's deadline taken out.
    recover_seconds: float | None = None
    #: The longest a flow (with the flow it follows) waited on such a deadline after the last chaos event.
    waiting_seconds: float | None = None
    #: The flows that set those two times (the last to recover; the longest to wait).
    slowest: dict[str, str] = field(default_factory=dict)
    #: From the last chaos event until the run saw every flow and the schedule finished.
    finished_seconds: float | None = None
    #: Operator actions (:class:`service.chaos.operator.OperatorCounts`, as a dict).
    operator: dict[str, Any] = field(default_factory=dict)
    #: Each operator action: when, what, on which flow (kind, state), what the engine answered.
    operator_log: list[dict[str, Any]] = field(default_factory=list)
    #: PENDING outcomes: rules armed, requests answered PENDING (approved, declined), settled by the run.
    pending: dict[str, int] = field(default_factory=dict)
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
        waiting = "-" if self.waiting_seconds is None else f"{self.waiting_seconds:.1f} s"
        finished = "" if self.finished_seconds is None else f"; everything finished {self.finished_seconds:.1f} s after it"
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
            ("operator", self._operator_text()),
            ("PENDING", self._pending_text()),
            ("lost", str(len(findings.lost))),
            ("charged twice", str(len(findings.charged_twice))),
            ("charged, not succeeded", str(len(findings.not_reflected))),
            ("succeeded, not charged", str(len(findings.unpaid))),
            ("stuck", str(len(findings.stuck))),
            ("events lost / made up", f"{len(findings.events_lost)} / {len(findings.events_made_up)}"),
            ("time to recover", f"{recover} after the last fault (the engine's own)"),
            ("waiting on customers", f"{waiting} (customers, links' expiry, timers: not the engine's{finished})"),
            ("schedule", ", ".join(f"{key} {value}" for key, value in self.schedule.items()) or "-"),
            *self._server_row(),
        ]

    def _operator_text(self) -> str:
        o = self.operator
        if not o:
            return "-"
        answers = ", ".join(f"{n} {a}" for a, n in sorted(o.get("cancel_answers", {}).items(), key=_most))
        ended = ", ".join(f"{n} {s}" for s, n in sorted(o.get("requests_ended", {}).items(), key=_most))
        cancels = f"{o.get('cancels', 0)} cancels" + (f" ({answers})" if answers else "")
        if ended:
            cancels += f"; the requests ended {ended}"
        parts = [
            cancels,
            f"{o.get('retries', 0)} retries",
            f"late payments {o.get('late_refunded', 0)} refunded, {o.get('late_kept', 0)} kept",
            f"{o.get('refused', 0)} refused",
        ]
        if o.get("paid_after_cancel"):
            parts.append(f"{o['paid_after_cancel']} paid by the customer after the cancel")
        if o.get("idle"):
            parts.append(f"{o['idle']} found nothing to do")
        total = sum(int(o.get(name, 0)) for name in ("cancels", "retries", "late_refunded", "late_kept", "refused"))
        return f"{total}: " + "; ".join(parts)

    def _pending_text(self) -> str:
        p = self.pending
        if not p:
            return "-"
        return (
            f"{p.get('answered', 0)} answered ({p.get('approved', 0)} approved, {p.get('declined', 0)} declined; "
            f"{p.get('rules', 0)} rules); {p.get('settled_by_run', 0)} settled by the run, the rest by the gateway's clock"
        )

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


def _most(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


#: The states in which a flow waits on a deadline that is not the engine's (a customer, a link, a timer).
DEADLINE_STATES = frozenset({"waiting", "sleeping"})


def flow_times(history: list[dict[str, Any]], since: float) -> tuple[float, float]:
    """(when the flow ended, how long it waited on a deadline after ``since``), from its log entries
    (``t`` and ``to``): the time spent in ``waiting`` or ``sleeping`` between ``since`` and its end."""
    entries = sorted(history, key=lambda entry: float(entry.get("t") or 0.0))
    if not entries:
        return since, 0.0
    end = float(entries[-1]["t"])
    waited = 0.0
    for index, entry in enumerate(entries):
        if entry.get("to") not in DEADLINE_STATES:
            continue
        left = max(float(entry["t"]), since)
        right = min(float(entries[index + 1]["t"]) if index + 1 < len(entries) else end, end)
        waited += max(0.0, right - left)
    return end, waited


@dataclass(frozen=True)
class Recovery:
    """The two times after the last chaos event, and the flow that set each."""

    engine: float = 0.0
    waiting: float = 0.0
    engine_flow: str = ""
    waiting_flow: str = ""


def recovery(histories: Mapping[str, list[dict[str, Any]]], parents: Mapping[str, str], since: float) -> Recovery:
    """The engine's own recovery and the longest wait on a deadline, after ``since`` (the last chaos event).

    A flow's engine time is from ``since`` to its end less the time it, and the flows it follows
    (``parents``: a refund started once its payment succeeded), waited on a deadline after ``since``: a
    follow-up of a payment its customer paid late does not count that wait as the engine's."""
    times = {flow_id: flow_times(history, since) for flow_id, history in histories.items()}

    def waited(flow_id: str) -> float:
        total, seen = 0.0, set()
        while flow_id in times and flow_id not in seen:
            seen.add(flow_id)
            total += times[flow_id][1]
            flow_id = parents.get(flow_id, "")
        return total

    found = Recovery()
    for flow_id, (end, _) in sorted(times.items()):
        wait = waited(flow_id)
        if wait > found.waiting:
            found = Recovery(found.engine, wait, found.engine_flow, flow_id)
        if end - since - wait > found.engine:
            found = Recovery(end - since - wait, found.waiting, flow_id, found.waiting_flow)
    return found


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
