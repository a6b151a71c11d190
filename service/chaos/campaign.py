"""The chaos campaign: what breaks and when, drawn from the seed, and a thread that breaks it on time.

Events over the run's window: SIGKILL a worker (a new one starts in its place), SIGKILL the scheduler
(started again after a pause), restart Redis (SIGKILL and start from its AOF; with
``--lose-last-writes`` the AOF's unsynced tail is cut first, :mod:`service.chaos.aof`), and turn on a
gateway fault at the simulator: commit-then-fail (an error or a dropped connection after the gateway
acted), a hang past the client's timeout (with or without acting), a 5xx, a 429 with ``Retry-After``,
or a latency past the timeout. A fault rule applies to the next one to three matching requests.

PENDING outcomes (:func:`plan_pending`, from a generator of their own): a rule at the simulator makes the
next one or two requests to a money operation of the mix answer ``PENDING``; each settles (approved
mostly, sometimes declined) a few seconds later by the simulator's clock, or when the run settles it at
a drawn moment. Whatever is still held when the campaign ends is settled then, as the faults are cleared.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from durapay.service.chaos.aof import Cut
from durapay.service.chaos.stack import GATEWAY_TIMEOUT, LATEST_ACT_SECONDS, ChaosStack
from durapay.service.chaos.workload import OPERATIONS
from durapay.simulator import SimulatorAdminError

log = logging.getLogger("durapay.chaos")

WORKER_KILL, SCHEDULER_KILL, REDIS_RESTART, FAULT = "kill_worker", "kill_scheduler", "restart_redis", "fault"
PEND, SETTLE = "pend", "settle"
#: The operations of the mix (``workload.OPERATIONS``) the simulator can answer PENDING (its ``PENDABLE``).
PENDING_OPERATIONS = (
    "create_moto_order",
    "card_verification",
    "wallet_pay",
    "svs_pay_operation",
    "three_steps_payment",
    "create_mit_order",
    "refund_operation",
    "capture_operation",
    "create_no_show",
    "create_incremental",
    "create_delay_charge",
)
#: Never settled declined: the schedule charges through ``create_mit_order`` (a decline starts its dunning,
#: days long) and its contract is made by a ``three_steps_payment`` (a decline leaves it without one).
APPROVED_ONLY = frozenset({"create_mit_order", "three_steps_payment"})
#: A rule the run settles still settles by the simulator's clock this long after an operation it held:
#: one made after the run's ``settle`` event does not wait for the campaign's end.
BACKSTOP = 30.0
#: The ISO codes a declined PENDING settles with (soft and hard).
DECLINES = ("116", "100", "101")


@dataclass(frozen=True)
class Event:
    at: float
    what: str
    detail: dict[str, Any] = field(default_factory=dict)


def fault_rule(rng: random.Random) -> dict[str, Any]:
    """One gateway fault, aimed at one operation of the mix (or at any request)."""
    operation = rng.choice([*OPERATIONS, None])
    count = rng.randint(1, 3)
    kind = rng.choice(["commit_then_fail", "commit_then_drop", "hang", "hang_commit", "5xx", "429", "latency"])
    rule: dict[str, Any]
    if kind == "commit_then_fail":
        rule = {"mode": "commit_then_fail", "status": rng.choice([500, 502, 503])}
    elif kind == "commit_then_drop":
        rule = {"mode": "commit_then_fail", "drop": True}
    elif kind in ("hang", "hang_commit"):
        rule = {"mode": "hang", "seconds": GATEWAY_TIMEOUT + 1.5, "commit": kind == "hang_commit"}
    elif kind == "5xx":
        rule = {"mode": "error", "status": rng.choice([500, 502, 503])}
    elif kind == "429":
        rule = {"mode": "error", "status": 429, "retry_after": rng.randint(1, 3)}
    else:
        rule = {"mode": "latency", "latency_ms": int(LATEST_ACT_SECONDS * 1000)}
    if operation is not None:
        rule["operation"] = operation
    return {**rule, "count": count}


def plan(rng: random.Random, duration: float, *, redis_restarts: bool) -> list[Event]:
    """The campaign over ``duration`` seconds: events between 10% and 85% of it, in time order."""
    counts = {
        WORKER_KILL: max(2, int(duration // 20)),
        SCHEDULER_KILL: max(1, int(duration // 60)),
        REDIS_RESTART: max(2, int(duration // 60)) if redis_restarts else 0,
        FAULT: max(4, int(duration // 6)),
    }
    events = []
    for what, count in counts.items():
        for _ in range(count):
            at = rng.uniform(0.1 * duration, 0.85 * duration)
            detail: dict[str, Any] = {}
            if what == WORKER_KILL:
                detail = {"worker": rng.randrange(1000)}
            elif what == SCHEDULER_KILL:
                detail = {"pause": round(rng.uniform(0.2, 3.0), 2)}
            elif what == REDIS_RESTART:
                detail = {"cut_seed": rng.randrange(2**32)}
            else:
                detail = {"rule": fault_rule(rng)}
            events.append(Event(at, what, detail))
    return sorted(events, key=lambda event: event.at)


def plan_pending(rng: random.Random, duration: float) -> list[Event]:
    """PENDING outcomes over ``duration``: ``pend`` rules between 10% and 70% of it, each settled by the
    simulator's clock 2-8 s after its operation was made, or by the run 3-15 s after the rule (a ``settle``
    event, by 85% at the latest; an operation the rule holds only after that settles by the clock after
    :data:`BACKSTOP`). ``rng`` is theirs alone, so the rest of the campaign draws as before."""
    events = []
    for _ in range(max(2, int(duration // 30))):
        at = rng.uniform(0.1 * duration, 0.7 * duration)
        operation = rng.choice(PENDING_OPERATIONS)
        approve = operation in APPROVED_ONLY or rng.random() < 0.75
        final = "000" if approve else rng.choice(DECLINES)
        by_clock = rng.random() < 0.5
        settle_after = round(rng.uniform(2.0, 8.0), 1) if by_clock else BACKSTOP
        rule = {"operation": operation, "count": rng.randint(1, 2), "final": final, "settle_after": settle_after}
        events.append(Event(at, PEND, {"rule": rule}))
        if not by_clock:
            settle_at = min(at + rng.uniform(3.0, 15.0), 0.85 * duration)
            events.append(Event(settle_at, SETTLE, {"operation": operation}))
    return sorted(events, key=lambda event: event.at)


def lowest_or_any(rng: random.Random, low: int, high: int) -> int:
    """Where a crash cuts the AOF: half the time at the last fsync (losing all it may), else anywhere after."""
    return low if rng.random() < 0.5 else rng.randint(low, high)


class Campaign(threading.Thread):
    """Runs the events on time against ``stack``; counts what it did; ``last_at`` is when the last ended."""

    def __init__(self, stack: ChaosStack, events: list[Event], began: float, *, lose_last_writes: bool) -> None:
        super().__init__(name="chaos-campaign", daemon=True)
        self.stack = stack
        self.events = events
        self.began = began
        self.lose_last_writes = lose_last_writes
        self.done: dict[str, int] = {WORKER_KILL: 0, SCHEDULER_KILL: 0, REDIS_RESTART: 0, FAULT: 0, PEND: 0, SETTLE: 0}
        #: The PENDING operations the run settled itself (at ``settle`` events).
        self.settled: list[str] = []
        self.cuts: list[Cut] = []
        self.problems: list[str] = []
        self.last_at = began
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        for event in self.events:
            wait = self.began + event.at - time.monotonic()
            if wait > 0 and self._halt.wait(wait):
                return
            try:
                self._apply(event)
            except Exception as exc:  # noqa: BLE001 - a campaign step that fails is reported, the run goes on
                self.problems.append(f"{event.what} at {event.at:.1f}s: {exc}")
                log.warning("chaos event %s failed: %s", event.what, exc)
            self.last_at = time.monotonic()

    def _apply(self, event: Event) -> None:
        if event.what == WORKER_KILL:
            self.stack.kill_worker(event.detail["worker"])
        elif event.what == SCHEDULER_KILL:
            self.stack.kill_scheduler(event.detail["pause"])
        elif event.what == REDIS_RESTART:
            cut_rng = random.Random(event.detail["cut_seed"])
            draw = (lambda low, high: lowest_or_any(cut_rng, low, high)) if self.lose_last_writes else None
            cut = self.stack.restart_redis(draw)
            if cut is not None:
                self.cuts.append(cut)
        elif event.what == PEND:
            self.stack.admin().pend(**event.detail["rule"])
        elif event.what == SETTLE:
            self.settled.extend(settle_held(self.stack.admin(), event.detail["operation"]))
        else:
            self.stack.admin().set_faults(**event.detail["rule"])
        self.done[event.what] += 1


def settle_held(admin: Any, operation: str) -> list[str]:
    """Settle the operations held PENDING for the run (``settle_after`` the :data:`BACKSTOP`) of
    ``operation``; the ids settled."""
    settled = []
    for held in admin.pending()["operations"]:
        if held["operation"] != operation or held["settleAfter"] != BACKSTOP:
            continue
        with contextlib.suppress(SimulatorAdminError):  # settled meanwhile by the simulator's clock
            settled.extend(admin.settle_pending(held["operationId"]))
    return settled
