"""The scheduler's daily reconciliation (``DURAPAY_RECONCILE__DAILY``): a ticker of ``durapay scheduler``.

Once a day at ``DAILY_AT`` in ``TIME_ZONE`` it reconciles the ``WINDOW_HOURS`` of wall-clock time in
that zone that end at that moment: with 24 (the default) the window starts at the previous day's run
time, so consecutive days' windows tile without gap or overlap even across a daylight-saving change
(that day's window is 23 or 25 hours long).

Any number of schedulers may run: the day is claimed in Redis and only the one that claims it runs it,
in a thread of its own so that dispatching goes on meanwhile. The claim is a lease
(:data:`LEASE_SECONDS`) while the run goes, made the day's *done* mark (kept three days) only once its
report is saved, and only for a run that read its whole window. A run that raises, or that the gateway
stopped part way (its report's ``error``: an outage, the call budget), hands the day back to be run again
:data:`RETRY_SECONDS` later; a scheduler killed mid-run lets its lease lapse. Another scheduler (or this
one) then runs the day again, up to :data:`ATTEMPTS` times a day. The gaps of a window read whole (more
operations in one millisecond than a page) are said in its report and not run again: a rerun meets the
same. A scheduler
that starts after the day's time runs the day's reconciliation then (same window); a day with no
scheduler up at all is not run later (run ``durapay reconcile --since ... --until ...``).
"""

from __future__ import annotations

import logging
import secrets
import threading
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from durapay.config.settings import ReconcileSettings
from durapay.workflows.engine import Engine, register
from durapay.workflows.reconciliation.report import Report
from durapay.workflows.reconciliation.run import Reconciler

log = logging.getLogger("durapay.reconcile")

#: How long a day's done mark is kept (longer than any clock skew between schedulers).
CLAIM_SECONDS = 3 * 86400
#: How long a running day's lease lasts: past it, a scheduler that died mid-run no longer holds the day.
#: A run still going then may be joined by a second (their events and marks are once per mismatch).
LEASE_SECONDS = 3600
#: Runs of one day at most (a day whose runs keep failing is left to a person: the log says each failure).
ATTEMPTS = 3
#: How long after a failed run the day may be run again (a gateway outage is not met three times in a row
#: within seconds of each other: the scheduler ticks every second).
RETRY_SECONDS = 600

# KEYS: 1 the day's claim, 2 its attempts. ARGV: 1 this run's token, 2 lease seconds, 3 keep seconds, 4 attempts,
# 5 now (the engine's clock). A claim reading 'after:<time>' is a failed run's: the day is free from that time.
# Resend-safe (workflows/engine/scripts.py): a claim sent again after its answer was lost finds its own token and
# answers 1 as at first (it answered 0, and the day's run slipped by the lease).
_CLAIM = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then return 1 end
if held then
  local after = string.match(held, '^after:(.+)$')
  if not after or tonumber(ARGV[5]) < tonumber(after) then return 0 end
end
if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[4]) then return 0 end
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""
# KEYS: 1 the day's claim. ARGV: 1 this run's token, 2 "done" or "after:<time>" (free again then), 3 keep seconds.
_SETTLE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"""


def run_time(settings: ReconcileSettings, now: float) -> float:
    """Today's run time (POSIX seconds) in ``settings.time_zone``: ``DAILY_AT`` on the day ``now`` is in."""
    zone = ZoneInfo(settings.time_zone)
    hour, minute = (int(part) for part in settings.daily_at.split(":"))
    return datetime.fromtimestamp(now, zone).replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()


def next_run(settings: ReconcileSettings, now: float) -> float | None:
    """When the daily run next starts after ``now`` (None: it is off), for people: the console says it
    rather than "turn it on" (it is on by default). Today's time if it is still to come, else tomorrow's
    (its wall time, whatever a daylight-saving change does to the day's length)."""
    if not settings.daily:
        return None
    today = run_time(settings, now)
    if now < today:
        return today
    zone = ZoneInfo(settings.time_zone)
    tomorrow = (datetime.fromtimestamp(today, zone).replace(tzinfo=None) + timedelta(days=1)).replace(tzinfo=zone)
    return tomorrow.timestamp()


class DailyReconciliation:
    """Give it the engine; ``tick`` is the dispatcher's ticker. ``background=False`` runs in the caller."""

    def __init__(self, engine: Engine, *, background: bool = True) -> None:
        self.engine = engine
        self.settings = engine.settings.reconcile
        self.background = background
        #: One run per gateway terminal, default's first (the gateway lists a terminal's operations only).
        self.reconcilers = [Reconciler(engine, terminal=name) for name in engine.terminals.names]
        self.reconciler = self.reconcilers[0]
        self.zone = ZoneInfo(self.settings.time_zone)
        self._thread: threading.Thread | None = None
        self._claim = register(engine.redis, "reconciliation/daily.py:_CLAIM", _CLAIM)
        self._settle = engine.redis.register_script(_SETTLE)

    def due(self, now: float) -> float | None:
        """Today's run time (POSIX seconds) once it has come, else None."""
        at = run_time(self.settings, now)
        return at if now >= at else None

    def window(self, at: float) -> tuple[float, float]:
        """The window of the run due at ``at``: ``WINDOW_HOURS`` of wall-clock time in the zone before it."""
        local = datetime.fromtimestamp(at, self.zone).replace(tzinfo=None)
        start = (local - timedelta(hours=self.settings.window_hours)).replace(tzinfo=self.zone)
        return start.timestamp(), at

    def claim_key(self, at: float) -> str:
        """The day's claim; its attempts counter is this plus ``:attempts``. The hash tag keeps both in one
        slot: the claim's script names both, which a Redis Cluster refused (CROSSSLOT) without it."""
        day = datetime.fromtimestamp(at, self.zone).date().isoformat()
        return f"{self.engine.keys.prefix}:reconcile:{{daily:{day}}}"

    def tick(self) -> int:
        """Start the day's run if it is due and no scheduler holds or finished it. Returns 0 (it sends no flows)."""
        if not self.settings.daily or (self._thread is not None and self._thread.is_alive()):
            return 0
        at = self.due(self.engine.clock.now())
        if at is None:
            return 0
        key, token = self.claim_key(at), secrets.token_hex(8)
        now = repr(self.engine.clock.now())
        if not self._claim(keys=[key, f"{key}:attempts"], args=[token, LEASE_SECONDS, CLAIM_SECONDS, ATTEMPTS, now]):
            return 0
        since, until = self.window(at)
        if self.background:
            self._thread = threading.Thread(
                target=self._run, args=(since, until, key, token), name="reconcile-daily", daemon=True
            )
            self._thread.start()
        else:
            self._run(since, until, key, token)
        return 0

    def _run(self, since: float, until: float, key: str, token: str) -> None:
        """Every terminal's run of the day, in turn; the day is settled once each read its window whole, and
        handed back (every terminal run again later) when one failed or stopped part way."""
        again = f"the day is run again in {RETRY_SECONDS} s, {ATTEMPTS} runs a day at most"
        for reconciler in self.reconcilers:
            try:
                report = reconciler.run(since, until, by="scheduler")
            except Exception:
                log.exception("daily reconciliation of terminal %s failed (%s)", reconciler.terminal, again)
                self._release(key, token)
                return
            if report.error is not None:
                # The window was not read whole: what it did not read is in no later window (each day reads its own).
                log.error("daily reconciliation %s stopped part way (%s): %s", report.id, again, report.error)
                self._release(key, token)
                return
            self._told(report)
        self._settle(keys=[key], args=[token, "done", CLAIM_SECONDS])

    @staticmethod
    def _told(report: Report) -> None:
        if report.ok:
            log.info("daily reconciliation %s (%s): nothing wrong (%d operations)", report.id, report.terminal, report.operations)
        else:
            log.error(
                "daily reconciliation %s (%s): %d mismatch(es), %d gap(s): %s",
                report.id,
                report.terminal,
                len(report.mismatches),
                len(report.gaps),
                "; ".join(report.gaps[:3]) or "none",
            )

    def _release(self, key: str, token: str) -> None:
        """Hand the day back: another run may claim it :data:`RETRY_SECONDS` from now (``_CLAIM``)."""
        self._settle(keys=[key], args=[token, f"after:{self.engine.clock.now() + RETRY_SECONDS!r}", CLAIM_SECONDS])
