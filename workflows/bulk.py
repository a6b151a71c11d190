"""Bulk retry and bulk cancel: one operator action on every flow a filter matches, in the background.

An outage leaves thousands of flows ``failed`` or waiting; retrying them one by one is not an option.
A bulk action is asked in two steps: a dry run (:meth:`BulkActions.plan`, ``workflows.bulk_plan``: how
many flows match, a sample, and how many the action would skip and why), then the action itself (:meth:`BulkActions.post`),
which lists the matching flows once (at most ``DURAPAY_BULK__MAX_FLOWS``), records the action and
returns at once; a runner (:meth:`BulkActions.run`, the ``durapay.bulk.run`` Celery task, re-sent by
itself while work is left and by the dispatcher when a runner was lost) acts on each listed flow at
``DURAPAY_BULK__RATE`` flows a second, recording its progress (done, skipped with reasons) after each.

Per flow the rules are exactly those of the single-flow actions: ``Engine.retry`` and ``Engine.cancel``
(which ask ``workflows.operator_actions`` and the engine's scripts: a flow with money in flight is asked
to cancel and ends only as the engine allows). A flow the engine refuses is counted as skipped with the
engine's reason. Each flow's history names the bulk action (``by``: ``bulk:<id> <who>``).

Idempotent for one confirmation: each dry run has a token of its own (``Plan.token``, its view's
``plan``), and the action confirming it carries it; the action's id is derived from that token (or
from a key the caller gives), so the same confirmation sent again (a resent request, a form submitted
twice) answers the same record, its progress included, and never acts on a flow twice for one action;
a token or key reused for another action or filter is refused. A post with neither is a new action.
A new dry run is a new action: before, the id was derived from the action and the filter's text, kept
for the retention, so "retry the failed flows" after a second outage in the same week answered the
first one's record, done, and retried none of the flows it matched now. The record is
claimed (HSETNX) before it is written whole; the claim lives :data:`CLAIM_SECONDS` until then, so a post
cut between the two (its process killed, a Redis error) leaves nothing that blocks the action for ever.
A runner takes the action's lease before it acts, so two never run one action at once: it renews the
lease and moves the position on only while the lease is still its own and the position the one it read
(``lua/bulk_progress.lua``, one compare-and-set), checks so before each flow, and stops when either
fails (a runner stalled past its lease and replaced by the dispatcher's revive acts on nothing more);
while it paces itself it renews the lease, and it never sleeps past its run's end. A crash (or a stall)
between a flow's action and its progress entry acts on it again, and the engine then refuses or repeats
harmlessly (a cancel asked twice stands).

Bounded: the walk of the filter is ``workflows.bulk_plan``'s (at most ``max_flows`` matches, a read
budget of index entries); a record and its list expire
``DURAPAY_BULK__RETENTION`` after they were posted; the index keeps the newest ``DURAPAY_BULK__KEPT``;
the skipped sample keeps :data:`SAMPLE` flows; one run acts for at most :data:`RUN_SECONDS`.

The pace is the action's own (one runner per action at ``rate``), not the gateway's shared limiter:
a bulk retry's flows then meet the gateway through the engine's steps, as any flow does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from durapay.config.settings import BulkSettings
from durapay.workflows.bulk_plan import (
    ACTIONS,
    FILTERS,
    SAMPLE,
    Action,
    BulkFilter,
    Plan,
    TooMany,
    brief,
    error_codes,
    plan_flows,
    reason_class,
)
from durapay.workflows.engine import Engine, NotFound
from durapay.workflows.errors import OperatorError
from durapay.workflows.keys import derived_id
from durapay.workflows.scripts import source
from durapay.workflows.store import compact_json

__all__ = [
    "ACTIONS",
    "FILTERS",
    "Action",
    "BulkActions",
    "BulkFilter",
    "KeyReused",
    "Plan",
    "TooMany",
    "UnknownBulk",
    "brief",
    "error_codes",
]

#: Seconds one run acts before it hands over to the next (a Celery task is not held for long).
RUN_SECONDS = 10.0
#: A running action whose progress has not moved for this long has lost its runner: it is sent again.
STALE_SECONDS = 30.0
#: How long a runner's lease lasts (renewed before and after each flow, and while the runner paces itself).
LEASE_MS = 30_000
#: Seconds a post's claim of the record lives until the record is written whole (then it is the record's).
CLAIM_SECONDS = 10


@dataclass
class _Runner:
    """One run of one action: its lease's token and where it stands (the record's position when read)."""

    bulk_id: str
    owner: str
    position: int
    total: int


class KeyReused(ValueError):
    """A key (or a dry run's token) given with another action or filter than the action first posted under it."""


class UnknownBulk(KeyError):
    """No bulk action of that id (never posted, or past its retention)."""


class BulkActions:
    """Plan, post, read and run bulk actions. ``send(bulk_id)``: sends the runner's task (None: nothing
    is sent, the caller runs :meth:`run` itself)."""

    def __init__(self, engine: Engine, settings: BulkSettings, *, send: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.redis: Any = engine.redis
        self.prefix = engine.keys.prefix
        self.send = send
        self.max_flows = settings.max_flows
        self._progress = self.redis.register_script(source("lua/bulk_progress.lua"))

    # -- keys --------------------------------------------------------------------------------------

    # One hash tag per action: its record, list and lease sit in one slot (a transaction may hold them
    # on a cluster); the index is a key of its own, written apart.

    def _record_key(self, bulk_id: str) -> str:
        return f"{self.prefix}:{{b:{bulk_id}}}:bulk"

    def _ids_key(self, bulk_id: str) -> str:
        return f"{self.prefix}:{{b:{bulk_id}}}:bulk_ids"

    def _lease_key(self, bulk_id: str) -> str:
        return f"{self.prefix}:{{b:{bulk_id}}}:bulk_lease"

    def _index_key(self) -> str:
        return f"{self.prefix}:bulks"

    # -- the dry run -------------------------------------------------------------------------------

    def plan(self, action: Action, wanted: BulkFilter) -> Plan:
        """The dry run (``workflows.bulk_plan``): the flows the filter matches, bounded by ``max_flows``."""
        return plan_flows(self.engine, action, wanted, self.max_flows)

    # -- the action --------------------------------------------------------------------------------

    def bulk_id(self, key: str | None, plan: str | None = None) -> str:
        """Derived from the caller's key, else from the token of the dry run it confirms; with neither, a
        new one (a new action)."""
        if key:
            return derived_id("b", "key", key)
        return derived_id("b", "plan", plan or uuid.uuid4().hex)

    def post(
        self,
        action: Action,
        wanted: BulkFilter,
        *,
        by: str,
        given: Mapping[str, Any],
        key: str | None = None,
        plan: str | None = None,
    ) -> dict[str, Any]:
        """Record the action and send its runner; the same key or dry run's token posted again answers its
        record as it is (progress included) and sends a runner again only if it is still running."""
        bulk_id = self.bulk_id(key, plan)
        asked = compact_json({"action": action, **given})
        if self.get_or_none(bulk_id) is None:
            found = self.plan(action, wanted)
            # Another post of the same action writing it: its record is the one. A claim whose post was
            # cut goes after CLAIM_SECONDS, and this post claims it then.
            deadline = time.monotonic() + 2 * CLAIM_SECONDS + 1
            while self.get_or_none(bulk_id) is None and time.monotonic() < deadline:
                if self._claim(bulk_id):
                    self._write(bulk_id, action, wanted, found, by, asked)
                    break
                time.sleep(0.1)
        current = self.get(bulk_id)
        if self.redis.hget(self._record_key(bulk_id), "asked") not in (None, asked.encode()):
            named = f"key {key!r}" if key else f"the dry run {plan!r}"
            raise KeyReused(
                f"{named} was used for another bulk action ({current['action']} of other flows): "
                + ("use a new key" if key else "make a dry run of this one")
            )
        if current["status"] == "running" and self.send is not None:
            self.send(bulk_id)
        return current

    def _claim(self, bulk_id: str) -> bool:
        """Claim the record (its ``id`` only) for CLAIM_SECONDS. The expiry is set only on a key without
        one (a whole record has the retention's), so a claim left without an expiry (a post cut before
        claims had one) gets it too, and goes."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(self._record_key(bulk_id), "id", bulk_id)
        pipe.expire(self._record_key(bulk_id), CLAIM_SECONDS, nx=True)
        claimed, _ = pipe.execute()
        return bool(claimed)

    def _write(self, bulk_id: str, action: Action, wanted: BulkFilter, plan: Plan, by: str, asked: str) -> None:
        """The record (its "created" last: the mark that it is whole) and its list of flows, kept for the
        retention; the index capped to the newest ``kept`` and to the retention."""
        now = self.engine.clock.now()
        seconds = int(self.settings.retention)
        record = {
            "action": action,
            "filter": compact_json(wanted.view()),
            "by": by[:100],
            "updated": repr(now),
            "total": str(len(plan.ids)),
            "position": "0",
            "done": "0",
            "skipped": "0",
            "status": "running" if plan.ids else "done",
            "skips": "{}",
            "skipped_sample": "[]",
            "asked": asked,  # the action and filter as given: a key or token reused for another is refused
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self._ids_key(bulk_id))
        for start in range(0, len(plan.ids), 1000):
            pipe.rpush(self._ids_key(bulk_id), *plan.ids[start : start + 1000])
        pipe.expire(self._ids_key(bulk_id), seconds)
        pipe.hset(self._record_key(bulk_id), mapping=record)
        pipe.hset(self._record_key(bulk_id), "created", repr(now))
        pipe.expire(self._record_key(bulk_id), seconds)
        pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self._index_key(), {bulk_id: now})
        pipe.zremrangebyrank(self._index_key(), 0, -self.settings.kept - 1)
        pipe.zremrangebyscore(self._index_key(), "-inf", now - seconds)
        pipe.execute()

    def get_or_none(self, bulk_id: str) -> dict[str, Any] | None:
        raw = self.redis.hgetall(self._record_key(bulk_id))
        if not raw or b"created" not in raw:
            return None
        fields = {name.decode(): value.decode() for name, value in raw.items()}
        return {
            "id": fields["id"],
            "action": fields["action"],
            "filter": json.loads(fields["filter"]),
            "by": fields["by"],
            "created": float(fields["created"]),
            "updated": float(fields["updated"]),
            "status": fields["status"],
            "total": int(fields["total"]),
            "done": int(fields["done"]),
            "skipped": int(fields["skipped"]),
            "skips": json.loads(fields["skips"]),
            "skipped_sample": json.loads(fields["skipped_sample"]),
        }

    def get(self, bulk_id: str) -> dict[str, Any]:
        found = self.get_or_none(bulk_id)
        if found is None:
            raise UnknownBulk(bulk_id)
        return found

    def list(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest bulk actions first (those still kept)."""
        ids = [raw.decode() for raw in self.redis.zrevrange(self._index_key(), 0, max(0, min(limit, self.settings.kept) - 1))]
        return [record for bulk_id in ids if (record := self.get_or_none(bulk_id)) is not None]

    # -- the runner --------------------------------------------------------------------------------

    def run(self, bulk_id: str, *, seconds: float = RUN_SECONDS) -> bool:
        """Act on the listed flows from where the action stands, at the action's pace, for at most
        ``seconds`` (and only under the action's lease: another runner holding it, this one returns).
        Returns whether work is left (the caller sends the task again)."""
        owner = uuid.uuid4().hex
        lease = self._lease_key(bulk_id)
        if not self.redis.set(lease, owner, nx=True, px=LEASE_MS):
            return False
        try:
            return self._run(bulk_id, owner, seconds)
        finally:
            if self.redis.get(lease) == owner.encode():
                self.redis.delete(lease)

    def _run(self, bulk_id: str, owner: str, seconds: float) -> bool:
        record = self.get_or_none(bulk_id)
        if record is None or record["status"] != "running":
            return False
        key = self._record_key(bulk_id)
        runner = _Runner(bulk_id, owner, int(self.redis.hget(key, "position") or 0), record["total"])
        action: Action = record["action"]
        by = f"bulk:{bulk_id} {record['by']}"
        skips: dict[str, int] = dict(record["skips"])
        sample: list[dict[str, str]] = list(record["skipped_sample"])
        started = time.monotonic()
        end = started + seconds
        interval = 1.0 / self.settings.rate
        acted = 0
        while runner.position < runner.total and time.monotonic() < end:
            ids = [raw.decode() for raw in self.redis.lrange(self._ids_key(bulk_id), runner.position, runner.position + 99)]
            if not ids:
                break  # the list expired with the record: nothing more can be known
            for flow_id in ids:
                # The action's own pace (DURAPAY_BULK__RATE), within the run's time, under its lease.
                if not self._wait(runner, min(started + acted * interval, end)):
                    return False  # the lease is lost: the runner that holds it goes on
                if time.monotonic() >= end:
                    break
                refused = self._act(action, flow_id, by)
                acted += 1
                counter, changed = "done", ("", "")
                if refused is not None:
                    counter = "skipped"
                    reason = reason_class(refused, flow_id)
                    skips[reason] = skips.get(reason, 0) + 1
                    if len(sample) < SAMPLE:
                        sample.append({"id": flow_id, "reason": refused[:300]})
                    changed = (compact_json(skips), compact_json(sample))
                if not self._step(runner, "advance", counter, *changed):
                    return False  # lost while acting: this flow is the new runner's to count
                runner.position += 1
        if runner.position >= runner.total:
            return False
        if not self.redis.exists(self._ids_key(bulk_id)):
            if self._step(runner, "renew"):
                self.redis.hset(key, mapping={"status": "done", "updated": repr(self.engine.clock.now())})
            return False
        return True

    def _step(self, runner: _Runner, what: str, counter: str = "", skips: str = "", sample: str = "") -> bool:
        """Renew the lease (``renew``) or also move the position on by one (``advance``), only if the lease
        is still the runner's and the position the one it stands at (``lua/bulk_progress.lua``)."""
        args = [what, runner.owner, runner.position, LEASE_MS, counter, repr(self.engine.clock.now()), runner.total]
        keys = [self._lease_key(runner.bulk_id), self._record_key(runner.bulk_id)]
        return bool(self._progress(keys=keys, args=[*args, skips, sample]))

    def _wait(self, runner: _Runner, until: float) -> bool:
        """Sleep until ``until`` (monotonic), renewing the lease at least three times a lease; False as soon
        as the lease is found lost. Bounded: ``until`` is within the run's time."""
        while self._step(runner, "renew"):
            left = until - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, LEASE_MS / 3000))
        return False

    def _act(self, action: Action, flow_id: str, by: str) -> str | None:
        """The single-flow action, as the engine decides it: None, or why it was not taken."""
        try:
            if action == "retry":
                self.engine.retry(flow_id, by=by)
            else:
                self.engine.cancel(flow_id, f"cancelled by {by}", by=by)
        except OperatorError as exc:
            return str(exc)
        except NotFound:
            return f"flow {flow_id} is gone (past its retention)"
        return None

    def revive(self, *, now: float) -> int:
        """The dispatcher's look: send the runner of each running action whose progress stopped (a lost
        task, a killed worker). Bounded by the index (``DURAPAY_BULK__KEPT``). Returns how many."""
        if self.send is None:
            return 0
        sent = 0
        for record in self.list(self.settings.kept):
            if (
                record["status"] == "running"
                and now - record["updated"] > STALE_SECONDS
                and not self.redis.exists(self._lease_key(record["id"]))
            ):
                self.send(record["id"])
                sent += 1
        return sent
