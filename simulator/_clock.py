"""The simulator's one clock: real time plus an offset that tests move.

Link expiry, the five-minute life of build sessions and "cancel only on the same day" all read
:meth:`Clock.now`, so a test advances time (``POST /_sim/clock``) instead of sleeping. The clock never
goes below real time's pace: moving it only shifts the offset.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from durapay.gateway import GATEWAY_ZONE


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """The gateway's timestamp form: ``2022-09-01T01:20:00.001Z`` (UTC, milliseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def gateway_day(moment: datetime) -> date:
    """The gateway's calendar day of ``moment``: its date in UTC+01:00, the zone in which the gateway writes
    operation times. "Cancel only on the same day" and a contract's days between payments count these."""
    return moment.astimezone(GATEWAY_ZONE).date()


def parse_iso(text: str) -> datetime:
    """Read an ISO 8601 timestamp (``Z`` or an offset; a naive value is taken as UTC)."""
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class Clock:
    """``now()`` = the wall clock + an offset. Thread-safe."""

    def __init__(self, wall: Callable[[], datetime] = utc_now) -> None:
        self._wall = wall
        self._offset = timedelta()
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            offset = self._offset
        return self._wall() + offset

    @property
    def offset_seconds(self) -> float:
        with self._lock:
            return self._offset.total_seconds()

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward (or back, for a negative value) by ``seconds``."""
        with self._lock:
            self._offset += timedelta(seconds=seconds)
        return self.now()

    def set(self, moment: datetime) -> datetime:
        """Make ``now()`` read ``moment`` (it then runs on at real pace)."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        with self._lock:
            self._offset = moment - self._wall()
        return self.now()

    def reset(self) -> None:
        with self._lock:
            self._offset = timedelta()

    def set_offset(self, seconds: float) -> None:
        with self._lock:
            self._offset = timedelta(seconds=seconds)
