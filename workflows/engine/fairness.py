"""Fairness between terminals and tenants: which Celery queue a flow's steps go to (docs/operations.md, Fairness).

A flow's *fairness key* is its terminal and, when its start set one, its tenant: ``default``,
``eu``, ``default/acme``. Without fairness (the default) every step goes to the one step queue, first in,
first out: a 100,000-flow batch of one merchant is served before a checkout of another started after it.
With ``DURAPAY_FAIRNESS__ENABLED`` each key's steps go to queues of their own and the workers take from
those queues in turn: kombu's Redis transport asks for the next message of all its queues in one
``BRPOP`` and moves the queue it was served from to the end of its list, so a queue with messages waits
at most one message of each other queue (the same round robin holds on RabbitMQ, which delivers to a
consumer of several queues in turn). Nothing else changes: a queue is only the fast path, the due set
stays the truth (docs/durability.md), so a message lost on any queue is sent again by the dispatcher, and
a claim still decides who runs a step, so a message twice runs nothing twice.

* **Weights.** A key of weight *w* has *w* queues and its steps are spread over them in turn, so when
  every key has a backlog it gets *w* turns in every round (``DURAPAY_FAIRNESS__WEIGHTS``).
* **Bounds.** The queues are fixed by the settings (every worker must consume the same ones): a key named
  in the weights has its own; any other key folds into one of ``shared_queues`` shared buckets, chosen by
  a stable hash of the key, of ``default_weight`` queues each: two such keys in one bucket share its
  turns (name a key to give it queues of its own). At most ``MAX_FAIR_QUEUES`` (128) queues in all, refused at
  start beyond. The backlog of a key is its flows that are due: one message each on its queues (a
  dispatcher's resend after a lease may add one), in the broker like the one queue's today.
* **Caps.** ``DURAPAY_FAIRNESS__CAPS`` bounds how many steps of a key are sent or running at once
  (:class:`Caps`): a step over its key's cap is not sent but held back, oldest first, and sent when one
  of the key's steps ends, or when a place lapses unclaimed; it stays on the due set meanwhile (moved
  ``hold_seconds`` on), so a crash between the two leaves it due, never lost. A place is its step's
  claim's, renewed with its lease. A cap below the workers' threads keeps room for the others.
* **Shares.** A cap holds whole only while its key is alone: while another key is *active* (one of its
  steps sent within the last :data:`ACTIVE_SECONDS`), a capped key's cap is its weighted share of it,
  ``cap * weight // (the active keys' weights)``, at least 1 (:meth:`Caps.cap_now`). A thread is not
  what a backlog takes from another key: its steps run in the same worker processes and take their CPU
  (threads: one interpreter lock), so the other key's step, given a free thread, still waited about as
  long as the backlog's steps beside it were many (bench/bench_fairness.py, docs/performance.md). The
  backlog gives places back as its steps end (none is stopped), and takes its whole cap again, by its
  releases and the dispatcher's refills, once the other key has been quiet for ``ACTIVE_SECONDS``: alone
  it uses every place.

With fairness off, nothing here is called on the start or step path: one queue, the same commands.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
from collections.abc import Mapping
from typing import Any

from durapay.config.celery import QUEUE
from durapay.config.settings import DEFAULT_TERMINAL, MAX_FAIR_QUEUES, FairnessSettings
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.scripts import register, source
from durapay.workflows.engine.sensitive import card_like

#: The record's fields the key is read from. A record without ``terminal`` is on the ``default`` one;
#: ``tenant`` is written only when a start set it.
TERMINAL_FIELD = "terminal"
TENANT_FIELD = "tenant"
#: A tenant as a merchant may name it on a start: short, and only characters safe in a queue's name.
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TENANT_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
#: The prefix of every fairness queue's name.
QUEUE_PREFIX = "durapay.fair."


def tenant_refusal(tenant: str) -> str | None:
    """Why ``tenant`` cannot name a tenant, or None when it can."""
    if not TENANT_PATTERN.match(tenant):
        return f"must be {TENANT_RULE}"
    found = card_like(tenant)
    if found is not None:  # kept on the record, listed, logged: an identifier, never a card number
        return f"must not hold a card number (it holds {found}, which passes the Luhn check)"
    return None


def fair_key(terminal: str | None, tenant: str | None) -> str:
    """The fairness key of a flow on ``terminal`` (None or empty: ``default``) for ``tenant`` (if any).
    ``terminal`` is the record's field (``workflows.engine.terminals``: written only off the default)."""
    terminal = terminal or DEFAULT_TERMINAL
    return f"{terminal}/{tenant}" if tenant else terminal


def key_of(fields: Mapping[str, str]) -> str:
    """The fairness key of a flow record's fields."""
    return fair_key(fields.get(TERMINAL_FIELD), fields.get(TENANT_FIELD))


def _bucket(key: str, buckets: int) -> int:
    """A stable bucket of ``key`` (the same in every process: not Python's salted hash)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big") % buckets


class Fairness:
    """The queues of the fairness keys, from the settings. Thread safe (one lock around the turn counters)."""

    def __init__(self, settings: FairnessSettings) -> None:
        self.settings = settings
        self.on = settings.enabled
        self._named: dict[str, list[str]] = {
            key: [f"{QUEUE_PREFIX}{key}.{index}" for index in range(weight)] for key, weight in sorted(settings.weights.items())
        }
        self._shared: list[list[str]] = [
            [f"{QUEUE_PREFIX}~{bucket}.{index}" for index in range(settings.default_weight)]
            for bucket in range(settings.shared_queues)
        ]
        self._turns: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def queues(self) -> list[str]:
        """Every fairness queue, in the order a worker is given them (the same in every process)."""
        named = [name for names in self._named.values() for name in names]
        return named + [name for names in self._shared for name in names]

    def step_queues(self) -> list[str]:
        """The queues a step worker consumes: the one step queue (bulk runners, and every step with fairness
        off), then with fairness on the fairness queues."""
        return [QUEUE, *self.queues()] if self.on else [QUEUE]

    def queues_of(self, key: str) -> list[str]:
        """The queues of ``key``: its own when the weights name it, else its shared bucket's."""
        named = self._named.get(key)
        if named is not None:
            return named
        return self._shared[_bucket(key, len(self._shared))]

    def queue_for(self, key: str) -> str:
        """The queue the next step of ``key`` goes to: its queues in turn (a weight of 3 is 3 queues)."""
        names = self.queues_of(key)
        if len(names) == 1:
            return names[0]
        with self._lock:
            turn = self._turns.get(key)
            if turn is None:
                if len(self._turns) >= MAX_FAIR_QUEUES * 8:
                    self._turns.clear()  # bounded: a counter lost only restarts that key's turn
                turn = self._turns[key] = itertools.count()
            return names[next(turn) % len(names)]

    def queue_of_record(self, fields: Mapping[str, str]) -> str:
        return self.queue_for(key_of(fields))


#: A key is active (it shrinks the capped keys' caps to their shares) for this long after one of its steps
#: was sent.
ACTIVE_SECONDS = 2.0
#: A process marks a key active at most every ``MARK_SECONDS`` (one ``ZADD`` per key and process), and
#: reads the active keys at most every ``LOOK_SECONDS`` (one ``ZRANGEBYSCORE``), with caps only: a share
#: follows another key's first step within that (a process that sent it knows at once). The look is
#: short because the other key's first steps wait beside the whole cap until it is read (at 0.25 s, two
#: or three flows of a trickle every 0.1 s, its p95 in bench_fairness).
MARK_SECONDS = 0.5
LOOK_SECONDS = 0.05
#: The most active keys read (the set is trimmed to those active within ``ACTIVE_SECONDS`` at each mark).
MAX_ACTIVE = 1024

#: What :meth:`Caps.admit` answers.
ADMITTED, HELD, HELD_UNLISTED = 1, 0, -1


class Caps:
    """Per-key concurrency caps (``DURAPAY_FAIRNESS__CAPS``): how many of a key's steps are sent or running.

    A key's *running* set holds its flows' places: taken when a step is sent (admitted), taken again by
    the step's claim and renewed with its lease (:meth:`take`), so a step that renews its lease keeps
    its place and a worker lost mid-step frees its own a lease on. Its *owners* name the claim holding
    each place: a run that lost its lease releases nothing (its flow's place is its new claim's). A
    place sent and never claimed (the flow cancelled, its kind paused, its message lost) lapses a lease
    after it was sent, and the dispatcher gives the room to the held flows (:meth:`refill`). Its *held*
    set, the flows waiting for a place, oldest first, at most ``max_held``; a flow beyond the list
    ranks by how long it waited when its due entry brings it back (``engine/lua/fair_admit.lua``). All in one
    slot per key (``Keys.fair_running``). Used only for a key named in the caps, with fairness on: no
    other flow pays a command for it."""

    def __init__(self, client: Any, keys: Keys, settings: FairnessSettings, lease: float) -> None:
        self.caps = dict(settings.caps) if settings.enabled else {}
        self.weights = dict(settings.weights)
        self.default_weight = settings.default_weight
        self.redis = client
        self.keys = keys
        self.lease = lease
        self.max_held = settings.max_held
        self.hold_seconds = settings.hold_seconds
        self._admit = register(client, "engine/lua/fair_admit.lua", source("engine/lua/fair_admit.lua"))
        self._release = register(client, "engine/lua/fair_release.lua", source("engine/lua/fair_release.lua"))
        self._take = register(client, "engine/lua/fair_take.lua", source("engine/lua/fair_take.lua"))
        self._marked: dict[str, float] = {}  # key -> when this process last marked it active
        self._active: dict[str, float] = {}  # key -> when last active, as last read (and marked here)
        self._looked = float("-inf")
        self._lock = threading.Lock()

    def mark(self, key: str, now: float) -> None:
        """A step of ``key`` is being sent: it is active (:data:`ACTIVE_SECONDS`). At most one write per
        key and :data:`MARK_SECONDS` in this process; the set trimmed to the active keys as it is written."""
        with self._lock:
            self._active[key] = now
            if now - self._marked.get(key, float("-inf")) < MARK_SECONDS:
                return
            if len(self._marked) >= MAX_ACTIVE:
                self._marked.clear()  # bounded: a key forgotten is only written again
            self._marked[key] = now
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.keys.fair_active(), {key: now})
        pipe.zremrangebyscore(self.keys.fair_active(), "-inf", now - ACTIVE_SECONDS)
        pipe.execute()

    def cap_now(self, key: str, now: float) -> int:
        """The cap of ``key`` in force: its cap while no other key is active, else its weighted share of it
        among the active keys (itself counted), at least 1."""
        cap = self.caps[key]
        with self._lock:
            stale = now - self._looked >= LOOK_SECONDS
        if stale:
            found = self.redis.zrangebyscore(
                self.keys.fair_active(), now - ACTIVE_SECONDS, "+inf", start=0, num=MAX_ACTIVE, withscores=True
            )
            with self._lock:
                self._looked = now
                mine = {name: at for name, at in self._active.items() if at > now - ACTIVE_SECONDS}
                self._active = {(name.decode() if isinstance(name, bytes) else name): at for name, at in found}
                for name, at in mine.items():  # marked here since (or not yet written): known at once
                    self._active[name] = max(at, self._active.get(name, at))
        with self._lock:
            others = [name for name, at in self._active.items() if name != key and at > now - ACTIVE_SECONDS]
        if not others:
            return cap
        weight = self.weight(key)
        return max(1, cap * weight // (weight + sum(self.weight(name) for name in others)))

    def weight(self, key: str) -> int:
        return self.weights.get(key, self.default_weight)

    def capped(self, key: str) -> bool:
        return key in self.caps

    def _slot(self, key: str) -> list[str]:
        return [self.keys.fair_running(key), self.keys.fair_held(key), self.keys.fair_owner(key)]

    def admit(self, key: str, flow_id: str, now: float, *, since: float | None = None) -> int:
        """:data:`ADMITTED`, :data:`HELD` (listed for a release) or :data:`HELD_UNLISTED` (the list full).
        ``since``: when the flow began to wait (``now`` unless said), its rank in the held list."""
        waited = now if since is None else since
        args: list[str | int] = [flow_id, repr(now), repr(now + self.lease), self.cap_now(key, now), self.max_held, repr(waited)]
        return int(self._admit(keys=self._slot(key), args=args))

    def take(self, key: str, flow_id: str, token: str, lease_until: float, *, renew: bool = False) -> bool:
        """The claim ``token`` of ``flow_id``'s step holds its place until ``lease_until`` (its lease): at
        the claim (whoever held the place), or at a renewal of its lease (False: another claim holds it)."""
        args: list[str | int] = [flow_id, repr(lease_until), token, "renew" if renew else "claim"]
        return bool(self._take(keys=[self.keys.fair_running(key), self.keys.fair_owner(key)], args=args))

    def release(self, key: str, flow_id: str, token: str, now: float) -> list[str]:
        """The claim ``token`` of ``flow_id``'s step ended: its place given back if it is still that claim's,
        and the held flows admitted in the room there is (the caller sends them)."""
        args: list[str | int] = [flow_id, repr(now), repr(now + self.lease), self.cap_now(key, now), token]
        ids = self._release(keys=self._slot(key), args=args)
        return [item.decode() for item in ids]

    def refill(self, key: str, now: float) -> list[str]:
        """The held flows admitted in the room lapsed places left (the dispatcher's look; the caller sends them)."""
        return self.release(key, "", "", now)

    def forget(self, key: str, flow_ids: list[str]) -> None:
        """Flows admitted by a release that need no place (ended meanwhile)."""
        if flow_ids:
            self.redis.zrem(self.keys.fair_running(key), *flow_ids)

    def held(self, key: str) -> int:
        """How many flows the key's cap holds back in its list (``/metrics``, tests)."""
        return int(self.redis.zcard(self.keys.fair_held(key)))


def claim_token(version: int | str, owner: str | None) -> str:
    """The token of a claim, as its place's owner: the record's version as claimed and its lease owner
    (a worker's name alone is not enough: the same worker may claim the flow again)."""
    return f"{version}:{owner or ''}"
