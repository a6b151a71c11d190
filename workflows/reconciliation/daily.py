"""The scheduler's daily reconciliation (``DURAPAY_RECONCILE__DAILY``): a ticker of ``durapay scheduler``.

Once a day at ``DAILY_AT`` in ``TIME_ZONE`` it reconciles the ``WINDOW_HOURS`` that end at that moment,
so consecutive days' windows tile without gap or overlap (a daylight-saving change makes one day's
window an hour longer or shorter than the hours it is given: the window always ends at the day's run
time). Any number of schedulers may run: the day is claimed in Redis (``SET NX``, kept three days)
and only the one that claims it runs it, in a thread of its own so that dispatching goes on meanwhile.
A scheduler that starts after the day's time runs the day's reconciliation then (same window); a day
with no scheduler up at all is not run later (run ``durapay reconcile --since ... --until ...``).
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from zoneinfo import ZoneInfo

from durapay.workflows.engine import Engine
from durapay.workflows.reconciliation.run import Reconciler

log = logging.getLogger("durapay.reconcile")

#: How long a day's claim is kept (longer than any clock skew between schedulers).
CLAIM_SECONDS = 3 * 86400


class DailyReconciliation:
    """Give it the engine; ``tick`` is the dispatcher's ticker. ``background=False`` runs in the caller."""

    def __init__(self, engine: Engine, *, background: bool = True) -> None:
        self.engine = engine
        self.settings = engine.settings.reconcile
        self.background = background
        self.reconciler = Reconciler(engine)
        self.zone = ZoneInfo(self.settings.time_zone)
        self._thread: threading.Thread | None = None

    def due(self, now: float) -> float | None:
        """Today's run time (POSIX seconds) once it has come, else None."""
        local = datetime.fromtimestamp(now, self.zone)
        hour, minute = (int(part) for part in self.settings.daily_at.split(":"))
        at = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
        return at.timestamp() if local >= at else None

    def claim_key(self, at: float) -> str:
        day = datetime.fromtimestamp(at, self.zone).date().isoformat()
        return f"{self.engine.keys.prefix}:reconcile:daily:{day}"

    def tick(self) -> int:
        """Start the day's run if it is due and no scheduler claimed it. Returns 0 (it sends no flows)."""
        if not self.settings.daily or (self._thread is not None and self._thread.is_alive()):
            return 0
        at = self.due(self.engine.clock.now())
        if at is None or not self.engine.redis.set(self.claim_key(at), "1", nx=True, ex=CLAIM_SECONDS):
            return 0
        since = at - self.settings.window_hours * 3600
        if self.background:
            self._thread = threading.Thread(target=self._run, args=(since, at), name="reconcile-daily", daemon=True)
            self._thread.start()
        else:
            self._run(since, at)
        return 0

    def _run(self, since: float, until: float) -> None:
        try:
            report = self.reconciler.run(since, until, by="scheduler")
        except Exception:
            log.exception("daily reconciliation failed")
            return
        if report.ok:
            log.info("daily reconciliation %s: nothing wrong (%d operations)", report.id, report.operations)
        else:
            log.error(
                "daily reconciliation %s: %d mismatch(es), %d part(s) not read%s",
                report.id,
                len(report.mismatches),
                len(report.gaps),
                f"; {report.error}" if report.error else "",
            )
