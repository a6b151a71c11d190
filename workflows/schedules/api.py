"""The Python API of schedules, and the scheduler's tick.

::

    schedules = Schedules(engine)
    record = schedules.create({"contractId": "c-1", "amount": 1500, "currency": "EUR",
                               "description": "Gym, monthly", "rule": {"every": "month", "day": 31},
                               "timezone": "Europe/Rome", "start": "2026-01-31T09:00:00"}, key="gym-42")
    Dispatcher(engine, tickers=[schedules.tick]).start()     # fires occurrences, any number at once

``tick`` takes due schedules per partition in batches (atomically, see ``store``), reads them and the
flows of their open attempts in one pipeline each, lets ``policy.advance`` decide, writes every decision
with a compare-and-set (one pipeline per batch), and starts the MIT flows of the writes that won. Only
then is a flow started, under a key derived from (schedule, occurrence, attempt): two schedulers, a
replay or a restart never charge an occurrence twice.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from durapay.config.settings import SettingsError
from durapay.gateway import check_amount, describe_validation_error
from durapay.workflows.engine import (
    TRIM_INTERVAL,
    CardIdentifier,
    ChangedSince,
    CreateCall,
    Engine,
    FlowRecord,
    InputError,
    NotFound,
    NotStarted,
    OperatorError,
    StartConflict,
    UnknownTerminal,
    mark_used,
    mask,
    mask_text,
    refuse_card_identifier,
)
from durapay.workflows.schedules import policy
from durapay.workflows.schedules.model import FINAL, Attempt, Resolution, ScheduleInput, ScheduleRecord, ScheduleState
from durapay.workflows.schedules.policy import MIT_KIND
from durapay.workflows.schedules.rules import iso
from durapay.workflows.schedules.store import ScheduleStore, input_hash

log = logging.getLogger("durapay.schedules")

#: Rounds of ``batch`` schedules per partition in one tick (the rest wait for the next tick).
MAX_ROUNDS = 1000


def _schedule_id(key: str | None) -> str:
    """``s`` + 12 hex digits: 13 characters, leaving five of the gateway's 18 for an order id's occurrence and
    attempt (``policy.order_id``)."""
    if key:
        return "s" + hashlib.sha256(f"schedule\x1f{key}".encode()).hexdigest()[:12]
    return "s" + uuid.uuid4().hex[:12]


def _input_error(exc: ValidationError) -> InputError:
    field, reason = describe_validation_error(exc)
    if field == "(body)" and ": " in reason:  # a cross-field check names its field in the message
        field, reason = reason.split(": ", 1)
    return InputError("schedule", field, reason)


def seen_text(record: ScheduleRecord) -> str:
    """``<version> <state>``: a schedule as a confirmation page showed it, posted back with the person's
    confirmation (``Schedules._operate``'s ``seen``)."""
    return f"{record.version} {record.state.value}"


class Schedules:
    """Create, read and steer schedules; ``tick`` fires them. Uses ``engine.redis``, ``.keys``, ``.clock``."""

    def __init__(self, engine: Engine, *, flow_kind: str = MIT_KIND, batch: int = 500, grace: float | None = None) -> None:
        self.engine = engine
        self.caps = engine.settings.schedules
        self.store = ScheduleStore(
            engine.redis,
            engine.keys,
            events=engine.settings.events.enabled,
            retention=self.caps.retention,
            history_entries=self.caps.history_entries,
            flows_retention=engine.store.retention_seconds,
        )
        self._last_trim = float("-inf")
        self._trim_backlog = False
        self.flow_kind = flow_kind
        self.batch = batch
        self.grace = grace if grace is not None else engine.lease
        limit = engine.settings.gateway.order_id_max_length
        if limit < policy.ORDER_ID_LENGTH:
            # Every order id a schedule derives has 18 characters: the engine would refuse each start.
            raise SettingsError(
                f"DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH: {limit} is shorter than a schedule's order ids "
                f"({policy.ORDER_ID_LENGTH} characters)"
            )

    # -- the Python API ----------------------------------------------------------------------------

    @staticmethod
    def validate(data: ScheduleInput | Mapping[str, Any]) -> ScheduleInput:
        """The input as a ScheduleInput, or InputError naming the field and the reason."""
        if isinstance(data, ScheduleInput):
            return data
        try:
            return ScheduleInput.model_validate(dict(data))
        except ValidationError as exc:
            raise _input_error(exc) from None

    def create(
        self,
        data: ScheduleInput | Mapping[str, Any],
        key: str | None = None,
        *,
        check: Callable[[ScheduleInput], None] | None = None,
    ) -> ScheduleRecord:
        """Create a schedule (InputError naming the field); with ``key``, creating again returns the first.
        ``check``: called with the schedule read strictly, before anything is written (its contract looked up
        at the gateway: ``schedules.contracts.check_contract``, which ``durapay schedules add`` passes).

        Raises StartConflict when ``key`` was used for a different schedule.
        """
        record, entry, digest = self._new(data, key, self.engine.clock.now())
        if check is not None:
            check(record.spec)
        if record.spec.terminal:  # noted before it exists, as a flow's start: the start-up check never misses it
            mark_used(self.engine.redis, self.engine.keys, [record.spec.terminal])
        try:
            self.store.create(record, entry, digest)
        except ValueError as exc:
            raise StartConflict(str(exc)) from None
        return self.get(record.id)

    def create_many(
        self, items: Sequence[tuple[ScheduleInput | Mapping[str, Any], str | None]]
    ) -> builtins.list[str | InputError | StartConflict]:
        """:meth:`create` for many (input, key) pairs in one round trip (bulk loads): per item, the
        schedule id, or the InputError or StartConflict that refused it (the others go on)."""
        now = self.engine.clock.now()
        results: builtins.list[str | InputError | StartConflict] = []
        news = []
        for data, key in items:
            try:
                news.append(self._new(data, key, now))
                results.append(news[-1][0].id)
            except InputError as refused:
                results.append(refused)
        mark_used(self.engine.redis, self.engine.keys, [record.spec.terminal for record, _, _ in news if record.spec.terminal])
        written = iter(self.store.create_many(news))
        for index, result in enumerate(results):
            if isinstance(result, str):
                outcome = next(written)
                if isinstance(outcome, ValueError):
                    results[index] = StartConflict(str(outcome))
        return results

    def _new(
        self, data: ScheduleInput | Mapping[str, Any], key: str | None, now: float
    ) -> tuple[ScheduleRecord, dict[str, Any], str]:
        """The record ``create`` writes, its first history entry and its input hash (or InputError)."""
        spec = self.validate(data)
        if spec.terminal is not None:
            try:  # refused before anything is written, as a flow's start is
                self.engine.terminals.check(spec.terminal)
            except UnknownTerminal as exc:
                raise InputError("schedule", "terminal", str(exc)) from None
        if key:
            try:  # the merchant's key is an identifier, shown whole (its schedule's start_key)
                refuse_card_identifier("key", key)
            except CardIdentifier as exc:
                raise InputError("schedule", exc.field, exc.reason) from None
        record = ScheduleRecord(
            id=_schedule_id(key),
            state=ScheduleState.ACTIVE,
            version=1,
            created=now,
            updated=now,
            spec=spec,
            next_at=None,
            seq=0,
            start_key=key or "",
        )
        first = policy.first_occurrence(record, now)
        if first is None:
            raise InputError("schedule", "end", "the schedule would never fire: its end is already past")
        record.next_at = first.timestamp()
        dumped = spec.dumped()
        entry = {"t": now, "event": "created", "first": iso(first), "rule": dumped["rule"], "timezone": spec.timezone}
        return record, entry, input_hash(dumped)

    def get(self, schedule_id: str) -> ScheduleRecord:
        record = self.store.get(schedule_id)
        if record is None:
            raise NotFound(f"no schedule {schedule_id!r}")
        return record

    def list(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> builtins.list[ScheduleRecord]:
        """Schedules newest first, optionally in one state (active, dunning, paused, needs_attention, ...)."""
        wanted: ScheduleState | None = None
        if state is not None:
            try:
                wanted = ScheduleState(state)
            except ValueError:
                known = ", ".join(s.value for s in ScheduleState)
                raise InputError("schedule", "state", f"unknown state {state!r}; known states: {known}") from None
        return self.store.many(self.store.ids(state=wanted, limit=limit, offset=offset))

    def history(self, schedule_id: str) -> builtins.list[dict[str, Any]]:
        self.get(schedule_id)
        return self.store.history(schedule_id)

    def pause(self, schedule_id: str, *, by: str = "api", seen: str | None = None) -> ScheduleRecord:
        return self._operate(schedule_id, lambda record, now: policy.pause(record, now, by), seen)

    def resume(self, schedule_id: str, *, by: str = "api", seen: str | None = None) -> ScheduleRecord:
        """Go on from now. Refused (OperatorError naming it) for a needs_attention schedule with an
        occurrence whose flow is gone: :meth:`resolve` it first."""
        return self._operate(
            schedule_id, lambda record, now: policy.resume(record, now, by, self._flows(record), self.flow_kind), seen
        )

    def resolve(
        self,
        schedule_id: str,
        occurrence: str,
        outcome: str,
        *,
        operation_id: str | None = None,
        by: str = "api",
        seen: str | None = None,
    ) -> ScheduleRecord:
        """Say what the gateway shows for ``occurrence`` of a needs_attention schedule whose flow is gone
        before its outcome was read: ``charged`` (counted as a charge; ``operation_id``: the gateway
        operation, if found) or ``not_charged`` (closed without a charge). The attempt is closed and the
        occurrence is never fired again; the schedule then resumes with :meth:`resume`.

        InputError names a bad field (an outcome misspelt, an occurrence that is not an ISO datetime);
        OperatorError refuses a schedule not in needs_attention, an occurrence with no open attempt, and
        an attempt whose flow still exists (its own outcome decides).
        """
        data = {"occurrence": occurrence, "outcome": outcome}
        if operation_id is not None:
            data["operationId"] = operation_id
        try:
            resolution = Resolution.model_validate(data)
        except ValidationError as exc:
            raise _input_error(exc) from None
        return self._operate(
            schedule_id, lambda record, now: policy.resolve(record, now, resolution, by, self._flows(record)), seen
        )

    def gone(self, schedule_id: str) -> builtins.list[Attempt]:
        """The open attempts of a schedule whose flows are gone before their outcome was read (what
        :meth:`resolve` takes, and what keeps a needs_attention schedule from resuming)."""
        record = self.get(schedule_id)
        return policy.gone_attempts(record, self._flows(record), self.engine.clock.now())

    def cancel(self, schedule_id: str, reason: str = "cancelled", *, by: str = "api", seen: str | None = None) -> ScheduleRecord:
        """Stop for good (``policy.cancel``), then cancel each started attempt's flow as a person's cancel
        does (``Engine.cancel``): a charge not yet sent is never sent (the schedule's state was checked
        before the wait; what holds when the money moves is the flow's own cancel, DESIGN's invariant 7),
        and one whose call may have been sent ends as a read of the gateway says. The scheduler follows
        them to their end and counts what they charged or not."""
        cancelled = self._operate(schedule_id, lambda record, now: policy.cancel(record, now, by, reason), seen)
        for attempt in cancelled.open:
            if not attempt.started:
                continue
            # One that ended, or took a payment a cancel cannot undo, is refused: the scheduler counts how.
            with contextlib.suppress(OperatorError, NotFound):
                self.engine.cancel(attempt.flow_id, f"schedule {schedule_id} cancelled: {reason}", by=by)
        return self.get(schedule_id)

    def change_amount(self, schedule_id: str, amount: int, *, by: str = "api", seen: str | None = None) -> ScheduleRecord:
        """Charge ``amount`` (minor units) from the next occurrence on."""
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
            raise InputError("schedule", "amount", "must be a whole number of minor units, at least 1")
        try:
            check_amount(amount, self.get(schedule_id).spec.currency)
        except ValueError as exc:
            raise InputError("schedule", "amount", str(exc)) from None
        return self._operate(schedule_id, lambda record, now: policy.change_amount(record, now, amount, by), seen)

    def _flows(self, record: ScheduleRecord) -> dict[str, FlowRecord]:
        """The flows of the record's started attempts that exist, by id (one round trip)."""
        watched = [attempt.flow_id for attempt in record.open if attempt.started]
        return {flow.id: flow for flow in self.engine.store.many(watched)} if watched else {}

    def _operate(
        self, schedule_id: str, change: Callable[[ScheduleRecord, float], policy.Plan], seen: str | None = None
    ) -> ScheduleRecord:
        """Write ``change`` of the schedule by compare-and-set on its version. ``seen``: the schedule as a
        person confirmed it (:func:`seen_text`): :class:`ChangedSince` once it is no longer so, judged on the
        read the write is guarded by (DESIGN, money invariant 8)."""
        for _ in range(20):
            record = self.get(schedule_id)
            if seen is not None and seen != seen_text(record):
                raise ChangedSince(
                    f"schedule {schedule_id} changed since you looked (shown {seen}, it is {seen_text(record)} now: "
                    "version and state)"
                )
            now = self.engine.clock.now()
            plan = change(record, now)
            _mask_written(plan)
            if self.store.update(record, plan.record, plan.events, now):
                return self.get(schedule_id)
        raise OperatorError(f"schedule {schedule_id} kept changing; try again")

    # -- the scheduler -------------------------------------------------------------------------------

    def tick(self) -> int:
        """Look at every due schedule (in batches per partition); returns how many flows were started."""
        now = self.engine.clock.now()
        started = 0
        if self.flow_kind in self.engine.pauses.paused_recently():
            # Its flows' kind is paused (workflows.pauses): nothing fires, as if no scheduler ran; at the
            # resume the occurrences that passed follow each schedule's missed policy.
            return 0
        for partition in range(self.store.partitions):
            for _ in range(MAX_ROUNDS):
                ids = self.store.take_due(partition, now=now, batch=self.batch, grace=self.grace)
                if ids:
                    started += self._process(ids, now)
                if len(ids) < self.batch:
                    break
        if self._trim_backlog or time.monotonic() - self._last_trim > TRIM_INTERVAL:
            self._last_trim = time.monotonic()
            self._trim_backlog = self.store.trim_ended(now=now)[1]
        return started

    def _process(self, ids: builtins.list[str], now: float) -> int:
        records = self.store.many(ids)
        watched = [attempt.flow_id for record in records for attempt in record.open if attempt.started]
        flows = {flow.id: flow for flow in self.engine.store.many(watched)} if watched else {}
        changes = []
        plans = []
        for record in records:
            plan = policy.advance(record, now, flows, self.flow_kind, self.caps)
            changes.append((record, plan.record, plan.events))
            plans.append(plan)
        if self.store.fires_in_one:
            return self._fire(changes, plans, now)
        written_plans = [plan for plan, written in zip(plans, self.store.update_many(changes, now), strict=True) if written]
        made = self._start_all([(plan.record, attempt) for plan in written_plans for attempt in plan.starts])
        marks = [(plan.record, frozenset(a.key for a in plan.starts if a.key in made)) for plan in written_plans]
        marks = [(record, keys) for record, keys in marks if keys]
        if marks:
            # One more round trip per batch: the schedule itself now says these flows exist. A lost
            # mark is made at the next look instead.
            self.store.mark_many(marks, now)
        return len(made)

    def _fire(
        self,
        changes: builtins.list[tuple[ScheduleRecord, ScheduleRecord, builtins.list[dict[str, Any]]]],
        plans: builtins.list[policy.Plan],
        now: float,
    ) -> int:
        """On a single server: each schedule's change, its flows' creates and the mark of its attempts in
        one script (``ScheduleStore.fire_many``), every schedule of the batch in one round trip; the starts'
        rules are the engine's (``start_many``'s ``within``). The same writes, in the same order, as the
        three steps of the cluster's path, without two script calls and two round trips per batch. A
        schedule one of whose creates was refused has the others marked after (``mark_many``), as there."""
        owner = [index for index, plan in enumerate(plans) for _ in plan.starts]
        attempts = [(plan.record, attempt) for plan in plans for attempt in plan.starts]
        fired: builtins.list[tuple[bool, builtins.list[Any]] | None] = []

        def fire(calls: builtins.list[tuple[int, CreateCall]]) -> builtins.list[Any]:
            creates: builtins.list[builtins.list[tuple[str, CreateCall]]] = [[] for _ in plans]
            for position, call in calls:
                creates[owner[position]].append((attempts[position][1].key, call))
            fired[:] = self.store.fire_many([(*change, made) for change, made in zip(changes, creates, strict=True)], now)
            answers = [iter(done[1]) if done is not None else None for done in fired]
            return [None if (left := answers[owner[position]]) is None else next(left) for position, _ in calls]

        if not attempts:
            fire([])
            return 0
        made = self._start_all(attempts, within=fire)
        # Where a create was refused the script marked nothing: the others are marked here, as the
        # cluster's path marks them (a lost mark is made at the next look).
        marks = [
            (plan.record, keys)
            for plan, done in zip(plans, fired, strict=False)
            if done is not None and not done[0] and (keys := frozenset(a.key for a in plan.starts if a.key in made))
        ]
        if marks:
            self.store.mark_many(marks, now)
        return len(made)

    def _start_all(
        self,
        attempts: builtins.list[tuple[ScheduleRecord, Attempt]],
        within: Callable[[builtins.list[tuple[int, CreateCall]]], Sequence[Any]] | None = None,
    ) -> set[str]:
        """Start the attempts' flows in one batch (idempotent by their keys); the keys of those started.
        A failure is retried at the next look. ``within``: ``start_many``'s (the fire in one script)."""
        if not attempts:
            return set()
        try:
            # Trusted: the schedule's fields were read strictly at its creation (or change of amount);
            # the occurrence's orderId is still checked by its type, as every field's type and bounds.
            # Each schedule's charges on its own terminal (named only when one is not default).
            terminals = [record.spec.terminal or "default" for record, _ in attempts]
            extra = {"terminals": terminals} if any(name != "default" for name in terminals) else {}
            results = self.engine.start_many(
                [(self.flow_kind, attempt.data, attempt.key) for _, attempt in attempts],
                owners=[record.id for record, _ in attempts],
                trusted=True,
                within=within,
                **extra,
            )
        except Exception:  # Redis, or not durable in time: the next look starts them again
            log.exception("starting %d occurrence flows failed; the next look starts them again", len(attempts))
            return set()
        started = set()
        for (record, attempt), result in zip(attempts, results, strict=True):
            if isinstance(result, NotStarted):  # its schedule changed meanwhile: nothing was written
                continue
            if isinstance(result, Exception):
                log.error(
                    "schedule %s: starting %s (attempt %d) failed: %s", record.id, attempt.occurrence, attempt.attempt, result
                )
                continue
            if result != attempt.flow_id:
                log.error("schedule %s: flow id %s differs from the expected %s", record.id, result, attempt.flow_id)
            started.add(attempt.key)
        return started

    def next_due(self) -> datetime | None:
        """When the next schedule needs the scheduler (for tests and status pages)."""
        due = self.store.next_due()
        return datetime.fromtimestamp(due, UTC) if due is not None else None

    def finished(self, schedule_id: str) -> bool:
        return self.get(schedule_id).state in FINAL


def _mask_written(plan: policy.Plan) -> None:
    """An operator's words in what a change writes (the reason, who, the history's details) masked where
    they are written (``workflows.engine.sensitive``): a cancel reason "card 4349 ..." is never kept whole."""
    plan.events[:] = [mask(event) for event in plan.events]
    plan.record.reason = mask_text(plan.record.reason)
    if plan.record.last:
        plan.record.last = mask(plan.record.last)
