"""The gateway's health, shared by every worker: circuit breaker, rate limiter and 429 hold in Redis.

Why shared: each worker meeting the gateway alone (its own backoff, its own rate) sent the whole backlog
of an outage into a gateway that was down, burned every flow's attempts on it, and after it, or at
09:00 when many charges fall due, arrived as one burst and came back as 429s. One gate per gateway
*terminal* (``default``, and each of ``DURAPAY_TERMINALS``: ``workflows.engine.terminals`` makes them) decides, for
every call of every worker, in ONE round trip (``engine/lua/gate.lua``, with Redis's clock, so that all
workers share one):

* **breaker**: closed; open until T after ``failures`` timeouts, 5xx answers or connection errors in a
  row within ``window_seconds`` (no call is sent: the step ends as ``Defer`` and its flow waits in
  ``retrying``, "gateway unavailable", without using an attempt); then half open: ONE probe call at a
  time (its lease bounded by the gateway's timeouts), whose success closes the breaker and whose
  failure opens it again;
* **limiter** (GCRA, ``rate_per_second`` with a ``burst``): the script answers the time of the
  caller's slot and reserves it; a slot within ``wait_seconds`` is waited for in the worker, a later
  one defers the flow to exactly that slot, which it then uses without queueing again (a deferred
  backlog comes back spread at the rate, not as a herd);
* **hold**: a 429's ``Retry-After`` holds every worker (no slot before it ends, the bucket empty then).

The happy path is one ``EVALSHA`` per gateway call: a success is reported (a second call) only when
the breaker had counted failures or the call was the probe. Most of a busy process's calls only read: it
takes its slots in shares and spends them for up to ``SHARE_SECONDS``, asking the script only whether the
breaker lets it call and no 429 hold came since; a write, which Redis makes durable before it answers (an
fsync with ``appendfsync always``, about 2 ms on this project's machine), comes once per share. A share
not spent in time is given up (the rate errs low, never high), so its size follows the process's own
recent spend (:class:`ShareSize`): one slot at first, doubled each time the share is spent within its
time (up to ``share``: a twentieth of a second's rate, a quarter of the burst), halved for each share's
time it was not. A fixed share of ten made every process take ten slots for its first call and throw
nine away: thirty processes making one call each emptied a burst of a hundred after the tenth, and a
fleet of twenty processes making one call a second held the gateway to twenty calls a second under a
limit of two hundred. Keys of one terminal share one hash slot
(a partition's tag), the same as the partition's merchant event stream, where the script writes
``gateway.unavailable`` and ``gateway.recovered`` with the change that causes them (Redis Cluster).

Why not the ``limits`` library: its Redis strategies (moving/fixed window, sliding window) answer
"allowed or not" (plus a reset time) from their own scripts, one round trip each; the breaker and the
hold would be a second and third round trip per call, and a refusal says nothing about *when* this
caller's turn is (no reservation), so a deferred backlog would come back together.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durapay.config.settings import DEFAULT_TERMINAL, GatewayHealthSettings, GatewaySettings
from durapay.gateway import GatewayError, RateLimited
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.redis_watch import REDIS_DOWN
from durapay.workflows.engine.scripts import source

log = logging.getLogger("durapay.gate")

#: Seconds past the gateway's own timeouts a probe keeps its lease (then another caller may probe).
PROBE_MARGIN_SECONDS = 5.0
#: Seconds a process may spend the share of slots it took (then what is left is given up).
SHARE_SECONDS = 1.0
#: Seconds a flow waits (before the engine's jitter) when Redis could not be asked before a call.
UNREACHABLE_SECONDS = 1.0


@dataclass(frozen=True)
class Admission:
    """The gate's answer to "may I call now": ``go``; or not before ``after`` seconds, because the breaker
    is open (``open``), the caller's reserved slot is then (``wait``, ``slot`` to pass back), or Redis
    could not be asked (``unreachable``: fail closed, no call)."""

    verdict: str
    after: float = 0.0
    report: bool = False
    slot: float | None = None


@dataclass(frozen=True)
class GateStatus:
    """What the console and ``/metrics`` show: the breaker's state and the gate's counters."""

    terminal: str
    state: str  # closed, open, half_open
    open_until: float | None
    opened: float | None
    failures: int
    counters: dict[str, int]


class Gate:
    """One terminal's gate. Thread safe (one script call per method)."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        settings: GatewayHealthSettings,
        gateway: GatewaySettings,
        *,
        terminal: str = DEFAULT_TERMINAL,
        now: Callable[[], float] | None = None,
    ) -> None:
        self.redis = client
        self.settings = settings
        self.terminal = terminal
        partition = keys.partition(f"gate:{terminal}")
        self.key = f"{keys.tag(partition)}:gate:{terminal}"
        self.stream = keys.events(partition)
        self.probe_lease = gateway.timeout + gateway.connect_timeout + PROBE_MARGIN_SECONDS
        #: The most slots a process takes at once (its share grows to it with its spend, ShareSize):
        #: a twentieth of a second's rate, at most a quarter of the burst.
        self.share = max(1, min(settings.burst // 4, int(settings.rate_per_second / 20)))
        #: Tests inject a time; otherwise the script reads Redis's TIME.
        self._now = now
        self._script = client.register_script(source("engine/lua/gate.lua"))
        self._lock = threading.Lock()
        self._size = ShareSize(self.share)
        self._held = 0  # slots of this process's share not spent yet
        self._held_until = 0.0  # (monotonic) when they are given up
        self._pid = os.getpid()

    @property
    def wait_seconds(self) -> float:
        return self.settings.wait_seconds

    def _call(self, what: str, extra: str = "", want: int = 0) -> list[str]:
        s = self.settings
        rate = s.rate_per_second if s.limiter else 0
        now = repr(self._now()) if self._now is not None else ""
        args = [
            what,
            s.failures,
            s.window_seconds,
            s.open_seconds,
            rate,
            s.burst,
            self.probe_lease,
            self.terminal,
            extra,
            now,
            want,
        ]
        reply = self._script(keys=[self.key, self.stream], args=args)
        return [item.decode() if isinstance(item, bytes) else str(item) for item in reply]

    def _spend(self) -> int:
        """Spend one slot of this process's share if it holds one still in time (0); else the number of
        slots to ask the script for, the share's size after what the last share showed of the spend."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child does not spend its parent's share
                self._pid, self._held, self._size = os.getpid(), 0, ShareSize(self.share)
            now = time.monotonic()
            if self._held > 0 and now < self._held_until:
                self._held -= 1
                return 0
            self._held = 0
            return self._size.next(now, self._held_until)

    def _keep(self, granted: int) -> None:
        with self._lock:
            self._held = max(0, granted - 1)  # the first is this call's
            self._held_until = time.monotonic() + SHARE_SECONDS

    def take(self, reservation: float | None = None) -> Admission:
        """May a call go now? Takes a limiter slot (or uses ``reservation``, the slot reserved earlier).

        Fails closed: when Redis cannot be asked (lost, or its writes paused: ``CLIENT PAUSE WRITE`` is
        how a failover stops the old primary, and the script may write), the answer is ``unreachable``
        and no call goes: an answer then could not be recorded either (docs/durability.md, "Gateway
        health"). Never an exception, which a step would take for a defect of its own."""
        try:
            return self._take(reservation)
        except REDIS_DOWN as exc:
            log.warning("gateway gate %s: Redis unreachable before a call, none sent: %s", self.terminal, exc)
            return Admission("unreachable", UNREACHABLE_SECONDS)

    def _take(self, reservation: float | None) -> Admission:
        extra = "" if reservation is None else f"{reservation:.6f}"
        want = self._spend() if reservation is None else 1
        reply = self._call("take", extra, want)
        if reply[0] == "void":  # a 429's hold came since the share was taken
            with self._lock:
                self._held = 0
            reply = self._call("take", "", 1)
        verdict = reply[0]
        if verdict == "go":
            if int(reply[4]) > 0:
                self._keep(int(reply[4]))
            return Admission("go", report=reply[3] == "1")
        until = float(reply[1])
        after = max(0.0, until - float(reply[2]))
        if verdict == "open":
            return Admission("open", min(after, self.settings.open_seconds + self.probe_lease))
        return Admission("wait", after, slot=until)

    def _script_now(self) -> float:
        if self._now is not None:
            return self._now()
        seconds, micros = self.redis.time()
        return float(seconds) + float(micros) / 1_000_000

    def failed(self, error: GatewayError) -> float | None:
        """Count a health failure; seconds until the breaker lets a call through if it is now open."""
        reply = self._told("fail", json.dumps(_summary(error), separators=(",", ":")))
        if reply is None or reply[0] != "open":
            return None
        return max(0.0, float(reply[1]) - float(reply[2]))

    def succeeded(self) -> None:
        """The gateway answered: failures forgotten, the breaker closed (``gateway.recovered`` if it was open)."""
        self._told("ok")

    def limited(self, error: RateLimited) -> Admission | None:
        """A 429: hold every worker for its Retry-After; the limited caller's fresh slot (None: no limiter)."""
        retry_after = error.retry_after
        reply = self._told("limited", "" if retry_after is None else repr(float(retry_after)))
        if reply is None or not self.settings.limiter:
            return None
        until = float(reply[1])
        return Admission("wait", max(0.0, until - float(reply[2])), slot=until)

    def _told(self, what: str, extra: str = "") -> list[str] | None:
        """Tell the gate what a call met; None when Redis could not be told. The call's answer matters more
        than the breaker's bookkeeping: losing it to a Redis error would stop a flow whose gateway answered
        for a person (an unexpected error), so the report is dropped (logged) and the step goes on."""
        try:
            return self._call(what, extra)
        except REDIS_DOWN as exc:
            log.warning("gateway gate %s: Redis unreachable, %r not counted: %s", self.terminal, what, exc)
            return None

    def status(self) -> GateStatus:
        """The breaker's state by Redis's clock, and the counters (deferred calls, 429s, limiter waits...)."""
        raw = {
            k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in self.redis.hgetall(self.key).items()
        }
        now = self._script_now()
        open_until = float(raw["open_until"]) if raw.get("open_until") else None
        state = "closed" if open_until is None else "open" if now < open_until else "half_open"
        counters = {name: int(raw.get(name, 0)) for name in ("deferred", "limited", "waits", "opened_total", "probes")}
        return GateStatus(
            self.terminal,
            state,
            open_until,
            float(raw["opened"]) if raw.get("opened") else None,
            int(raw.get("fails", 0)),
            counters,
        )


class ShareSize:
    """How many slots a process takes at once, from its own recent spend (not thread safe: the gate's lock).

    A quiet process takes one slot per call (a write each, nothing thrown away); a busy one that spends its
    share before the share's time ends takes twice as many the next time, up to ``most``, so its writes are
    amortised; each share's time that ends with the process not asking again halves it (a share given up
    unspent, or a pause in its calls), so a process gone quiet soon takes one slot again."""

    def __init__(self, most: int) -> None:
        self.most = max(1, most)
        self.size = 1

    def next(self, now: float, until: float) -> int:
        """The size of the share to take at ``now`` (monotonic), the last one's time ending at ``until``."""
        if now < until:  # the last share was spent within its time: the process spends faster than it takes
            self.size = min(self.most, self.size * 2)
        elif until > 0:
            idle = 1 + min(32, int((now - until) / SHARE_SECONDS))  # shares' times it did not need one
            self.size = max(1, self.size >> idle)
        return self.size


def _summary(error: GatewayError) -> dict[str, Any]:
    """What ``gateway.unavailable`` tells of the error that opened the breaker (no body, no card)."""
    return {"type": type(error).__name__, "status": error.status_code, "message": str(error)[:200], "at": time.time()}
