"""The dispatcher (``durapay scheduler``): sends what the ``due`` set says is due, forever.

Any number may run at once on any machines: taking due entries is atomic (``take_due.lua`` pushes
each taken entry back by a lease, so no other dispatcher sends it meanwhile; if this one dies before
sending, the entry comes due again). What it sends is a chain of the flow's remaining steps; a
duplicate delivery is harmless because every step claims before it acts.

Besides the due set, each tick runs the registered *tickers* (the schedules fire their occurrences
this way), writes a heartbeat for ``/readyz``, packs finished flows (``workflows.engine.compact``), sweeps the pauses of
flow kinds (``workflows.pauses``), trims the indexes of expired flows and the merchant events older than
their retention (``workflows.engine.trim``).
While Redis cannot be reached the loop keeps trying every interval and says so once (``RedisWatch``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from durapay.workflows.engine.api import Engine
from durapay.workflows.engine.compact import Compactor
from durapay.workflows.engine.redis_watch import RedisWatch, is_redis_down
from durapay.workflows.engine.trim import TRIM_INTERVAL, EventTrimmer, IndexTrimmer

log = logging.getLogger("durapay.dispatcher")

Ticker = Callable[[], int]
#: Seconds between two of the dispatcher's sweeps of the pauses (``Pauses.sweep``).
PAUSE_SWEEP_INTERVAL = 5.0


class Dispatcher:
    def __init__(
        self,
        engine: Engine,
        *,
        interval: float | None = None,
        tickers: list[Ticker] | None = None,
        name: str = "dispatcher",
    ) -> None:
        self.engine = engine
        self.interval = interval if interval is not None else engine.settings.engine.dispatch_interval
        self.tickers = list(tickers or [])
        self.name = name
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_trim = float("-inf")
        self._last_event_trim = float("-inf")
        self.trimmer = IndexTrimmer(engine.redis, engine.keys, engine.store.retention_seconds)
        self.event_trimmer = EventTrimmer(engine.redis, engine.keys, engine.settings.events.retention)
        self.compactor = Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder)
        self._last_pause_sweep = float("-inf")

    def tick(self) -> int:
        """One pass: fire tickers, send due flows. Returns how many flows were sent."""
        for ticker in self.tickers:
            try:
                ticker()
            except Exception as exc:  # one failing ticker must not stop dispatching
                if is_redis_down(exc):
                    raise  # nothing else can work either: run() waits Redis out
                log.exception("%s: ticker failed", self.name)
        sent = self.engine.dispatch_due()
        self.sent += sent
        now = self.engine.clock.now()
        heartbeat = self.engine.keys.heartbeat("scheduler")
        self.engine.redis.set(heartbeat, repr(now), ex=max(5, int(self.interval * 10)))
        self.compactor.run(now=now)
        if time.monotonic() - self._last_pause_sweep > PAUSE_SWEEP_INTERVAL:
            # Partitions' copies of the pauses kept true, and flows a resume left held released (bounded).
            self._last_pause_sweep = time.monotonic()
            try:
                self.engine.pauses.sweep()
            except Exception as exc:  # the next sweep repairs as much; dispatching goes on meanwhile
                if is_redis_down(exc):
                    raise
                log.exception("%s: the sweep of the pauses failed", self.name)
        if self.trimmer.backlog or time.monotonic() - self._last_trim > TRIM_INTERVAL:
            self._last_trim = time.monotonic()
            self.trimmer.run(now=now, kinds=self.engine.registry)
        if self.event_trimmer.backlog or time.monotonic() - self._last_event_trim > TRIM_INTERVAL:
            self._last_event_trim = time.monotonic()
            self.event_trimmer.run()
        return sent

    def run(self) -> None:
        """Tick until :meth:`stop`; a Redis outage is waited out, not fatal, and logged once."""
        watch = RedisWatch(self.name, log, self.interval)
        while not self._stop.is_set():
            try:
                sent = self.tick()
                watch.ok()
            except Exception as exc:
                if not watch.failed(exc):
                    log.exception("%s: tick failed; retrying", self.name)
                sent = 0
            if not sent:
                self._stop.wait(self.interval)

    def start(self) -> Dispatcher:
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
