"""What a schedule does next: pure decisions from its record, the time, and the state of its charge flows.

The scheduler (``Schedules.tick``) reads a due schedule and the MIT flows of its open attempts, asks
:func:`advance` for a :class:`Plan` (the new record, history events, flows to start), writes the new
record with one compare-and-set and only then starts the flows. Only the writer that won the CAS starts
anything, and every flow is started under a key derived from (schedule, occurrence, attempt), so a second
scheduler, a replay or a crash between the write and the start never charges twice; a start that was
lost is redone at the next look, which finds the flow missing.

**Occurrences.** Each rule occurrence becomes attempt 0, an MIT flow keyed ``<schedule>@<occurrence>``
with gateway ``orderId`` ``<schedule>-<n>``. Occurrences missed while no scheduler ran follow the
schedule's ``missed`` policy: ``each`` fires every one, ``once`` fires one charge for all of them (keyed
by the latest), ``skip`` fires only those less than :data:`MISSED_GRACE` late. Occurrences before the
schedule was created never fire; those passing while it is paused, stopped or dunning are skipped.

**Started once, ever.** An attempt's flow, once seen to exist (``Attempt.created``, marked right after
its start and at every look), is never started again: a flow found missing then has expired (its
schedule was paused, or waited for a person, longer than the flows' retention), and its occurrence
stops the schedule for a person instead of charging again. The person checks the order at the gateway
and says what it shows (:func:`resolve`: ``charged`` or ``not_charged``), which closes the attempt;
until then :func:`resume` refuses, since its next look would only stop the schedule again.

**Dunning.** The scheduler looks at a started flow shortly after it starts, then on a backoff. A soft
decline (by ISO response code, ``gateway.decline_kind``) opens the next attempt at the first decline plus
``dunning[i]`` days (default 1, 3, 7): a fresh flow (key ``...#<i>``, ``orderId`` ``...-r<i>``, so a
fresh Idempotency-Key), started when due. While a retry is open the schedule is ``dunning`` and its
rule waits; a success resumes the rule at its next occurrence. A hard decline, or a soft one after the
last retry, stops the schedule in ``needs_attention``. Technical failures never reach here as declines:
the engine retries them inside the flow; a flow that still fails, or needs a person, stops the schedule.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from gateway import RESPONSE_CODES
from gateway._strict import did_you_mean
from workflows.engine import OperatorError
from workflows.keys import derived_id
from workflows.schedules.model import FINAL, Attempt, Resolution, ScheduleRecord, ScheduleState
from workflows.schedules.rules import iso
from workflows.states import STOPPED, FlowState
from workflows.store import FlowRecord

DAY = 86400.0
#: First look at a started flow after this many seconds, then doubling up to CHECK_MAX.
CHECK_FIRST = 30.0
CHECK_MAX = 3600.0
#: With ``missed: skip``, an occurrence later than this is skipped rather than fired.
MISSED_GRACE = 3600.0
#: A started flow still missing after this long was not lost on its way: it existed and expired.
LOST_START = 7 * DAY
#: At most this many charges are started per schedule per look (the rest at the next tick).
MAX_FIRE = 100
#: At most this many skipped occurrences are listed in one history event (all are counted).
LISTED = 50

S = ScheduleState
#: No flow found (the default of an operator action that looks at flows: every started flow is missing).
NO_FLOWS: Mapping[str, FlowRecord] = MappingProxyType({})


@dataclass
class Plan:
    record: ScheduleRecord
    events: list[dict[str, Any]] = field(default_factory=list)
    starts: list[Attempt] = field(default_factory=list)

    def event(self, now: float, name: str, **details: Any) -> None:
        self.events.append({"t": now, "event": name, **{k: v for k, v in details.items() if v is not None}})

    def bump(self, counter: str, by: int = 1) -> None:
        self.record.counts[counter] = self.record.counts.get(counter, 0) + by


def order_id(schedule_id: str, index: int, attempt: int) -> str:
    """The gateway orderId of an attempt: ``s1a2b3c4d5e6f-12`` then ``...-12-r1`` (27 characters at most)."""
    base = f"{schedule_id}-{index}"
    return base if attempt == 0 else f"{base}-r{attempt}"


def occurrence_key(schedule_id: str, occurrence: str, attempt: int) -> str:
    """The engine start key of an attempt: ``<schedule>@<occurrence>`` then ``...#<attempt>``."""
    base = f"{schedule_id}@{occurrence}"
    return base if attempt == 0 else f"{base}#{attempt}"


def new_attempt(record: ScheduleRecord, flow_kind: str, moment: datetime, index: int, attempt: int, due: float) -> Attempt:
    spec = record.spec
    occurrence = iso(moment)
    order: dict[str, Any] = {
        "orderId": order_id(record.id, index, attempt),
        "amount": str(spec.amount),
        "currency": spec.currency,
        "description": spec.description,
    }
    if spec.customerId:
        order["customerId"] = spec.customerId
    data: dict[str, Any] = {"order": order, "contractId": spec.contractId}
    if spec.captureType is not None:
        data["captureType"] = spec.captureType.value
    key = occurrence_key(record.id, occurrence, attempt)
    return Attempt(occurrence, index, attempt, key, derived_id("f", flow_kind, key), data, due)


def _retry_of(attempt: Attempt, record: ScheduleRecord, flow_kind: str, first: float) -> Attempt:
    number = attempt.attempt + 1
    key = occurrence_key(record.id, attempt.occurrence, number)
    data = copy.deepcopy(attempt.data)
    data["order"]["orderId"] = order_id(record.id, attempt.index, number)
    due = first + record.spec.dunning[attempt.attempt] * DAY
    return Attempt(
        attempt.occurrence, attempt.index, number, key, derived_id("f", flow_kind, key), data, due, first_decline=first
    )


def _start(plan: Plan, attempt: Attempt, now: float) -> None:
    attempt.started = True
    attempt.started_at = now
    attempt.checks = 0
    attempt.due = now + CHECK_FIRST
    plan.starts.append(attempt)
    plan.bump("retried" if attempt.attempt else "fired")
    plan.event(
        now,
        "retry started" if attempt.attempt else "fired",
        occurrence=attempt.occurrence,
        attempt=attempt.attempt,
        flow=attempt.flow_id,
        orderId=attempt.data["order"]["orderId"],
        amount=int(attempt.data["order"]["amount"]),
    )


def _ids(flow: FlowRecord) -> dict[str, Any]:
    """The gateway ids of a charge's flow (its order, and the operation that charged or was declined)."""
    operation = (flow.outcome or {}).get("operation") or {}
    return {
        "orderId": flow.order_id or None,
        "operationId": operation.get("operationId") or (flow.error or {}).get("operationId"),
    }


def _outcome(attempt: Attempt, flow: FlowRecord, result: str, now: float) -> dict[str, Any]:
    operation = (flow.outcome or {}).get("operation") or {}
    error = flow.error or {}
    return {
        "result": result,
        "occurrence": attempt.occurrence,
        "attempt": attempt.attempt,
        "flow": flow.id,
        "operationId": operation.get("operationId") or error.get("operationId"),
        "responseCode": error.get("responseCode") or operation.get("responseCode"),
        "decline": error.get("decline"),
        "at": now,
    }


def gone(attempt: Attempt, flow: FlowRecord | None, now: float) -> bool:
    """Whether ``attempt``'s flow existed and its record expired (kept longer than the flows' retention,
    paused or waiting for a person) before its outcome was read here: ``flow`` (as read) is missing and
    the flow was seen to exist, or was started longer than :data:`LOST_START` ago. Such a flow is never
    started again; only a person who checked the gateway can say what happened (:func:`resolve`)."""
    return attempt.started and flow is None and (attempt.created or now - (attempt.started_at or now) > LOST_START)


def gone_attempts(record: ScheduleRecord, flows: Mapping[str, FlowRecord], now: float) -> list[Attempt]:
    """The open attempts of ``record`` whose flows are gone (``flows``: the flows read, by id)."""
    return [attempt for attempt in record.open if gone(attempt, flows.get(attempt.flow_id), now)]


def _order(attempt: Attempt) -> str:
    return str(attempt.data["order"]["orderId"])


def _gone_reason(attempt: Attempt) -> str:
    return (
        f"the flow {attempt.flow_id} of {attempt.occurrence} is gone before its outcome was read; check order "
        f"{_order(attempt)} at the gateway, then resolve {attempt.occurrence} as charged or not_charged"
    )


def _look(plan: Plan, attempt: Attempt, flow: FlowRecord | None, now: float, flow_kind: str) -> tuple[list[Attempt], str]:
    """Judge one open attempt: (attempts still open, what happened: ``open``, ``charged``, ``stop:<reason>``)."""
    record = plan.record
    if not attempt.started:
        if attempt.due <= now:
            _start(plan, attempt, now)
        return [attempt], "open"
    if gone(attempt, flow, now):
        # Its outcome was never read here. Never start it again: it stays open, stopping the schedule,
        # until a person says what the gateway shows (``resolve``).
        plan.event(now, "outcome unknown", occurrence=attempt.occurrence, attempt=attempt.attempt, flow=attempt.flow_id)
        return [attempt], f"stop:{_gone_reason(attempt)}"
    if flow is None or flow.state not in STOPPED:
        attempt.created |= flow is not None
        if attempt.due <= now:
            attempt.checks += 1
            attempt.due = now + min(CHECK_FIRST * 2**attempt.checks, CHECK_MAX)
            if flow is None:
                plan.starts.append(attempt)  # written but never started (the starter died): start it now
        return [attempt], "open"
    if flow.state is FlowState.SUCCEEDED:
        plan.bump("charged")
        record.last = _outcome(attempt, flow, "charged", now)
        plan.event(now, "charged", occurrence=attempt.occurrence, attempt=attempt.attempt, flow=flow.id, **_ids(flow))
        return [], "charged"
    if flow.state is FlowState.NEEDS_ATTENTION:
        return [attempt], f"stop:flow {flow.id} of {attempt.occurrence} needs attention"
    if flow.state is FlowState.CANCELLED:
        plan.event(now, "occurrence cancelled", occurrence=attempt.occurrence, attempt=attempt.attempt, flow=flow.id)
        return [], "open"
    error = flow.error or {}
    if error.get("type") != "PaymentDeclined":
        record.last = _outcome(attempt, flow, "failed", now)
        plan.event(now, "failed", occurrence=attempt.occurrence, flow=flow.id, error=error.get("message") or error.get("type"))
        return [], f"stop:charge of {attempt.occurrence} failed: {error.get('message') or error.get('type') or 'unknown error'}"
    plan.bump("declined")
    record.last = _outcome(attempt, flow, "declined", now)
    code = error.get("responseCode")
    kind = "hard" if error.get("decline") == "hard" else "soft"
    text = f"{code} {RESPONSE_CODES.get(code or '', '')}".strip() if code else "no response code"
    plan.event(
        now,
        "declined",
        occurrence=attempt.occurrence,
        attempt=attempt.attempt,
        flow=flow.id,
        responseCode=code,
        decline=kind,
        **_ids(flow),
    )
    if kind == "hard":
        return [], f"stop:hard decline ({text}) on {attempt.occurrence}"
    if attempt.attempt >= len(record.spec.dunning):
        plan.event(now, "dunning exhausted", occurrence=attempt.occurrence, attempts=attempt.attempt + 1)
        return [], f"stop:dunning exhausted: {attempt.attempt + 1} attempts on {attempt.occurrence} declined (last {text})"
    retry = _retry_of(attempt, record, flow_kind, attempt.first_decline or flow.updated)
    plan.event(now, "retry scheduled", occurrence=attempt.occurrence, attempt=retry.attempt, at=iso(_utc(retry.due)))
    if retry.due <= now:
        _start(plan, retry, now)
    return [retry], "open"


def _utc(moment: float) -> datetime:
    return datetime.fromtimestamp(moment, UTC)


def _due_occurrences(
    record: ScheduleRecord, now: float, *, limit: int | None
) -> tuple[list[tuple[int, datetime]], datetime | None, int]:
    """Occurrences at or before ``now`` from ``next_at`` (at most ``limit``): (due, next after them, its seq)."""
    calendar = record.spec.calendar()
    count = record.spec.count
    moment = _utc(record.next_at) if record.next_at is not None else None
    seq = record.seq
    due: list[tuple[int, datetime]] = []
    while moment is not None and moment.timestamp() <= now and (limit is None or len(due) < limit):
        due.append((seq, moment))
        seq += 1
        moment = calendar.next_after(moment) if count is None or seq < count else None
    return due, moment, seq


def _move_to(record: ScheduleRecord, moment: datetime | None, seq: int) -> None:
    record.next_at = moment.timestamp() if moment is not None else None
    record.seq = seq


def skip_passed(plan: Plan, now: float, reason: str) -> None:
    """Skip every occurrence up to ``now`` (paused, stopped or dunning), recording them."""
    due, moment, seq = _due_occurrences(plan.record, now, limit=None)
    _move_to(plan.record, moment, seq)
    if due:
        plan.bump("skipped", len(due))
        plan.event(now, "skipped", reason=reason, count=len(due), occurrences=[iso(at) for _, at in due[:LISTED]])


def _fire_due(plan: Plan, now: float, flow_kind: str) -> None:
    record = plan.record
    policy = record.spec.missed
    due, moment, seq = _due_occurrences(record, now, limit=MAX_FIRE if policy == "each" else None)
    if not due:
        return
    late = [(index, at) for index, at in due if now - at.timestamp() > MISSED_GRACE]
    if policy == "each" or (policy == "once" and len(due) == 1):
        fire = due
    elif policy == "once":
        fire = due[-1:]
        plan.bump("coalesced", len(due) - 1)
    else:
        fire = [item for item in due if item not in late]
        plan.bump("skipped", len(late))
    if len(due) > 1 or late:
        plan.event(
            now,
            "missed",
            policy=policy,
            count=len(due),
            occurrences=[iso(at) for _, at in due[:LISTED]],
            fired=[iso(at) for _, at in fire[:LISTED]],
        )
    fired = [new_attempt(record, flow_kind, at, index, 0, now) for index, at in fire]
    for attempt in fired:
        _start(plan, attempt, now)
    record.open.extend(fired)
    _move_to(record, moment, seq)


def advance(record: ScheduleRecord, now: float, flows: Mapping[str, FlowRecord], flow_kind: str) -> Plan:
    """The scheduler's look at a due schedule (see the module docstring)."""
    plan = Plan(record.copy())
    current = plan.record
    if current.state not in (S.ACTIVE, S.DUNNING):
        return plan
    kept: list[Attempt] = []
    stop = ""
    for attempt in current.open:
        still, what = _look(plan, attempt, flows.get(attempt.flow_id), now, flow_kind)
        kept.extend(still)
        if what.startswith("stop:") and not stop:
            stop = what[5:]
    current.open = kept
    if stop:
        current.state = S.NEEDS_ATTENTION
        current.reason = stop
        plan.event(now, "needs attention", reason=stop)
        return plan
    current.state = S.DUNNING if any(attempt.attempt > 0 for attempt in kept) else S.ACTIVE
    if current.state is S.ACTIVE:
        if record.state is S.DUNNING:
            # Whatever ended the dunning (a success, a cancelled retry, a failure): the occurrences
            # that passed meanwhile are skipped, never fired all at once.
            skip_passed(plan, now, "dunning")
        _fire_due(plan, now, flow_kind)
        if current.next_at is None and not current.open:
            current.state = S.COMPLETED
            plan.event(now, "completed", occurrences=current.seq)
    return plan


# -- what an operator may do --------------------------------------------------------------------------


def pause(record: ScheduleRecord, now: float, by: str) -> Plan:
    plan = Plan(record.copy())
    if record.state not in (S.ACTIVE, S.DUNNING):
        raise OperatorError(f"schedule {record.id} is {record.state}; only an active or dunning schedule can be paused")
    plan.record.state = S.PAUSED
    plan.event(now, "paused", by=by)
    return plan


def resume(record: ScheduleRecord, now: float, by: str, flows: Mapping[str, FlowRecord] = NO_FLOWS) -> Plan:
    """Go on from now: occurrences passed meanwhile are skipped; open attempts are looked at at once.

    ``flows``: the flows of the open attempts as read now (missing: not found). A ``needs_attention``
    schedule with an attempt whose flow is gone is refused, naming the occurrence: the next look would
    only stop it again (no occurrence fired, however often it is resumed), and only a person who checked
    the gateway can close that attempt (:func:`resolve`). A *paused* schedule resumes: its first look
    finds the gone flow and stops it, once, saying so.
    """
    plan = Plan(record.copy())
    current = plan.record
    if record.state not in (S.PAUSED, S.NEEDS_ATTENTION):
        raise OperatorError(f"schedule {record.id} is {record.state}; only a paused or needs_attention schedule resumes")
    stuck = gone_attempts(record, flows, now) if record.state is S.NEEDS_ATTENTION else []
    if stuck:
        named = "; ".join(f"{a.occurrence} (flow {a.flow_id}, order {_order(a)})" for a in stuck)
        raise OperatorError(
            f"schedule {record.id} cannot resume: the flow of {named} is gone before its outcome was read, so the "
            f"next look would stop it again. Check the order at the gateway and resolve the occurrence first, "
            f"as charged or not_charged (durapay schedules resolve {record.id} {stuck[0].occurrence} charged|not_charged)"
        )
    plan.event(now, "resumed", by=by, was=record.state.value)
    current.reason = ""
    for attempt in current.open:
        if attempt.started:
            attempt.due = min(attempt.due, now)
    current.state = S.DUNNING if any(attempt.attempt > 0 for attempt in current.open) else S.ACTIVE
    skip_passed(plan, now, record.state.value)
    if current.next_at is None and not current.open:
        current.state = S.COMPLETED
        plan.event(now, "completed", occurrences=current.seq)
    return plan


def resolve(
    record: ScheduleRecord, now: float, resolution: Resolution, by: str, flows: Mapping[str, FlowRecord] = NO_FLOWS
) -> Plan:
    """An operator says what the gateway shows for an occurrence whose flow is gone (see :func:`gone`).

    ``charged``: counted as a charge (``last`` names it, with the operation id if given; a ``charged``
    history event, told to the merchant as ``schedule.charged``). ``not_charged``: closed without a
    charge (counted ``not_charged``; a ``not charged`` history event, with the operation found, if
    any). Either way the attempt is closed and its occurrence is never fired again: an occurrence is
    never charged twice, and a charge still owed is the merchant's to make (a new payment), not the
    schedule's. The schedule stays ``needs_attention`` until resumed.

    Refused for a schedule not in ``needs_attention``, an occurrence with no open attempt, and an attempt
    whose flow still exists (its own outcome decides, read at the next look) or was never seen to exist
    (the next look starts it, under the same key).
    """
    if record.state is not S.NEEDS_ATTENTION:
        raise OperatorError(
            f"schedule {record.id} is {record.state}; only an occurrence of a needs_attention schedule whose flow "
            "is gone can be resolved"
        )
    occurrence = resolution.occurrence
    resolvable = gone_attempts(record, flows, now)
    listed = ", ".join(a.occurrence for a in resolvable) or "none"
    found = [attempt for attempt in record.open if attempt.occurrence == occurrence]
    if not found:
        meant = did_you_mean(occurrence, [attempt.occurrence for attempt in record.open])
        raise OperatorError(
            f"schedule {record.id} has no open occurrence {occurrence!r}{meant}; occurrences whose flow is gone: {listed}"
        )
    attempt = found[0]
    flow = flows.get(attempt.flow_id)
    if flow is not None:
        then = " (retry or cancel that flow first)" if flow.state is FlowState.NEEDS_ATTENTION else ""
        raise OperatorError(
            f"the flow {flow.id} of {occurrence} still exists ({flow.state}): its own outcome decides, read by "
            f"the schedule's next look once resumed{then}"
        )
    if not gone(attempt, flow, now):
        what = "was not started yet" if not attempt.started else "was never seen to start (the next look starts it)"
        raise OperatorError(f"the flow {attempt.flow_id} of {occurrence} {what}: nothing to resolve")
    plan = Plan(record.copy())
    current = plan.record
    current.open = [kept for kept in current.open if kept.key != attempt.key]
    about = {"occurrence": occurrence, "attempt": attempt.attempt, "flow": attempt.flow_id}
    if resolution.outcome == "charged":
        plan.bump("charged")
        current.last = {
            "result": "charged",
            **about,
            "operationId": resolution.operationId,
            "responseCode": None,
            "decline": None,
            "at": now,
            "by": by,
        }
        plan.event(now, "charged", **about, orderId=_order(attempt), operationId=resolution.operationId, by=by, source="operator")
    else:
        plan.bump("not_charged")
        plan.event(
            now,
            "not charged",
            **about,
            orderId=_order(attempt),
            operationId=resolution.operationId,
            by=by,
            note="closed without a charge; never fired again",
        )
    if attempt.flow_id in record.reason:  # the stop was about this attempt: say what is left
        left = [a for a in resolvable if a.key != attempt.key]
        outcome = resolution.outcome
        current.reason = _gone_reason(left[0]) if left else f"{occurrence} resolved as {outcome} by {by}; resume to go on"
    return plan


def cancel(record: ScheduleRecord, now: float, by: str, reason: str) -> Plan:
    """Stop for good. Retries not yet started are dropped; charges already in flight run to their end."""
    plan = Plan(record.copy())
    if record.state in FINAL:
        raise OperatorError(f"schedule {record.id} is already {record.state}")
    current = plan.record
    in_flight = [attempt.flow_id for attempt in current.open if attempt.started]
    dropped = [f"{attempt.occurrence}#{attempt.attempt}" for attempt in current.open if not attempt.started]
    current.open = []
    current.state = S.CANCELLED
    current.reason = reason
    plan.event(now, "cancelled", by=by, reason=reason, inFlight=in_flight or None, dropped=dropped or None)
    return plan


def change_amount(record: ScheduleRecord, now: float, amount: int, by: str) -> Plan:
    """New occurrences charge ``amount``; retries of an occurrence already charged keep its amount."""
    if record.state in FINAL:
        raise OperatorError(f"schedule {record.id} is {record.state}; its amount can no longer change")
    plan = Plan(record.copy())
    plan.record.spec = record.spec.model_copy(update={"amount": amount})
    plan.event(now, "amount changed", by=by, previous=record.spec.amount, amount=amount)
    return plan


def first_occurrence(record: ScheduleRecord, now: float) -> datetime | None:
    """The first occurrence at or after ``now`` (occurrences before the schedule existed never fire)."""
    return record.spec.calendar().next_after(_utc(now) - timedelta(microseconds=1))
