"""The engine's one source of "now": a clock passed in, so tests move time instead of sleeping.

Everything in the engine that needs the time (leases, backoff, timers, wait deadlines, schedules)
takes a :class:`Clock`. Production uses :class:`SystemClock`; tests use :class:`ManualClock` and move
it forward. Times are POSIX seconds (float) in UTC.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told (thread safe): ``clock.advance(86400)`` is tomorrow."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> None:
        with self._lock:
            self._now = when


class OffsetClock:
    """Real time plus an offset that can be moved: for multi-process tests and the demo's fast-forward."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


def iso(timestamp: float) -> str:
    """POSIX seconds as ISO 8601 UTC with milliseconds: ``2026-11-22T10:00:00.000Z``."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(timestamp * 1000) % 1000:03d}Z"
