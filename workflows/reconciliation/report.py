"""A reconciliation's report, kept for ``DURAPAY_RECONCILE__RETENTION_DAYS``, and what each mismatch leaves
behind: one merchant event (``reconciliation.mismatch``) and, on the flow it is about, an attention mark.

Keys (``Keys.prefix``; the reports are few and small, so they need no partition):

* ``<prefix>:reconcile:report:<id>`` - the report as JSON, expiring with the retention;
* ``<prefix>:reconcile:reports`` - sorted set of report ids by start time (trimmed to the retention);
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durapay.workflows.events import RECONCILIATION_TYPES
from durapay.workflows.keys import Keys
from durapay.workflows.reconciliation.judge import CATEGORIES, IN_FLIGHT, Finding

EVENT_TYPE = RECONCILIATION_TYPES[0]

# KEYS: 1 the mismatch's once mark, 2 the partition's event stream (same slot). ARGV: 1 seconds, 2 event JSON.
_ANNOUNCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
  return 1
end
return 0
"""


@dataclass
class Report:
    """One run: the window (POSIX seconds), what was read, and the findings."""

    id: str
    since: float
    until: float
    started: float
    by: str = "cli"
    finished: float = 0.0
    operations: int = 0
    flows: int = 0
    calls: int = 0
    pages: int = 0
    gaps: list[str] = field(default_factory=list)
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def mismatches(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.category != IN_FLIGHT]

    @property
    def running(self) -> bool:
        """Started and not finished (a run in the background: ``POST /reconciliation/reports``)."""
        return not self.finished

    @property
    def ok(self) -> bool:
        """Nothing wrong: finished, no mismatch, and the whole window was read."""
        return not self.running and not self.mismatches and not self.gaps and self.error is None

    def counts(self) -> dict[str, int]:
        return {category: sum(1 for f in self.findings if f.category == category) for category in CATEGORIES}

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
            "operations": self.operations,
            "flows": self.flows,
            "calls": self.calls,
            "pages": self.pages,
            "gaps": list(self.gaps),
            "error": self.error,
            "counts": self.counts(),
            "findings": [finding.wire() for finding in self.findings],
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Report:
        return cls(
            id=str(data["id"]),
            since=float(data["since"]),
            until=float(data["until"]),
            started=float(data["started"]),
            by=str(data.get("by") or ""),
            finished=float(data.get("finished") or 0.0),
            operations=int(data.get("operations") or 0),
            flows=int(data.get("flows") or 0),
            calls=int(data.get("calls") or 0),
            pages=int(data.get("pages") or 0),
            gaps=[str(gap) for gap in data.get("gaps") or []],
            error=data.get("error"),
            findings=[Finding.from_wire(item) for item in data.get("findings") or []],
        )


def new_report_id(now: float) -> str:
    """Time-ordered and unique: ``rec_<milliseconds>_<random>``."""
    return f"rec_{int(now * 1000)}_{secrets.token_hex(3)}"


class Reports:
    """Keeps reports and the marks and events of their mismatches. Give it a Redis client and the keys."""

    def __init__(self, client: Any, keys: Keys, retention_seconds: float) -> None:
        self.redis = client
        self.keys = keys
        self.retention_seconds = max(1, int(retention_seconds))
        self._announce = client.register_script(_ANNOUNCE)

    def _report_key(self, report_id: str) -> str:
        return f"{self.keys.prefix}:reconcile:report:{report_id}"

    @property
    def _index(self) -> str:
        return f"{self.keys.prefix}:reconcile:reports"

    def attention_key(self, flow_id: str) -> str:
        return f"{self.keys.tag(self.keys.partition(flow_id))}:attention:{flow_id}"

    def save(self, report: Report, *, now: float) -> None:
        self.redis.set(self._report_key(report.id), json.dumps(report.wire(), separators=(",", ":")), ex=self.retention_seconds)
        self.redis.zadd(self._index, {report.id: report.started})
        self.redis.zremrangebyscore(self._index, "-inf", now - self.retention_seconds)

    def get(self, report_id: str) -> Report | None:
        raw = self.redis.get(self._report_key(report_id))
        return Report.from_wire(json.loads(raw)) if raw else None

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
        entry = {"report": report_id, "time": now, **finding.wire()}
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, finding.key, json.dumps(entry, separators=(",", ":")))
        pipe.expire(key, self.retention_seconds)
        pipe.execute()

    def marks(self, flow_id: str) -> list[dict[str, Any]]:
        """The flow's attention marks, oldest first."""
        raw = self.redis.hgetall(self.attention_key(flow_id))
        return sorted((json.loads(value) for value in raw.values()), key=lambda entry: entry.get("time", 0.0))

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
