"""The engine's one source of "now": a clock passed in, so tests move time instead of sleeping.

Everything in the engine that needs the time (leases, backoff, timers, wait deadlines, schedules)
takes a :class:`Clock`. Production uses :class:`ServerClock` (the Redis server's time, so that every
host agrees); tests use :class:`ManualClock` and move it forward. Times are POSIX seconds (float) in UTC.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


def server_time(client: Any) -> float:
    """The Redis server's time now (``TIME``), in POSIX seconds: the one way every part reads it.

    Asked on its own, never queued in a pipeline: a Redis Cluster client refuses a command without a
    key in a pipeline (it cannot route it), so a ``TIME`` next to key commands worked on one server
    and failed every time on a cluster (issue 28: no webhook was ever delivered there). On a cluster
    the client's default node answers; the nodes' clocks are taken to agree as NTP keeps them (every
    process already judges leases by one node's clock, :class:`ServerClock`)."""
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


class ServerClock:
    """Real time as the Redis server tells it: the one clock of every process that judges leases and
    due times, so that hosts whose clocks drift apart still agree.

    Each process measures the offset between its own clock and the server's ``TIME`` (the middle of
    the round trip) at start and every ``refresh`` seconds, and adds it to its own clock. The error is
    at most half a round trip plus the drift over ``refresh`` (well under a millisecond on a LAN with
    NTP-disciplined hosts); without it, a worker 50 ms behind the dispatcher found due steps "early".
    Each measurement keeps the shorter of ``SAMPLES`` round trips: a process's first ``TIME`` also
    opens its connection (the connect and the client's handshake fall before the server reads the
    time), which put a fresh worker's clock 0.3-1.2 ms ahead of the server's until the next refresh.
    While the server cannot be reached the last offset is kept.
    """

    #: ``TIME`` round trips per measurement; the shortest one is kept (its error bound is the smallest).
    SAMPLES = 2

    def __init__(self, client: Any, *, refresh: float = 30.0) -> None:
        self._client = client
        self.refresh = refresh
        self._offset = 0.0
        self._measured = float("-inf")
        self._lock = threading.Lock()

    def offset(self) -> float:
        with self._lock:
            if time.monotonic() - self._measured >= self.refresh:
                self._measure()
            return self._offset

    def _measure(self) -> None:
        samples = []
        try:
            for _ in range(self.SAMPLES):
                before = time.time()
                server = server_time(self._client)
                after = time.time()
                samples.append((after - before, server - (before + after) / 2))
        except Exception:  # noqa: BLE001 - Redis restarting: keep the last offset, try again soon
            self._measured = time.monotonic() - self.refresh + 1.0
            return
        self._offset = min(samples)[1]
        self._measured = time.monotonic()

    def now(self) -> float:
        return time.time() + self.offset()


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


def moment_id(timestamp: float) -> str:
    """A moment as an id's part, to the millisecond and ordered as the moments are:
    ``20261202T162512123``. Never 13 digits in a row: a millisecond count (1796226439810) passes the Luhn
    check one time in ten, and every text durapay writes or shows masks such a run as a card number
    (``workflows.engine.sensitive``), which would hide the id."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y%m%dT%H%M%S") + f"{int(timestamp * 1000) % 1000:03d}"
