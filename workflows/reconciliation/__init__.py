"""Reconciliation against the gateway: a daily proof that every payment is accounted for.

Every operation of a time window is read from the gateway a page at a time (``window``), matched to the
flow that holds it and judged by the money rule (``money``, ``judge``) into four categories
(``findings``); the report is kept, under a lease while it runs (``lease``), and each mismatch told
(``report``); ``run.Reconciler`` does one run, ``daily`` makes the scheduler run it every day. How to
read a report and what to do for each category: docs/operations.md, Reconciliation.
"""

from __future__ import annotations

from durapay.workflows.reconciliation.findings import (
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
