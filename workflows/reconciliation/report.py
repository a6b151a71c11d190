"""A reconciliation's report, kept for ``DURAPAY_RECONCILE__RETENTION_DAYS``, and what each mismatch leaves
behind: one merchant event (``reconciliation.mismatch``) and, on the flow it is about, an attention mark.

Keys (``Keys.prefix``; the reports are few and small, so they need no partition):

* ``<prefix>:reconcile:report:<id>`` - the report as JSON, expiring with the retention;
* ``<prefix>:reconcile:reports`` - sorted set of report ids by start time (trimmed to the retention);
* ``<prefix>:reconcile:lease:<id>`` - the lease of a running report, kept alive by its run
  (:class:`Lease`, every third of ``DURAPAY_RECONCILE__LEASE_SECONDS``); a running report whose lease
  ran out is read as *interrupted* (its process died or lost Redis mid-run) and stored so;
* ``<prefix>:reconcile:carried`` - hash, operation id -> when it was first found in flight: what the next
  run reads again by id (``Reconciler.complete``), at most :data:`MAX_CARRIED`; one older than the
  retention is dropped, and its report says so;
* ``<prefix>:{pN}:attention:<flow id>`` - hash, one field per mismatch found on the flow (its key), in the
  flow's partition; expires with the retention. It is the flow's *attention mark* (docs/operations.md):
  the record itself is changed only through the engine's transitions.
* ``<prefix>:{pN}:reconciled:<digest>`` - the once-per-mismatch mark of its event, in the slot of the
  stream it is written to (the flow's partition; for money without a flow, its order id's, as
  ``notification.unknown_order`` does), written with the event in one script: the same mismatch found by
  a later run within the retention is not announced again.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durapay.workflows.engine import RECONCILIATION_TYPES, Keys, attention_marks, moment_id
from durapay.workflows.reconciliation.findings import CATEGORIES, IN_FLIGHT, TITLES, Finding
from durapay.workflows.reconciliation.lease import Lease

EVENT_TYPE = RECONCILIATION_TYPES[0]

# KEYS: 1 the mismatch's once mark, 2 the partition's event stream (same slot). ARGV: 1 seconds, 2 event JSON.
_ANNOUNCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
  return 1
end
return 0
"""


# KEYS: 1 the report. ARGV: 1 the running report as read, 2 the same interrupted. Only over what was read:
# a run that finished meanwhile (a process that stalled past its lease, then came back) keeps its report.
_INTERRUPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
"""

#: Operations in flight one run hands to the next, at most (the oldest are dropped past it, and said).
MAX_CARRIED = 10_000
#: Findings a kept report holds per category, at most: its counts stay whole, every mismatch is still
#: announced and marked, and the report says how many lines it left out (a report is one Redis string,
#: read whole by the console and /metrics).
MAX_FINDINGS = 1_000
#: The newest reports the standing one is chosen among (``Reports.standing``).
STANDING_LOOKBACK = 20


@dataclass
class Carried:
    """The operations the previous runs left in flight: to read again (``ids``), and those followed past
    the retention (``expired``), each with when it was first found in flight."""

    ids: dict[str, float] = field(default_factory=dict)
    expired: dict[str, float] = field(default_factory=dict)


@dataclass
class Report:
    """One run: the window (POSIX seconds), what was read, and the findings."""

    id: str
    since: float
    until: float
    started: float
    by: str = "cli"
    #: The gateway terminal whose operations the run read (the gateway lists per terminal: each its own run).
    terminal: str = "default"
    finished: float = 0.0
    operations: int = 0
    flows: int = 0
    calls: int = 0
    pages: int = 0
    gaps: list[str] = field(default_factory=list)
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)
    #: Operations of earlier runs' in-flight findings read again by id (outside this window).
    carried: int = 0
    #: Why the run ended without finishing (its lease ran out: the process died; or it failed), or None.
    interrupted: str | None = None
    #: Counts by category as found (the stored findings may be fewer: :data:`MAX_FINDINGS`).
    found: dict[str, int] = field(default_factory=dict, compare=False)
    #: Operations found in flight past :data:`MAX_CARRIED`: not handed on (said in :attr:`gaps`, :meth:`not_followed`).
    not_carried: int = field(default=0, compare=False)
    _kept: set[str] = field(default_factory=set, compare=False, repr=False)

    def add(self, findings: Iterable[Finding], in_flight: set[str]) -> None:
        """Count ``findings`` and keep what the run needs: every mismatch once (by its key, for its event,
        mark and move), the first :data:`MAX_FINDINGS` in flight; the in-flight operation ids go to
        ``in_flight`` (for the next runs), at most :data:`MAX_CARRIED`."""
        for finding in findings:
            if finding.category != IN_FLIGHT:
                if finding.key in self._kept:
                    continue
                self._kept.add(finding.key)
            self.found[finding.category] = self.found.get(finding.category, 0) + 1
            if finding.category != IN_FLIGHT:
                self.findings.append(finding)
                continue
            if self.found[finding.category] <= MAX_FINDINGS:
                self.findings.append(finding)
            operation_id = (finding.operation or {}).get("operationId")
            if not operation_id or str(operation_id) in in_flight:
                continue
            if len(in_flight) < MAX_CARRIED:
                in_flight.add(str(operation_id))
            else:
                self.not_carried += 1

    def not_followed(self, dropped: list[str]) -> None:
        """Say in :attr:`gaps` the operations in flight no later run will read again: those past
        :data:`MAX_CARRIED` in this run (``not_carried``) and ``dropped`` by ``Reports.carry`` (the
        oldest carried). The report is then not ok: their money is judged by no report."""
        count = self.not_carried + len(dropped)
        if count:
            named = f": {', '.join(dropped[:10])}{', ...' if len(dropped) > 10 else ''}" if dropped else ""
            self.gaps.append(
                f"{count} operation(s) in flight are not followed by the next runs (more than {MAX_CARRIED} in flight"
                f"{named}): reconcile their days again once they settle"
            )

    @property
    def mismatches(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.category != IN_FLIGHT]

    @property
    def mismatched(self) -> bool:
        return any(count for category, count in self.counts().items() if category != IN_FLIGHT)

    @property
    def running(self) -> bool:
        """Started, not finished, not interrupted (a run whose process holds its lease)."""
        return not self.finished and self.interrupted is None

    @property
    def ok(self) -> bool:
        """Nothing wrong: finished, no mismatch, and the whole window was read."""
        return bool(self.finished) and self.interrupted is None and not self.mismatched and not self.gaps and self.error is None

    def counts(self) -> dict[str, int]:
        listed = {category: sum(1 for f in self.findings if f.category == category) for category in CATEGORIES}
        return {category: max(listed[category], self.found.get(category, 0)) for category in CATEGORIES}

    def covers(self, other: Report) -> bool:
        """Whether this report's window holds all of ``other``'s."""
        return self.since <= other.since and self.until >= other.until

    def bounded(self) -> list[Finding]:
        """The findings a kept report holds: the first :data:`MAX_FINDINGS` of each category."""
        kept: list[Finding] = []
        seen: dict[str, int] = {}
        for finding in self.findings:
            seen[finding.category] = seen.get(finding.category, 0) + 1
            if seen[finding.category] <= MAX_FINDINGS:
                kept.append(finding)
        return kept

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ok": self.ok,
            "running": self.running,
            "since": self.since,
            "until": self.until,
            "started": self.started,
            "finished": self.finished,
            "by": self.by,
            "terminal": self.terminal,
            "operations": self.operations,
            "flows": self.flows,
            "calls": self.calls,
            "pages": self.pages,
            "gaps": list(self.gaps),
            "error": self.error,
            "interrupted": self.interrupted,
            "counts": self.counts(),
            "carried": self.carried,
            "findings": [finding.wire() for finding in self.bounded()],
            "left_out": max(0, sum(self.counts().values()) - len(self.bounded())),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Report:
        return cls(
            id=str(data["id"]),
            since=float(data["since"]),
            until=float(data["until"]),
            started=float(data["started"]),
            by=str(data.get("by") or ""),
            terminal=str(data.get("terminal") or "default"),  # a report of an earlier release: default's
            finished=float(data.get("finished") or 0.0),
            operations=int(data.get("operations") or 0),
            flows=int(data.get("flows") or 0),
            calls=int(data.get("calls") or 0),
            pages=int(data.get("pages") or 0),
            gaps=[str(gap) for gap in data.get("gaps") or []],
            error=data.get("error"),
            findings=[Finding.from_wire(item) for item in data.get("findings") or []],
            carried=int(data.get("carried") or 0),
            interrupted=data.get("interrupted"),
            found={str(k): int(v) for k, v in (data.get("counts") or {}).items()},
        )


def new_report_id(now: float) -> str:
    """Time-ordered and unique: ``rec_<moment>_<random>`` (``clock.moment_id``: never read as a card number)."""
    return f"rec_{moment_id(now)}_{secrets.token_hex(3)}"


class Reports:
    """Keeps reports and the marks and events of their mismatches. Give it a Redis client and the keys."""

    def __init__(
        self, client: Any, keys: Keys, retention_seconds: float, *, lease_seconds: float = 60.0, terminal: str = "default"
    ) -> None:
        self.redis = client
        self.keys = keys
        #: Whose in-flight operations :meth:`carried` hands on (read again with that terminal's key only).
        self.terminal = terminal
        self.retention_seconds = max(1, int(retention_seconds))
        self.lease_seconds = lease_seconds
        self._announce = client.register_script(_ANNOUNCE)
        self._interrupt = client.register_script(_INTERRUPT)

    def lease_key(self, report_id: str) -> str:
        return f"{self.keys.prefix}:reconcile:lease:{report_id}"

    def hold(self, report: Report) -> Lease:
        """Keep ``report`` as running, under a lease its run renews until :meth:`Lease.end`."""
        lease = Lease(self.redis, self.lease_key(report.id), self.lease_seconds)
        self.save(report, now=report.started)
        return lease

    def live(self) -> Report | None:
        """The newest report whose run holds its lease (any process), among the newest
        :data:`STANDING_LOOKBACK`; one whose lease ran out is interrupted, and none."""
        for member in self.redis.zrevrange(self._index, 0, STANDING_LOOKBACK - 1):
            report = self.get(member.decode())
            if report is not None and report.running:
                return report
        return None

    def _report_key(self, report_id: str) -> str:
        return f"{self.keys.prefix}:reconcile:report:{report_id}"

    @property
    def _index(self) -> str:
        return f"{self.keys.prefix}:reconcile:reports"

    def attention_key(self, flow_id: str) -> str:
        return self.keys.attention(flow_id)

    def save(self, report: Report, *, now: float) -> None:
        self.redis.set(self._report_key(report.id), json.dumps(report.wire(), separators=(",", ":")), ex=self.retention_seconds)
        self.redis.zadd(self._index, {report.id: report.started})
        self.redis.zremrangebyscore(self._index, "-inf", now - self.retention_seconds)

    def get(self, report_id: str) -> Report | None:
        """The report; a running one whose lease ran out is interrupted (and stored so)."""
        raw = self.redis.get(self._report_key(report_id))
        if not raw:
            return None
        report = Report.from_wire(json.loads(raw))
        if report.running and not self.redis.exists(self.lease_key(report_id)):
            report.interrupted = (
                "its run stopped before it finished: its process no longer renewed the run's lease "
                "(it died, or lost Redis); the window was not judged, run it again"
            )
            interrupted = json.dumps(report.wire(), separators=(",", ":"))
            if not self._interrupt(keys=[self._report_key(report_id)], args=[raw, interrupted]):
                return self.get(report_id)  # it finished meanwhile: its own report
        return report

    @property
    def _carried(self) -> str:
        suffix = "" if self.terminal == "default" else f":{self.terminal}"  # default's key as before terminals
        return f"{self.keys.prefix}:reconcile:carried{suffix}"

    def carried(self, *, now: float) -> Carried:
        """The operations earlier runs left in flight (module docstring)."""
        found = Carried()
        for member, value in self.redis.hgetall(self._carried).items():
            first = float(value)
            (found.expired if first < now - self.retention_seconds else found.ids)[member.decode()] = first
        return found

    def carry(self, in_flight: set[str], *, done: set[str], now: float) -> list[str]:
        """Hand ``in_flight`` to the next run (keeping when each was first found), and forget ``done``
        (read again by this run) unless it is still in flight; at most :data:`MAX_CARRIED` kept. Returns
        the operations dropped past it (the oldest), for the report to say (:meth:`Report.not_followed`)."""
        finished = sorted(done - in_flight)
        if finished:
            self.redis.hdel(self._carried, *finished)
        for operation_id in sorted(in_flight):
            self.redis.hsetnx(self._carried, operation_id, repr(now))
        size = int(self.redis.hlen(self._carried))
        if size <= MAX_CARRIED:
            return []
        entries = sorted(((float(v), k) for k, v in self.redis.hgetall(self._carried).items()), reverse=True)
        dropped = [key for _, key in entries[MAX_CARRIED:]]
        self.redis.hdel(self._carried, *dropped)
        return sorted(key.decode() for key in dropped)

    def standing(self) -> Report | None:
        """The report the console's home page and the metrics follow: the newest finished one that found
        something wrong and that no newer finished report covers (a run over a few minutes clears
        nothing of a day it did not read again), else the newest finished one (among the newest
        :data:`STANDING_LOOKBACK`)."""
        finished: list[Report] = []
        for member in self.redis.zrevrange(self._index, 0, STANDING_LOOKBACK - 1):
            report = self.get(member.decode())
            if report is not None and not report.running:
                finished.append(report)
        for index, report in enumerate(finished):
            if not report.ok and not any(newer.covers(report) for newer in finished[:index]):
                return report
        return finished[0] if finished else None

    def latest(self, *, finished: bool = False) -> Report | None:
        """The newest report still kept (``finished``: the newest whose run is over)."""
        for member in self.redis.zrevrange(self._index, 0, 9):
            report = self.get(member.decode())
            if report is not None and not (finished and report.running):
                return report
        return None

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest reports' summaries (no findings), newest first."""
        found: list[dict[str, Any]] = []
        for member in self.redis.zrevrange(self._index, 0, max(0, limit - 1)):
            report = self.get(member.decode())
            if report is not None:
                summary = report.wire()
                summary.pop("findings")
                found.append(summary)
        return found

    def mark(self, finding: Finding, report_id: str, *, now: float) -> None:
        """The flow's attention mark of ``finding`` (no flow: nothing to mark)."""
        if not finding.flow:
            return
        key = self.attention_key(finding.flow)
        entry = {"report": report_id, "time": now, "title": TITLES[finding.category], **finding.wire()}
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, finding.key, json.dumps(entry, separators=(",", ":")))
        pipe.expire(key, self.retention_seconds)
        pipe.execute()

    def marks(self, flow_id: str) -> list[dict[str, Any]]:
        """The flow's attention marks, oldest first (``store.attention_marks``: what the flow's own views
        and history show)."""
        return attention_marks(self.redis.hgetall(self.attention_key(flow_id)))

    def announce(self, finding: Finding, report_id: str, *, now: float) -> bool:
        """Write the finding's ``reconciliation.mismatch`` event, unless this mismatch was announced within
        the retention. True when written."""
        partition = self.keys.partition(finding.flow or finding.order_id or finding.key)
        digest = hashlib.sha256(finding.key.encode()).hexdigest()[:32]
        once = f"{self.keys.tag(partition)}:reconciled:{digest}"
        event = {
            "type": EVENT_TYPE,
            "time": now,
            "flow": finding.flow,
            "kind": finding.kind,
            "orderId": finding.order_id or None,
            "operationId": (finding.operation or {}).get("operationId") or finding.named,
            "data": {
                "category": finding.category,
                "what": finding.what,
                "report": report_id,
                "state": finding.state,
                "operation": finding.operation,
                "named": finding.named,
            },
        }
        stream = self.keys.events(partition)
        written = self._announce(keys=[once, stream], args=[self.retention_seconds, json.dumps(event, separators=(",", ":"))])
        return bool(written)
