"""Reconciliation against the gateway: a daily proof that every payment is accounted for.

Every operation of a time window is read from the gateway (``window``), matched to the flow that holds it
and judged by the money rule (``money``, ``judge``) into four categories; the report is kept and each
mismatch told (``report``); ``run.Reconciler`` does one run, ``daily`` makes the scheduler run it every
day. How to read a report and what to do for each category: docs/operations.md, Reconciliation.
"""

from __future__ import annotations

from durapay.workflows.reconciliation.judge import (
    CATEGORIES,
    FLOW_WITHOUT_MONEY,
    IN_FLIGHT,
    MISMATCHES,
    MONEY_NOT_SHOWN,
    MONEY_WITHOUT_FLOW,
    Finding,
)
from durapay.workflows.reconciliation.report import EVENT_TYPE, Report, Reports
from durapay.workflows.reconciliation.run import Reconciler, exit_status

__all__ = [
    "CATEGORIES",
    "EVENT_TYPE",
    "FLOW_WITHOUT_MONEY",
    "IN_FLIGHT",
    "MISMATCHES",
    "MONEY_NOT_SHOWN",
    "MONEY_WITHOUT_FLOW",
    "Finding",
    "Reconciler",
    "Report",
    "Reports",
    "exit_status",
]
