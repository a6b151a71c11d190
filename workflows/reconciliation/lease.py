"""A running reconciliation's lease: how a report of a run whose process died reads as interrupted.

A report is kept as running from its start (``Reports.hold``), so that the API, the console and
``durapay reconcile --latest`` show the run that goes. A process killed mid-run (or that lost Redis)
never writes its end: without a lease its report would read as running for the whole retention, and
the API's 409 would name it. The lease is a key with a time to live, renewed by a thread of the run
every third of its length; once it lapses, ``Reports.get`` reads (and stores) the report as
interrupted, and a new run may start.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("durapay.reconcile")


class Lease:
    """A running report's lease (``<prefix>:reconcile:lease:<id>``), renewed by a thread of its own every
    third of its length until :meth:`end`: a run that dies (the process killed, Redis lost) stops
    renewing it, and its report then reads as interrupted (``Reports.get``). A run that stalls past
    its lease and comes back renews it again; its finished report replaces the interrupted one."""

    def __init__(self, client: Any, key: str, seconds: float) -> None:
        self.redis = client
        self.key = key
        self.seconds = seconds
        self.redis.set(key, "1", px=max(1, int(seconds * 1000)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="reconcile-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.redis.set(self.key, "1", px=max(1, int(self.seconds * 1000)))
            except RedisError as exc:  # the run meets the same and fails; or Redis comes back in time
                log.warning("reconciliation lease %s not renewed: %s", self.key, exc)

    def end(self) -> None:
        """Stop renewing and give the lease back (the run's report is saved finished or interrupted)."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.redis.delete(self.key)
        except RedisError as exc:
            log.warning("reconciliation lease %s not given back (it lapses by itself): %s", self.key, exc)
