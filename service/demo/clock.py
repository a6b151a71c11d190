"""A clock shared by every process of the demo: real time plus an offset kept in Redis.

Why: the demo fast-forwards time (a delayed charge two days ahead, a schedule over three months) while
its workers run in other processes. The engine compares due times with "now" in every process that
claims a step, so they must all agree on "now". Each process reads the offset from one Redis key
(cached for ``refresh`` seconds); :meth:`SharedClock.advance` moves it for all of them. The offset only
grows, so a second demo on the same data folder never sees time go backwards.
"""

from __future__ import annotations

import threading
import time

import redis


class SharedClock:
    """``now()`` = ``time.time()`` + the offset stored at ``key`` (seconds, a float)."""

    def __init__(self, redis_url: str, key: str, *, refresh: float = 0.05) -> None:
        self.key = key
        self.refresh = refresh
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
        self._lock = threading.Lock()
        self._offset = 0.0
        self._read_at = float("-inf")

    def offset(self) -> float:
        with self._lock:
            if time.monotonic() - self._read_at > self.refresh:
                try:
                    raw = self._redis.get(self.key)
                    self._offset = float(raw) if raw else 0.0
                    self._read_at = time.monotonic()
                except redis.RedisError:
                    pass  # keep the last known offset while Redis restarts
            return self._offset

    def now(self) -> float:
        return time.time() + self.offset()

    def advance(self, seconds: float) -> float:
        """Move every process's "now" forward by ``seconds``; returns the new now."""
        if seconds < 0:
            raise ValueError("the demo clock only moves forward")
        value = float(self._redis.incrbyfloat(self.key, seconds))
        with self._lock:
            self._offset = value
            self._read_at = time.monotonic()
        return time.time() + value

    def close(self) -> None:
        self._redis.close()
