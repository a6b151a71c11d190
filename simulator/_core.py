"""The simulator without its HTTP skin: state, clock, faults, notifier and timers, wired together.

:class:`Simulator` is what every handler receives. It owns the background parts (the timer thread that
sweeps expiries and completes pages by themselves, the notification sender) and the snapshot file, so
that the ASGI app (``_app``) stays a pure protocol layer and ``SimulatorServer`` a thin uvicorn wrapper.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from durapay.simulator import _build, _direct, _links
from durapay.simulator._clock import Clock
from durapay.simulator._config import SimulatorConfig
from durapay.simulator._faults import Faults
from durapay.simulator._notifier import Notifier
from durapay.simulator._pending import Pending
from durapay.simulator._records import OperationRecord, OrderRecord
from durapay.simulator._scheduler import Scheduler
from durapay.simulator._state import SimulatorState

log = logging.getLogger("simulator")
SAVE_INTERVAL_SECONDS = 2.0


class Simulator:
    """One simulated gateway. ``start()`` its background parts before serving; ``stop()`` after."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.clock = Clock()
        self.state = SimulatorState(self.clock, config.seed)
        self.faults = Faults(config)
        self.scheduler = Scheduler()
        self.notifier = Notifier(config, self.clock, self.faults, self.scheduler)
        #: ``pend`` rules, and the settling of the operations they answered PENDING.
        self.pending = Pending(self)
        self.auto_complete_ms = config.auto_complete_ms
        #: Gateway requests being served now (changed only on the event loop; ``/_sim/health`` shows it),
        #: and how many of them per operation name: a test sees that a call reached the gateway (and is
        #: held there by a latency or hang fault) before it has acted.
        self.in_flight = 0
        self.serving: Counter[str] = Counter()
        self._running = False

    def start(self) -> None:
        if self._running:
            return
        if self.config.state_file is not None and self.state.load(self.config.state_file):
            log.info("simulator state loaded from %s", self.config.state_file)
        self.scheduler.start()
        self.notifier.start()
        self.scheduler.call_every(self.config.sweep_interval_seconds, self.sweep)
        if self.config.state_file is not None:
            self.scheduler.call_every(SAVE_INTERVAL_SECONDS, self._save_if_dirty)
        self._running = True

    def stop(self) -> None:
        if not self._running:
            return
        self.scheduler.stop()
        self.notifier.stop()
        if self.config.state_file is not None:
            self.state.save(self.config.state_file)
        self._running = False

    def reset(self) -> None:
        """Forget everything: records, keys, scripts, notifications, faults, pend rules, clock offset."""
        with self.state.lock:
            self.state.reset()
            self.clock.reset()
            self.faults.clear()
            self.pending.clear()
            self.notifier.reset()
            self.auto_complete_ms = self.config.auto_complete_ms

    def notify(self, order: OrderRecord, op: OperationRecord, token: str) -> None:
        """Send the merchant a notification of ``op`` if the order's creation asked for them."""
        if order.notification_url:
            self.notifier.notify(order.notification_url, token, op.wire(), order.created_by)

    def auto_complete(self, job: Callable[[], None]) -> None:
        """Run ``job`` (a customer finishing a page) after ``auto_complete_ms``, if that switch is on."""
        if self.auto_complete_ms is None or not self._running:
            return
        self.scheduler.call_later(self.auto_complete_ms / 1000.0, job)

    def sweep(self) -> None:
        """Expire what the clock says is over: links past their date, build sessions past 5 minutes, hosted
        pages past their day; settle
        the PENDING operations whose ``settle_after`` has passed."""
        with self.state.lock:
            _links.expire_due(self)
            _build.expire_due(self)
            _direct.expire_pages(self)
            self.pending.settle_due()

    def _save_if_dirty(self) -> None:
        if self.config.state_file is not None and self.state.dirty:
            self.state.save(self.config.state_file)
