"""The shapes of ``/reconciliation``'s answers and its run request (``service.api_reconcile``).

Kept apart from ``service.schemas`` (the flows' and schedules' answers): a reconciliation report is
the gateway's side of the books, not a flow's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from durapay.gateway import StrictModel
from durapay.service.timeparse import SINCE_FORMS, SINCE_PATTERN


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class ReconciliationFinding(_Answer):
    """One line of a report: its category, one sentence, its flow and the gateway's operation."""

    category: str = Field(description="money_without_flow, flow_without_money, money_not_shown or in_flight")
    what: str
    flow: str | None = None
    kind: str | None = None
    state: str | None = None
    operation: dict[str, Any] | None = Field(default=None, description="the gateway's operation (no card data)")
    named: str | None = Field(default=None, description="the operation id the flow names (flow_without_money)")


class ReconciliationSummary(_Answer):
    """A report without its findings."""

    id: str
    ok: bool = Field(description="finished with no mismatch and the whole window read")
    running: bool
    since: float
    until: float
    started: float
    finished: float
    by: str
    terminal: str = Field(default="default", description="the gateway terminal whose operations it read (DURAPAY_TERMINALS)")
    operations: int
    flows: int
    calls: int
    pages: int
    gaps: list[str]
    error: str | None = None
    interrupted: str | None = Field(
        default=None, description="why the run stopped before it finished (its process died: its lease ran out)"
    )
    counts: dict[str, int]


class ReconciliationReport(ReconciliationSummary):
    findings: list[ReconciliationFinding]


class ReconciliationList(_Answer):
    reports: list[ReconciliationSummary]


class ReconciliationRun(StrictModel):
    """The window to reconcile."""

    since: str = Field(default="24h", pattern=SINCE_PATTERN, description=f"start of the window: {SINCE_FORMS}")
    until: str | None = Field(default=None, pattern=SINCE_PATTERN, description=f"end of the window (default: now): {SINCE_FORMS}")
    terminal: str = Field(
        default="default", max_length=32, description="the gateway terminal to read (each terminal is its own run)"
    )
