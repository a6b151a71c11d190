"""Bulk retry and bulk cancel: one operator action on every flow a filter matches, in the background.

An outage leaves thousands of flows ``failed`` or waiting; retrying them one by one is not an option.
A bulk action is asked in two steps: a dry run (:meth:`BulkActions.plan`, ``workflows.bulk_plan``: the
flows that match, their money, what the action would skip and why), then the action
(:meth:`BulkActions.post`), recorded on the flows that dry run listed; a runner (:meth:`BulkActions.run`,
the ``durapay.bulk.run`` task, re-sent by itself while work is left and by the dispatcher when a runner
was lost) acts on each at ``DURAPAY_BULK__RATE`` flows a second, recording its progress after each.

Per flow the rules are exactly those of the single-flow actions: ``Engine.retry`` and ``Engine.cancel``
(which ask ``workflows.engine.operator_actions`` and the engine's scripts: a flow with money in flight is asked
to cancel and ends only as the engine allows). A flow the engine refuses is counted as skipped with the
engine's reason. Each flow's history names the bulk action (``by``: ``bulk:<id> <who>``).

A confirmation acts on exactly what its dry run showed (DESIGN, money invariant 8): the dry run keeps
the flows it listed, each as shown (``workflows.bulk_kept``), and the action confirming its token acts on
those only, never on the filter walked again; each flow is re-checked at its turn by the engine
(``Engine.retry``, ``cancel`` with ``seen``): one changed since (its state or version) is skipped and
counted as ``changed``, with the reason. Once confirmed, the dry run's flows are the action's list, which
expires with its record.

Idempotent for one confirmation: the action's id is derived from the dry run's token (or from a key the
caller gives), so the same confirmation sent again (a resent request, a form submitted twice) answers the
same record, progress included, and acts on no flow twice; a key reused for another action or filter is
refused. A new dry run is a new action (an id derived from the filter's text answered last week's action
for this week's outage). A post with neither token nor key (a program) is its own dry run, not kept. The record is
claimed (HSETNX) before it is written whole; the claim lives :data:`CLAIM_SECONDS` until then, so a post
cut between the two (its process killed, a Redis error) leaves nothing that blocks the action for ever.
A runner takes the action's lease before it acts, so two never run one action at once: it renews the
lease and moves the position on only while the lease is still its own and the position the one it read
(``engine/lua/bulk_progress.lua``, one compare-and-set), checks so before each flow, and stops when either
fails (a runner stalled past its lease and replaced by the dispatcher's revive acts on nothing more);
while it paces itself it renews the lease, and it never sleeps past its run's end. A crash (or a stall)
between a flow's action and its progress entry finds it again, changed by that act: skipped as changed.

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
from durapay.workflows.bulk_kept import KeptPlans, KeyReused, PlanNotKept, Unconfirmable, asked_text, plan_action_id
from durapay.workflows.bulk_plan import (
    ACTIONS,
    FILTERS,
    SAMPLE,
    Action,
    BulkFilter,
    Plan,
    TooMany,
    asked_of,
    brief,
    entry,
    error_codes,
    parse_entry,
    plan_flows,
    reason_class,
)
from durapay.workflows.engine import (
    ChangedSince,
    Engine,
    NotFound,
    OperatorError,
    Seen,
    compact_json,
    derived_id,
    mask_text,
    source,
)

__all__ = [
    "ACTIONS",
    "FILTERS",
    "Action",
    "BulkActions",
    "BulkFilter",
    "KeyReused",
    "Plan",
    "PlanNotKept",
    "TooMany",
    "Unconfirmable",
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
        self._progress = self.redis.register_script(source("engine/lua/bulk_progress.lua"))
        self.plans = KeptPlans(self.redis, self.prefix)

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

    def plan(self, action: Action, wanted: BulkFilter, *, asked: Mapping[str, str] | None = None) -> Plan:
        """The dry run (``workflows.bulk_plan``): the flows the filter matches, bounded by ``max_flows``,
        kept for ``KEPT_SECONDS`` for the action that confirms it (``workflows.bulk_kept``). ``asked``: the
        filter as its caller wrote it (``since=1h``), which the confirmation repeats."""
        found = plan_flows(self.engine, action, wanted, self.max_flows, asked)
        self.plans.keep(found)
        return found

    def confirms(self, token: str, action: Action, given: Mapping[str, Any]) -> Plan:
        """The kept dry run ``token``, if of this action and filter as asked (else :class:`Unconfirmable`)."""
        return self.plans.confirms(token, action, given)

    # -- the action --------------------------------------------------------------------------------

    def bulk_id(self, key: str | None, plan: str | None = None) -> str:
        """Derived from the caller's key, else from the token of the dry run it confirms; with neither, a
        new one (a new action)."""
        if key:
            return derived_id("b", "key", key)
        return plan_action_id(plan or uuid.uuid4().hex)

    def post(
        self,
        action: Action,
        wanted: BulkFilter,
        *,
        by: str,
        given: Mapping[str, Any] | None = None,
        key: str | None = None,
        plan: str | None = None,
    ) -> dict[str, Any]:
        """Record the action and send its runner; the same key or dry run's token posted again answers its
        record as it is (progress included) and sends a runner again only if it is still running.

        With ``plan``: the action acts on that dry run's flows (``wanted`` is not walked again), refused
        (:class:`Unconfirmable`) if the dry run is not kept or was made for another action or filter
        (``given``, as asked). Without: this post is its own dry run, not kept."""
        given = dict(given) if given is not None else asked_of(wanted)
        bulk_id = self.bulk_id(key, plan)
        asked = asked_text(action, given)
        found: Plan | None = None
        if plan:
            try:
                found = self.confirms(plan, action, given)
            except PlanNotKept:
                # Confirmed already (its record written before the dry run was dropped): answered below.
                if self.get_or_none(bulk_id) is None:
                    raise
        if self.get_or_none(bulk_id) is None:
            if found is None:
                found = plan_flows(self.engine, action, wanted, self.max_flows, given)
            # Another post of the same action writing it: its record is the one. A claim whose post was
            # cut goes after CLAIM_SECONDS, and this post claims it then.
            deadline = time.monotonic() + 2 * CLAIM_SECONDS + 1
            while self.get_or_none(bulk_id) is None and time.monotonic() < deadline:
                if self._claim(bulk_id):
                    self._write(bulk_id, found, by, asked, plan)
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

    def _write(self, bulk_id: str, plan: Plan, by: str, asked: str, token: str | None) -> None:
        """The record (its "created" last: the mark that it is whole) and its list of flows (each as its dry
        run showed it), kept for the retention; the dry run it confirms is no longer kept (confirmed once;
        with the record when they share a slot); the index capped to the newest ``kept`` and to the
        retention."""
        now = self.engine.clock.now()
        seconds = int(self.settings.retention)
        record = {
            "action": plan.action,
            "filter": compact_json(plan.filter.view()),  # as the dry run resolved it (relative times fixed then)
            "by": mask_text(by)[:100],  # a person's name, masked where it is written (workflows.engine.sensitive)
            "updated": repr(now),
            "total": str(len(plan.flows)),
            "position": "0",
            "done": "0",
            "skipped": "0",
            "changed": "0",
            "status": "running" if plan.flows else "done",
            "skips": "{}",
            "skipped_sample": "[]",
            "asked": asked,  # the action and filter as given: a key or token reused for another is refused
        }
        entries = [entry(flow_id, seen) if seen is not None else flow_id for flow_id, seen in plan.flows]
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self._ids_key(bulk_id))
        for start in range(0, len(entries), 1000):
            pipe.rpush(self._ids_key(bulk_id), *entries[start : start + 1000])
        pipe.expire(self._ids_key(bulk_id), seconds)
        pipe.hset(self._record_key(bulk_id), mapping=record)
        pipe.hset(self._record_key(bulk_id), "created", repr(now))
        pipe.expire(self._record_key(bulk_id), seconds)
        confirmed = [self.plans.key(token), self.plans.ids_key(token)] if token else []
        if confirmed and bulk_id == self.bulk_id(None, token):
            pipe.delete(*confirmed)
            confirmed = []
        pipe.execute()
        if confirmed:  # under a key: another slot, after the record (a post between finds the record)
            self.redis.delete(*confirmed)
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
            "changed": int(fields.get("changed") or 0),
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
            entries = self.redis.lrange(self._ids_key(bulk_id), runner.position, runner.position + 99)
            if not entries:
                break  # the list expired with the record: nothing more can be known
            for raw in entries:
                flow_id, seen = parse_entry(raw.decode())
                # The action's own pace (DURAPAY_BULK__RATE), within the run's time, under its lease.
                if not self._wait(runner, min(started + acted * interval, end)):
                    return False  # the lease is lost: the runner that holds it goes on
                if time.monotonic() >= end:
                    break
                refused = self._act(action, flow_id, by, seen)
                acted += 1
                counter, also, noted = "done", "", ("", "")
                if refused is not None:
                    counter, also = "skipped", "changed" if refused[1] else ""
                    reason = reason_class(refused[0], flow_id)
                    skips[reason] = skips.get(reason, 0) + 1
                    if len(sample) < SAMPLE:
                        sample.append({"id": flow_id, "reason": refused[0][:300]})
                    noted = (compact_json(skips), compact_json(sample))
                if not self._step(runner, "advance", counter, *noted, also=also):
                    return False  # lost while acting: this flow is the new runner's to count
                runner.position += 1
        if runner.position >= runner.total:
            return False
        if not self.redis.exists(self._ids_key(bulk_id)):
            if self._step(runner, "renew"):
                self.redis.hset(key, mapping={"status": "done", "updated": repr(self.engine.clock.now())})
            return False
        return True

    def _step(self, runner: _Runner, what: str, counter: str = "", skips: str = "", sample: str = "", *, also: str = "") -> bool:
        """Renew the lease (``renew``) or also move the position on by one (``advance``: ``counter`` and
        ``also`` counted), only if the lease is still the runner's and the position the one it stands at
        (``engine/lua/bulk_progress.lua``)."""
        args = [what, runner.owner, runner.position, LEASE_MS, counter, repr(self.engine.clock.now()), runner.total]
        keys = [self._lease_key(runner.bulk_id), self._record_key(runner.bulk_id)]
        return bool(self._progress(keys=keys, args=[*args, skips, sample, also]))

    def _wait(self, runner: _Runner, until: float) -> bool:
        """Sleep until ``until`` (monotonic), renewing the lease at least three times a lease; False as soon
        as the lease is found lost. Bounded: ``until`` is within the run's time."""
        while self._step(runner, "renew"):
            left = until - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, LEASE_MS / 3000))
        return False

    def _act(self, action: Action, flow_id: str, by: str, seen: Seen | None) -> tuple[str, bool] | None:
        """The single-flow action on the flow as its dry run showed it (``seen``), as the engine decides
        it: None, or why it was not taken and whether because the flow changed since the dry run."""
        try:
            if action == "retry":
                self.engine.retry(flow_id, by=by, seen=seen)
            else:
                self.engine.cancel(flow_id, f"cancelled by {by}", by=by, seen=seen)
        except ChangedSince as exc:
            return str(exc), True
        except OperatorError as exc:
            return str(exc), False
        except NotFound:
            return f"flow {flow_id} is gone (past its retention)", False
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
