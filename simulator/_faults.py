"""Fault injection: latency, error answers, hangs, commit-then-fail, dropped connections, notification faults.

Set at start (``latency_ms``, ``seed``) and changed at run time through ``/_sim/faults``. A rule can be
scoped to one catalogue operation and to the next ``count`` matching requests, and fire with a
probability ``rate``; the random draws come from one generator seeded with the simulator's seed, so a
run with the same seed and the same request order injects the same faults.

Rule modes (``{"mode": ..., "operation": ..., "count": ..., "rate": ...}``):

==================== ===================================================================================
``error``            answer ``status`` (500, 503, 429 with ``Retry-After: retry_after``...) without acting
``drop``             close the connection without an answer, without acting
``hang``             sleep ``seconds`` (past the client's timeout); ``commit: true`` acts first
``commit_then_fail`` act and store the answer for idempotent replay, then answer ``status`` (500) or,
                     with ``drop: true``, close the connection without an answer
``late``             answer ``status`` (500) or, with ``drop: true``, close the connection, without acting
                     *yet*: the request is kept and acts when ``POST /_sim/faults/release`` says (a
                     request that reached the gateway after its client gave up; a key it carries is
                     claimed only then, so a retry that came first is not repeated by it)
``latency``          add ``latency_ms`` (+ random ``jitter_ms``) to matching requests
``throttle``         the gateway's own rate limit: matching requests beyond ``per_second`` (a bucket of
                     ``burst``) are answered 429 with ``Retry-After: retry_after``, without acting
``notify_drop``      never deliver the notification
``notify_delay``     deliver it ``delay_ms`` late
``notify_duplicate`` deliver it twice (same ``eventId``)
``notify_wrong_token`` deliver it with a security token that is not the order's
==================== ===================================================================================
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from durapay.gateway import BY_NAME, describe_validation_error
from durapay.simulator._config import SimulatorConfig

Mode = Literal[
    "error",
    "drop",
    "hang",
    "commit_then_fail",
    "late",
    "latency",
    "throttle",
    "notify_drop",
    "notify_delay",
    "notify_duplicate",
    "notify_wrong_token",
]
REQUEST_MODES = frozenset({"error", "drop", "hang", "commit_then_fail", "late"})
NOTIFY_MODES = frozenset({"notify_drop", "notify_delay", "notify_duplicate", "notify_wrong_token"})


class FaultRule(BaseModel):
    """One rule as posted to ``/_sim/faults``; unknown keys are refused so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode
    operation: str | None = None
    #: Only calls made with this terminal's key (``SimulatorConfig.terminal_keys``; None: every call).
    terminal: str | None = None
    count: int | None = Field(default=None, ge=1)
    rate: float = Field(default=1.0, ge=0.0, le=1.0)
    status: int | None = Field(default=None, ge=400, le=599)
    retry_after: int = Field(default=1, ge=0)
    seconds: float = Field(default=30.0, gt=0)
    commit: bool = False
    drop: bool = False
    latency_ms: int = Field(default=0, ge=0)
    jitter_ms: int = Field(default=0, ge=0)
    delay_ms: int = Field(default=1000, ge=0)
    per_second: float = Field(default=10.0, gt=0)
    burst: int = Field(default=10, ge=1)

    @model_validator(mode="after")
    def _check(self) -> FaultRule:
        if self.operation is not None and self.operation not in BY_NAME and self.mode not in NOTIFY_MODES:
            raise ValueError(f"operation {self.operation!r} is not a catalogue operation name")
        return self

    @property
    def answer_status(self) -> int:
        return self.status or 500


class FaultsError(ValueError):
    """A refused ``/_sim/faults`` body; the message names the field."""


@dataclass
class _Active:
    rule: FaultRule
    remaining: int | None
    fired: int = 0
    #: A ``throttle`` rule's bucket: tokens left, and when they were counted (monotonic seconds).
    tokens: float | None = None
    counted: float = 0.0

    def over_rate(self) -> bool:
        """A ``throttle`` rule: whether this request finds the bucket empty (else it takes a token)."""
        now = time.monotonic()
        rule = self.rule
        tokens = (
            float(rule.burst)
            if self.tokens is None
            else min(float(rule.burst), self.tokens + (now - self.counted) * rule.per_second)
        )
        self.counted = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return False
        self.tokens = tokens
        return True

    def describe(self) -> dict[str, Any]:
        return {**self.rule.model_dump(exclude_defaults=True), "remaining": self.remaining, "fired": self.fired}


@dataclass(frozen=True)
class RequestFaults:
    """What to do to one API request: extra latency, and at most one failure rule."""

    latency_seconds: float
    action: FaultRule | None


@dataclass(frozen=True)
class NotifyFaults:
    drop: bool = False
    delay_seconds: float = 0.0
    duplicate: bool = False
    wrong_token: bool = False


class Faults:
    """The fault settings of one simulator. Thread-safe."""

    def __init__(self, config: SimulatorConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        """Back to the start-up settings: the configured latency, no rules, the configured seed."""
        with self._lock:
            self._latency_ms = self._config.latency_ms
            self._jitter_ms = self._config.latency_jitter_ms
            self._rules: list[_Active] = []
            #: Requests answered as failed by a ``late`` rule, to act when released (oldest first).
            self._late: list[Callable[[], Awaitable[int]]] = []
            self._seed = self._config.seed
            self._rng = random.Random(self._seed)

    def update(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Apply a ``/_sim/faults`` body: one rule (has ``mode``), ``rules``, ``latency_ms``, ``latency_jitter_ms``, ``seed``."""
        if not isinstance(payload, dict):
            raise FaultsError("body must be a JSON object")
        # With a "mode" the body is one rule, and its latency_ms belongs to that rule (mode "latency");
        # without one, latency_ms and latency_jitter_ms set the latency of every request.
        global_keys = ("seed",) if "mode" in payload else ("latency_ms", "latency_jitter_ms", "seed")
        settings = {key: payload[key] for key in global_keys if key in payload}
        rule_items = list(payload.get("rules") or [])
        if "mode" in payload:
            rule_items.append({k: v for k, v in payload.items() if k not in settings and k != "rules"})
        elif set(payload) - set(settings) - {"rules"}:
            unknown = sorted(set(payload) - set(settings) - {"rules"})
            raise FaultsError(f"unknown keys {unknown}: give a rule with 'mode', 'rules', 'latency_ms' or 'seed'")
        for name, value in settings.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FaultsError(f"{name}: must be a non-negative integer")
        rules = []
        for index, item in enumerate(rule_items):
            try:
                rules.append(FaultRule.model_validate(item))
            except ValidationError as exc:
                where, reason = describe_validation_error(exc)
                raise FaultsError(f"rule {index}: {where}: {reason}") from None
        with self._lock:
            self._latency_ms = settings.get("latency_ms", self._latency_ms)
            self._jitter_ms = settings.get("latency_jitter_ms", self._jitter_ms)
            if "seed" in settings:
                self._seed = settings["seed"]
                self._rng = random.Random(self._seed)
            self._rules.extend(_Active(rule, rule.count) for rule in rules)
        return self.describe()

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "latency_ms": self._latency_ms,
                "latency_jitter_ms": self._jitter_ms,
                "seed": self._seed,
                "rules": [active.describe() for active in self._rules],
                "late": len(self._late),
            }

    def hold_late(self, act: Callable[[], Awaitable[int]]) -> None:
        """Keep a request a ``late`` rule answered as failed; ``act`` runs it and gives its status."""
        with self._lock:
            self._late.append(act)

    def take_late(self) -> list[Callable[[], Awaitable[int]]]:
        """The held requests, oldest first, handed over once (``POST /_sim/faults/release`` runs them)."""
        with self._lock:
            late, self._late = self._late, []
        return late

    def _fires(self, active: _Active, operation: str, terminal: str | None = None) -> bool:
        """Whether ``active`` applies to this request; consumes one of its ``count`` when it does."""
        if active.rule.operation is not None and active.rule.operation != operation:
            return False
        if active.rule.terminal is not None and terminal is not None and active.rule.terminal != terminal:
            return False
        if active.remaining is not None and active.remaining <= 0:
            return False
        if active.rule.rate < 1.0 and self._rng.random() >= active.rule.rate:
            return False
        active.fired += 1
        if active.remaining is not None:
            active.remaining -= 1
        return True

    def for_request(self, operation: str, terminal: str = "default") -> RequestFaults:
        with self._lock:
            latency_ms = float(self._latency_ms)
            if self._jitter_ms:
                latency_ms += self._rng.uniform(0, self._jitter_ms)
            action = None
            for active in self._rules:
                mode = active.rule.mode
                if mode == "latency" and self._fires(active, operation, terminal):
                    latency_ms += active.rule.latency_ms
                    if active.rule.jitter_ms:
                        latency_ms += self._rng.uniform(0, active.rule.jitter_ms)
                elif mode == "throttle" and action is None and self._fires(active, operation, terminal):
                    if active.over_rate():
                        action = active.rule.model_copy(update={"mode": "error", "status": 429})
                    else:
                        active.fired -= 1  # within the rate: not a fault, and no use of its count
                        if active.remaining is not None:
                            active.remaining += 1
                elif mode in REQUEST_MODES and action is None and self._fires(active, operation, terminal):
                    action = active.rule
            return RequestFaults(latency_seconds=latency_ms / 1000.0, action=action)

    def for_notification(self, operation: str) -> NotifyFaults:
        """Notification faults for one event of an order created by ``operation``."""
        found: dict[str, FaultRule] = {}
        with self._lock:
            for active in self._rules:
                mode = active.rule.mode
                if mode in NOTIFY_MODES and mode not in found and self._fires(active, operation):
                    found[mode] = active.rule
        delay = found.get("notify_delay")
        return NotifyFaults(
            drop="notify_drop" in found,
            delay_seconds=(delay.delay_ms / 1000.0) if delay else 0.0,
            duplicate="notify_duplicate" in found,
            wrong_token="notify_wrong_token" in found,
        )
