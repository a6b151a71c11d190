"""A small timer thread: run a callable after a delay (real time), or every interval.

Why a thread of our own rather than the event loop: the jobs (auto-completing a page, sweeping expiries,
starting a notification attempt) take the state's threading lock and must run whether or not requests
arrive, also while uvicorn shuts down. A job that raises is logged and does not stop the others.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("simulator")

Job = Callable[[], None]


class Scheduler:
    def __init__(self, name: str = "simulator-scheduler") -> None:
        self._name = name
        self._heap: list[tuple[float, int, Job, float | None]] = []
        self._sequence = itertools.count()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._wake:
            self._stopping = True
            self._heap.clear()
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def call_later(self, delay_seconds: float, job: Job) -> None:
        self._push(time.monotonic() + max(0.0, delay_seconds), job, None)

    def call_every(self, interval_seconds: float, job: Job) -> None:
        self._push(time.monotonic() + interval_seconds, job, interval_seconds)

    def _push(self, due: float, job: Job, interval: float | None) -> None:
        with self._wake:
            if self._stopping:
                return
            heapq.heappush(self._heap, (due, next(self._sequence), job, interval))
            self._wake.notify_all()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(timeout)
                if self._stopping:
                    return
                _, _, job, interval = heapq.heappop(self._heap)
                if interval is not None:
                    heapq.heappush(self._heap, (time.monotonic() + interval, next(self._sequence), job, interval))
            try:
                job()
            except Exception:
                log.exception("simulator background job failed")
