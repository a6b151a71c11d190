"""Redis connection state for the loops that run forever: one line when Redis is lost, one when it is back.

Why: a loop that logs every failed attempt, with a traceback, turns a Redis restart into thousands of
lines (``durapay scheduler`` printed 1,290 lines with 46 tracebacks in 12 s) and buries the one fact an
operator needs. A :class:`RedisWatch` is told about each attempt (:meth:`~RedisWatch.failed` with the
error, :meth:`~RedisWatch.ok` after a success) and logs only the changes of state:

    scheduler: Redis unreachable (Error 111 connecting to 127.0.0.1:6379. Connection refused.); retrying every 0.5s
    scheduler: Redis is back after 12.4s (24 attempts failed)

Errors that are not about reaching Redis are not its business: :meth:`~RedisWatch.failed` returns
``False`` and the caller logs them as it would anyway (with a traceback: they are bugs). Used by the
dispatcher (``durapay scheduler``) and the worker's heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

#: Errors that mean "Redis cannot be reached right now" (restarting, loading its AOF, a failover in
#: progress, the network): waited out, never a defect. ``BusyLoadingError`` is a ``ConnectionError``.
REDIS_DOWN: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, OSError)


def is_redis_down(exc: BaseException) -> bool:
    return isinstance(exc, REDIS_DOWN)


class RedisWatch:
    """The state (up or lost since when) of one loop's connection to Redis, logged on each change."""

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        retry_every: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.log = log
        self.retry_every = retry_every
        self.clock = clock
        self.lost_since: float | None = None
        self.failures = 0

    @property
    def up(self) -> bool:
        return self.lost_since is None

    def failed(self, exc: BaseException) -> bool:
        """Note a failed attempt. True when ``exc`` means Redis is unreachable (logged once per outage);
        False for any other error, which the caller must report itself."""
        if not is_redis_down(exc):
            return False
        self.failures += 1
        if self.lost_since is None:
            self.lost_since = self.clock()
            self.log.warning("%s: Redis unreachable (%s); retrying every %gs", self.name, _one_line(exc), self.retry_every)
        else:
            self.log.debug("%s: Redis still unreachable (%s)", self.name, _one_line(exc))
        return True

    def ok(self) -> None:
        """Note a successful attempt: logs the end of an outage, if there was one."""
        if self.lost_since is None:
            return
        self.log.warning(
            "%s: Redis is back after %.1fs (%d attempts failed)", self.name, self.clock() - self.lost_since, self.failures
        )
        self.lost_since = None
        self.failures = 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
