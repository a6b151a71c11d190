"""Slowing the guessing of keys: failed authentications counted per client address and per key prefix.

Why: every protected route and the console's sign-in compare a presented key in constant time, but
nothing bounded how many keys one client could try; 100 wrong keys in a row were answered 401 at full
speed. Now each failure (a key presented and wrong, at the API's gate or the console's sign-in) adds one
to two counters in Redis, so every API process shares them:

* one per client address (what uvicorn gives as the client: behind a proxy, the address in
  ``X-Forwarded-For`` when the proxy is trusted with ``--forwarded-allow-ips``/``FORWARDED_ALLOW_IPS``,
  see docs/security.md), and
* one per key prefix (the first ``DURAPAY_API__AUTH_PREFIX_CHARS`` characters of the presented key, kept
  as a hash): guesses of one key spread over many addresses share it.

Each counter lives ``DURAPAY_API__AUTH_WINDOW_SECONDS`` from its first failure (a fixed window), counted
and given its end in one script (:data:`COUNT`): a ``SET NX`` then an ``INCR`` let the counter expire
between the two, and the ``INCR`` then made one with no end, a lockout for ever (issue 37). A counter
found without an end (left so by an older version) gets one, at the next failure or refusal. Before
the key is compared, a request whose address or prefix has ``DURAPAY_API__AUTH_FAILURES`` failures in
its window is answered 429 with ``Retry-After`` (the seconds left in that window), even when its key
is right: the right key does not help a guesser who found it inside a blocked window. A refusal does
not add to the counters (the window ends when it ends). A request without a key is not a guess.

Redis unreachable: the check lets the request through to the key comparison (refusing every request
would turn a Redis outage into a lockout of the API's own operators); the data routes answer 503 anyway.

Metrics (``service.metrics``): ``durapay_auth_failures_total`` and ``durapay_auth_refusals_total``.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from typing import Any

import redis

from durapay.workflows.engine import Keys, ScriptPipeline, register

log = logging.getLogger("durapay.auth")

#: Counter names (``engine.keys.counter``) of the two metrics.
FAILURES = "auth_failures"
REFUSALS = "auth_refusals"

#: Count one failure: the counter and its end in one step (KEYS: the counter; ARGV: the window in ms). The
#: window starts at the first failure; a counter without an end (PTTL -1) is given one.
COUNT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return count
"""


@dataclass(frozen=True)
class Limits:
    """How many failures (``failures``) within how long (``window``, seconds), per address and per
    prefix of ``prefix_chars`` characters."""

    failures: int
    window: float
    prefix_chars: int


class Throttle:
    """``blocked(address, key)`` before the comparison, ``failed(address, key)`` after a wrong key."""

    def __init__(self, client: Any, keys: Keys, limits: Limits) -> None:
        self.redis = client
        self.prefix = keys.prefix
        self.keys = keys
        self.limits = limits
        self._count = register(client, "service/throttle.py:COUNT", COUNT)

    def _counters(self, address: str, key: str) -> list[str]:
        counters = [f"{self.prefix}:auth:fail:addr:{address or '?'}"]
        if key:  # the prefix is part of a secret: only its hash is kept
            digest = hashlib.sha256(key[: self.limits.prefix_chars].encode()).hexdigest()[:32]
            counters.append(f"{self.prefix}:auth:fail:key:{digest}")
        return counters

    def blocked(self, address: str, key: str) -> int | None:
        """Seconds to wait (for ``Retry-After``) when the address or the key's prefix has reached the
        bound within its window; None otherwise (and when Redis cannot say)."""
        counters = self._counters(address, key)
        try:
            pipe = self.redis.pipeline(transaction=False)  # not MGET: on a cluster they sit in two slots
            for counter in counters:
                pipe.get(counter)
                pipe.pttl(counter)
            answers = pipe.execute()
            wait = 0.0
            endless = []
            for index in range(len(counters)):
                count, left = int(answers[2 * index] or 0), int(answers[2 * index + 1])
                if count >= self.limits.failures:
                    wait = max(wait, (left if left > 0 else self.limits.window * 1000) / 1000)
                if left == -1:  # a counter with no end: give it the window's, or it would block for ever
                    endless.append(counters[index])
            if endless:
                repair = self.redis.pipeline(transaction=False)
                for counter in endless:
                    repair.pexpire(counter, max(1, int(self.limits.window * 1000)), nx=True)
                repair.execute()
            if wait <= 0:
                return None
            self.redis.incr(self.keys.counter(REFUSALS))
        except redis.RedisError as exc:
            log.warning("authentication failures not checked: Redis unavailable: %s", exc)
            return None
        return max(1, math.ceil(wait))

    def failed(self, address: str, key: str) -> None:
        """Count one failed authentication of ``address`` with ``key`` (not blocked, key wrong)."""
        if not key:
            return
        window = max(1, int(self.limits.window * 1000))
        try:
            pipe = ScriptPipeline(self.redis)
            for counter in self._counters(address, key):  # one call each: on a cluster they sit in two slots
                pipe.call(self._count, [counter], [window])
            pipe.command("INCR", self.keys.counter(FAILURES))
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("authentication failure not counted: Redis unavailable: %s", exc)
