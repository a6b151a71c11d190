"""Technical retry policy: exponential backoff with full jitter, and what each gateway error means.

One retry layer per kind of failure (docs/durability.md, Technical retries): the gateway client never retries; this policy decides
for one step's technical failures (seconds to minutes). Business retries after soft declines (days)
are the schedules' dunning policy, not this.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from durapay.config.settings import RetrySettings
from durapay.gateway import BadRequest, GatewayError, GatewayOperation, RequestInvalid, Unauthorized
from durapay.tasks.outcomes import Attention, Finish, Outcome, Retry


@dataclass
class RetryPolicy:
    """``delay(n)`` = uniform(0, min(cap, base * 2**n)) ("full jitter"); at most ``max_attempts`` tries."""

    base_seconds: float = 1.0
    cap_seconds: float = 300.0
    max_attempts: int = 8
    reconcile_attempts: int = 6
    #: Seconds after a call whose answer was lost during which the gateway may still act on it (a
    #: request still queued or in flight there when its client gave up).
    late_seconds: float = 120.0
    #: The shortest pause between two reads of something still open after its deadline (``workflows.flows.waits.pace``).
    read_pace_seconds: float = 300.0
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def from_settings(cls, settings: RetrySettings, rng: random.Random | None = None) -> RetryPolicy:
        return cls(
            base_seconds=settings.base_seconds,
            cap_seconds=settings.cap_seconds,
            max_attempts=settings.max_attempts,
            reconcile_attempts=settings.reconcile_attempts,
            late_seconds=settings.late_seconds,
            read_pace_seconds=settings.read_pace_seconds,
            rng=rng or random.Random(),
        )

    def delay(self, attempt: int, hint: float | None = None) -> float:
        """Seconds before try ``attempt + 1`` (``attempt`` counts from 1); never below the gateway's hint."""
        doublings = max(0, attempt - 1)
        # Past 2**64 the cap has long been reached: never raise a float to a power it cannot hold.
        ceiling = self.cap_seconds if doublings >= 64 else min(self.cap_seconds, self.base_seconds * (2**doublings))
        chosen = self.rng.uniform(0, ceiling)
        return max(chosen, hint or 0.0)

    def on_error(self, error: GatewayError, op: GatewayOperation[Any], attempt: int, *, resend: bool) -> Outcome:
        """The outcome of a step whose gateway call raised ``error`` on try number ``attempt``.

        ``resend`` is true when this try repeated a call whose earlier outcome was ambiguous: a 400 then
        may mean "already done" (e.g. the orderId now exists), so the flow reconciles instead of failing.
        """
        record = error.to_dict()
        if isinstance(error, Unauthorized):
            return Attention("the gateway refused the API key (401): fix DURAPAY_GATEWAY__API_KEY, then retry", record)
        if isinstance(error, RequestInvalid):
            return Finish(False, f"request refused before sending: {error.field}: {error.reason}", error=record)
        if isinstance(error, BadRequest) and resend and not op.retry_safe:
            if attempt >= self.reconcile_attempts:
                return Attention("a resend after an ambiguous failure was refused; state unclear", record)
            return Retry(self.delay(attempt), record, reconcile=True)
        if not error.retryable and error.ambiguous:
            # An answer we cannot read (an unexpected status): the gateway may have acted. Read it back
            # for a call that is not safe to repeat; past that, or for a read, only a person can judge.
            if not op.retry_safe and attempt < self.reconcile_attempts:
                return Retry(self.delay(attempt), record, reconcile=True)
            return Attention(f"{op.name}: the gateway answered {error.message}; it may have taken effect", record)
        if not error.retryable:
            return Finish(False, f"the gateway refused {op.name}: {error.message}", error=record)
        must_reconcile = error.ambiguous and not op.retry_safe
        if attempt >= self.max_attempts:
            if error.ambiguous:
                # A timeout is not a failure: the gateway may have acted, so only a person may say "failed".
                return Attention(f"{op.name} failed {attempt} times and may have taken effect", record)
            return Finish(False, f"{op.name} failed {attempt} times: {error.message}", error=record)
        hint = getattr(error, "retry_after", None)
        return Retry(self.delay(attempt, hint), record, reconcile=must_reconcile)
