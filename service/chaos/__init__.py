"""``durapay chaos``: prove the guarantees on this machine by breaking everything while flows run.

* :mod:`service.chaos.stack` - its own Valkey (AOF ``always``, or ``everysec``), simulator, receiver, workers, scheduler;
* :mod:`service.chaos.workload` - the flows (every kind the simulator completes by itself, follow-ups);
* :mod:`service.chaos.campaign` - worker and scheduler SIGKILLs, Redis restarts, gateway faults, PENDING outcomes;
* :mod:`service.chaos.operator` - a person's cancels, retries and late-payment refunds at random moments;
* :mod:`service.chaos.aof` - the crash model of ``--lose-last-writes`` (cut the AOF's unsynced tail);
* :mod:`service.chaos.reconcile` - every flow against the gateway's ledger;
* :mod:`service.chaos.report` - the table (or JSON), the engine's own recovery apart from waiting on customers, and the verdict.
"""

from durapay.service.chaos.report import ChaosReport, print_report
from durapay.service.chaos.run import ChaosOptions, run_chaos

__all__ = ["ChaosOptions", "ChaosReport", "print_report", "run_chaos"]
