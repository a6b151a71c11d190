"""What a schedule does next: pure decisions from its record, the time, and the state of its charge flows.

The scheduler (``Schedules.tick``) reads a due schedule and the MIT flows of its open attempts, asks
:func:`advance` for a :class:`Plan` (the new record, history events, flows to start), writes the new
record with one compare-and-set and only then starts the flows. Only the writer that won the CAS starts
anything, and every flow is started under a key derived from (schedule, occurrence, attempt), so a second
scheduler, a replay or a crash between the write and the start never charges twice; a start that was
lost is redone at the next look, which finds the flow missing.

**Occurrences.** Each rule occurrence becomes attempt 0, an MIT flow keyed ``<schedule>@<occurrence>``
with gateway ``orderId`` :func:`order_id` (18 characters). Occurrences missed while no scheduler ran
follow the schedule's ``missed`` policy: ``each`` fires every one, ``once`` fires one charge for all of
them (keyed by the latest), ``skip`` fires only those less than :data:`MISSED_GRACE` late. Occurrences
before the schedule was created never fire; those passing while it is paused, stopped or dunning are
skipped. Occurrences that passed are counted, not walked (:func:`passed`).

**Started once, ever.** An attempt's flow, once seen to exist (``Attempt.created``, marked right after
its start and at every look), is never started again: a flow found missing then has expired (its
schedule was paused, or waited for a person, longer than the flows' retention), and its occurrence
stops the schedule for a person instead of charging again. The person checks the order at the gateway
and says what it shows (:func:`resolve`: ``charged`` or ``not_charged``), which closes the attempt;
until then :func:`resume` refuses, since its next look would only stop the schedule again.

**Dunning.** The scheduler looks at a started flow shortly after it starts, then on a backoff. A soft
decline (by ISO response code, ``gateway.decline_kind``) opens the next attempt at the first decline plus
``dunning[i]`` days (default 1, 3, 7), and never sooner after the previous decline than the delays are
apart: a fresh flow (key ``...#<i>``, its own ``orderId``, so a fresh Idempotency-Key), started when due
and when the dunning caps allow it (retries in 30 days, declines in a day: ``SchedulesSettings``, from
the card networks' limits). While a retry is open the schedule is ``dunning`` and its rule waits; a
success resumes the rule at its next occurrence. A hard decline, a decline without a response code, a
soft one after the last retry, or a retry the caps forbid, stops the schedule in ``needs_attention``.
Technical failures never reach here as declines: the engine retries them inside the flow; a flow that
still fails, or needs a person, stops the schedule, and a failed occurrence (nothing charged) stays
owed: ``resume`` charges it again.

**A contract's frequency.** With ``contractFrequency`` (days), no charge starts fewer gateway days after
the schedule's last charge (:func:`earliest`: it waits, at the same time of day), and one charge is open
at a time (``ScheduleRecord.fires``). The gateway counts from the contract's last payment, whoever made
it: a contract charged elsewhere too is beyond what a schedule can see.

**Cancel.** Charges not started are dropped; those in flight are still followed to their end, counted
and told, never retried.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from durapay.config.settings import SchedulesSettings
from durapay.gateway import RESPONSE_CODES
from durapay.gateway._strict import did_you_mean
from durapay.workflows.engine import STOPPED, FlowRecord, FlowState, OperatorError, derived_id
from durapay.workflows.schedules.model import FINAL, Attempt, Resolution, ScheduleRecord, ScheduleState, gateway_day
from durapay.workflows.schedules.rules import iso

#: The flow kind every occurrence starts (``workflows.flows.direct.MIT``).
MIT_KIND = "mit"
DAY = 86400.0
#: Looks at a started flow: the first ``DURAPAY_SCHEDULES__CHECK_SECONDS`` after its start, then at
#: doubling intervals up to this.
CHECK_MAX = 3600.0
#: With ``missed: skip``, an occurrence later than this is skipped rather than fired.
MISSED_GRACE = 3600.0
#: A started flow still missing after this long was not lost on its way: it existed and expired.
LOST_START = 7 * DAY
#: At most this many charges are started per schedule per look (the rest at the next tick).
MAX_FIRE = 100
#: At most this many skipped occurrences are listed in one history event (all are counted).
LISTED = 50
#: The length of every schedule order id: the gateway's longest orderId as two client libraries written
#: for the live gateway have it (mlocati's and Hyperswitch's Nexi connector; another document says 27),
#: the default of DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH (``Schedules`` refuses a shorter setting).
ORDER_ID_LENGTH = 18
#: What an order id has room for after the schedule's 13 characters: four base-36 digits of occurrence
#: number (1,679,616 occurrences: 16 years of a rule firing every five minutes) and one of attempt.
MAX_INDEX = 36**4
MAX_ATTEMPT = 36
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"

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


def _base36(number: int, width: int) -> str:
    digits = ""
    for _ in range(width):
        number, digit = divmod(number, 36)
        digits = _DIGITS[digit] + digits
    return digits


def order_id(schedule_id: str, index: int, attempt: int) -> str:
    """The gateway orderId of an attempt: the schedule's id, then the occurrence's number in four base-36
    digits and the attempt in one: ``s1a2b3c4d5e6f`` ``000b`` ``2`` is the second retry of occurrence 11,
    18 characters (:data:`ORDER_ID_LENGTH`) for any number the schedule allows.

    Unique per (schedule, occurrence, attempt): schedule ids are unique and all 13 characters long, and
    the two numbers have fixed widths, so two different triples never give one id (nor one of the earlier
    form, ``<id>-<n>-r<k>``, which has a ``-``). ValueError past :data:`MAX_INDEX` or :data:`MAX_ATTEMPT`:
    the policy stops a schedule before it gets there."""
    if not (0 <= index < MAX_INDEX and 0 <= attempt < MAX_ATTEMPT):
        raise ValueError(f"occurrence {index} attempt {attempt}: an order id has room for {MAX_INDEX} and {MAX_ATTEMPT}")
    return f"{schedule_id}{_base36(index, 4)}{_base36(attempt, 1)}"


#: A schedule's order id: this form (:func:`order_id`), or the earlier ``<schedule>-<n>[-r<k>]``.
_ORDER_ID = re.compile(r"(s[0-9a-f]{12})(?:([0-9a-z]{4})([0-9a-z])|-([0-9]+)(?:-r([0-9]+))?)")


def order_parts(order: str) -> tuple[str, int, int] | None:
    """(schedule, occurrence number, attempt) of a schedule's order id, in either form; None for another
    order id. What checks of "one charge per occurrence" read an order id with."""
    found = _ORDER_ID.fullmatch(order)
    if found is None:
        return None
    schedule, index, attempt, old_index, old_attempt = found.groups()
    if index is not None:
        return schedule, int(index, 36), int(attempt, 36)
    return schedule, int(old_index), int(old_attempt or 0)


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
    return Attempt(occurrence, index, attempt, key, derived_id("f", flow_kind, key), data, due, declined=0)


def _next_attempt(attempt: Attempt, record: ScheduleRecord, flow_kind: str, due: float, declined: int) -> Attempt:
    """The occurrence's next charge: a fresh flow (key ``...#<k>``, its own orderId and Idempotency-Key)."""
    number = attempt.attempt + 1
    key = occurrence_key(record.id, attempt.occurrence, number)
    data = copy.deepcopy(attempt.data)
    data["order"]["orderId"] = order_id(record.id, attempt.index, number)
    return Attempt(
        attempt.occurrence,
        attempt.index,
        number,
        key,
        derived_id("f", flow_kind, key),
        data,
        due,
        first_decline=attempt.first_decline,
        declined=declined,
    )


def _retry_of(attempt: Attempt, record: ScheduleRecord, flow_kind: str, declined_at: float) -> Attempt:
    """The dunning retry after ``attempt``'s decline (seen at ``declined_at``): ``dunning[i]`` days after
    the occurrence's first decline, and never sooner after this decline than the delays are apart (a
    schedule held past its retries' dates, paused or down, spaces them again instead of firing them back
    to back); then no sooner than the contract allows (:func:`earliest`)."""
    first = attempt.first_decline if attempt.first_decline is not None else declined_at
    delays = record.spec.dunning
    index = attempt.declines()
    gap = delays[index] - (delays[index - 1] if index else 0)
    due = earliest(record, max(first + delays[index] * DAY, declined_at + gap * DAY))
    retry = _next_attempt(attempt, record, flow_kind, due, index + 1)
    retry.first_decline = first
    return retry


def earliest(record: ScheduleRecord, moment: float) -> float:
    """The first moment from ``moment`` (same time of day, whole days later) at which the contract allows
    a charge: ``contractFrequency`` gateway days after the schedule's last charge (the gateway counts
    dates in UTC+01:00 from the contract's last payment, and refuses sooner; a decline is no payment)."""
    days = record.spec.contractFrequency
    paid = record.ledger.get("paid")
    if days is None or paid is None:
        return moment
    allowed = gateway_day(_utc(paid)) + timedelta(days=days)
    short = (allowed - gateway_day(_utc(moment))).days
    return moment + short * DAY if short > 0 else moment


def _recent(record: ScheduleRecord, name: str, now: float, window: float) -> list[float]:
    """The times kept under ``name`` in the ledger that are less than ``window`` old."""
    return [moment for moment in record.ledger.get(name, []) if now - moment < window]


def _note(record: ScheduleRecord, name: str, now: float, window: float) -> None:
    record.ledger[name] = [*_recent(record, name, now, window), now]


def _capped(record: ScheduleRecord, now: float, caps: SchedulesSettings) -> str:
    """Why the dunning caps forbid a retry now ("" when they allow it)."""
    retries = len(_recent(record, "retries", now, 30 * DAY))
    if retries >= caps.retries_per_30_days:
        return (
            f"dunning capped: {retries} retries started in the last 30 days, the most "
            f"DURAPAY_SCHEDULES__RETRIES_PER_30_DAYS allows ({caps.retries_per_30_days}; Visa allows 15 reattempts of a "
            "declined charge in 30 days)"
        )
    declines = len(_recent(record, "declines", now, DAY))
    if declines >= caps.declines_per_day:
        return (
            f"dunning capped: {declines} declines in the last 24 hours, the most DURAPAY_SCHEDULES__DECLINES_PER_DAY "
            f"allows ({caps.declines_per_day}; Mastercard: 10 declines of one card in 24 hours)"
        )
    return ""


def _start(plan: Plan, attempt: Attempt, now: float, caps: SchedulesSettings) -> None:
    attempt.started = True
    attempt.started_at = now
    attempt.checks = 0
    attempt.due = now + caps.check_seconds
    plan.starts.append(attempt)
    if attempt.first_decline is not None:
        _note(plan.record, "retries", now, 30 * DAY)
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


def _begin(plan: Plan, attempt: Attempt, now: float, caps: SchedulesSettings) -> str:
    """Start ``attempt`` when it is due and the contract and the dunning caps allow it: "" (started or
    waiting), or why the schedule must stop (a retry the caps forbid)."""
    if attempt.due > now:
        return ""
    allowed = earliest(plan.record, attempt.due)
    if allowed > now:
        attempt.due = allowed
        plan.event(
            now, "waits for the contract", occurrence=attempt.occurrence, attempt=attempt.attempt, until=iso(_utc(allowed))
        )
        return ""
    capped = _capped(plan.record, now, caps) if attempt.first_decline is not None else ""
    if capped:
        plan.event(now, "dunning capped", occurrence=attempt.occurrence, attempt=attempt.attempt, reason=capped)
        return capped
    _start(plan, attempt, now, caps)
    return ""


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


def failed(attempt: Attempt, flow: FlowRecord | None) -> bool:
    """Whether ``attempt``'s flow ended ``failed`` for a reason other than a decline (the gateway refused
    the charge, or it failed for good): nothing was charged, and the occurrence is still owed."""
    return (
        attempt.started
        and flow is not None
        and flow.state is FlowState.FAILED
        and (flow.error or {}).get("type") != "PaymentDeclined"
    )


def _order(attempt: Attempt) -> str:
    return str(attempt.data["order"]["orderId"])


def _gone_reason(attempt: Attempt) -> str:
    return (
        f"the flow {attempt.flow_id} of {attempt.occurrence} is gone before its outcome was read; check order "
        f"{_order(attempt)} at the gateway, then resolve {attempt.occurrence} as charged or not_charged"
    )


def _decline_text(code: str | None) -> str:
    return f"{code} {RESPONSE_CODES.get(code or '', '')}".strip() if code else "no response code"


def _look(
    plan: Plan, attempt: Attempt, flow: FlowRecord | None, now: float, flow_kind: str, caps: SchedulesSettings
) -> tuple[list[Attempt], str]:
    """Judge one open attempt: (attempts still open, what happened: ``open``, ``charged``, ``stop:<reason>``).
    For a cancelled schedule (its charges in flight followed to their end) outcomes are counted and told,
    and nothing is started."""
    record = plan.record
    cancelled = record.state is S.CANCELLED
    if not attempt.started:
        stop = _begin(plan, attempt, now, caps)
        return ([], f"stop:{stop}") if stop else ([attempt], "open")
    if gone(attempt, flow, now):
        # Its outcome was never read here. Never start it again: it stays open, stopping the schedule,
        # until a person says what the gateway shows (``resolve``).
        plan.event(now, "outcome unknown", occurrence=attempt.occurrence, attempt=attempt.attempt, flow=attempt.flow_id)
        if cancelled:
            return [], "open"
        return [attempt], f"stop:{_gone_reason(attempt)}"
    if flow is None or flow.state not in STOPPED or (cancelled and flow.state is FlowState.NEEDS_ATTENTION):
        attempt.created |= flow is not None
        if attempt.due <= now:
            attempt.checks += 1
            attempt.due = now + min(caps.check_seconds * 2**attempt.checks, CHECK_MAX)
            if flow is None and not cancelled:
                plan.starts.append(attempt)  # written but never started (the starter died): start it now
        return [attempt], "open"
    if flow.state is FlowState.SUCCEEDED:
        plan.bump("charged")
        record.last = _outcome(attempt, flow, "charged", now)
        record.ledger["paid"] = max(flow.updated, record.ledger.get("paid") or 0.0)
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
        message = error.get("message") or error.get("type") or "unknown error"
        plan.event(now, "failed", occurrence=attempt.occurrence, attempt=attempt.attempt, flow=flow.id, error=message)
        if cancelled:
            return [], "open"
        # Nothing was charged and the occurrence is still owed: it stays open, and resume charges it again
        # (the engine refuses a retry of a schedule's failed charge and sends the operator here).
        return [attempt], f"stop:charge of {attempt.occurrence} failed: {message}; fix the cause, then resume to charge it again"
    plan.bump("declined")
    _note(record, "declines", now, DAY)
    record.last = _outcome(attempt, flow, "declined", now)
    code = error.get("responseCode")
    kind = error.get("decline")
    text = _decline_text(code)
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
    if cancelled:
        return [], "open"
    if kind != "soft":
        # Only a decline known to pass later is retried: a hard one never, and one without a response
        # code neither (a card reported stolen may be declined without one: retrying it is what the card
        # networks forbid and fine, and only a person can tell).
        what = "hard decline" if kind == "hard" else "decline not known to be temporary"
        return [], f"stop:{what} ({text}) on {attempt.occurrence}: not retried"
    if attempt.declines() >= len(record.spec.dunning):
        plan.event(now, "dunning exhausted", occurrence=attempt.occurrence, attempts=attempt.attempt + 1)
        return [], f"stop:dunning exhausted: {attempt.attempt + 1} attempts on {attempt.occurrence} declined (last {text})"
    if attempt.attempt + 1 >= MAX_ATTEMPT:
        return [], f"stop:{attempt.occurrence} was charged {attempt.attempt + 1} times, the most its order ids allow"
    retry = _retry_of(attempt, record, flow_kind, flow.updated)
    plan.event(now, "retry scheduled", occurrence=attempt.occurrence, attempt=retry.attempt, at=iso(_utc(retry.due)))
    stop = _begin(plan, retry, now, caps)
    return ([], f"stop:{stop}") if stop else ([retry], "open")


def _utc(moment: float) -> datetime:
    return datetime.fromtimestamp(moment, UTC)


def _due_occurrences(
    record: ScheduleRecord, now: float, *, limit: int
) -> tuple[list[tuple[int, datetime]], datetime | None, int]:
    """Occurrences at or before ``now`` from ``next_at``, walked (at most ``limit``): (due, next after
    them, its seq)."""
    calendar = record.spec.calendar()
    count = record.spec.count
    moment = _utc(record.next_at) if record.next_at is not None else None
    seq = record.seq
    due: list[tuple[int, datetime]] = []
    while moment is not None and moment.timestamp() <= now and len(due) < limit:
        due.append((seq, moment))
        seq += 1
        moment = calendar.next_after(moment) if count is None or seq < count else None
    return due, moment, seq


@dataclass
class Passed:
    """The occurrences from ``next_at`` up to now: how many (``count``), the first :data:`LISTED` of them
    with their numbers, the last one, and the next occurrence after now with its number."""

    count: int
    listed: list[tuple[int, datetime]]
    last: tuple[int, datetime] | None
    following: datetime | None
    seq: int


def passed(record: ScheduleRecord, now: float) -> Passed:
    """What passed since ``next_at``, in time proportional to what is kept (the listed ones, the last, the
    next), not to what passed: beyond the first :data:`LISTED`, occurrences are counted by the calendar
    (``Calendar.count_between``) and the last one found by halving (``last_until``, ``nth``), never walked."""
    listed, moment, seq = _due_occurrences(record, now, limit=LISTED)
    if moment is None or moment.timestamp() > now:
        return Passed(len(listed), listed, listed[-1] if listed else None, moment, seq)
    calendar = record.spec.calendar()
    until = _utc(now)
    following = calendar.next_after(until)
    more = calendar.count_between(moment, following or until + timedelta(microseconds=1))
    total = len(listed) + more
    count = record.spec.count
    if count is not None and record.seq + total >= count:  # the count ends among them
        more = count - seq
        total = len(listed) + more
        following = None
        last = calendar.nth(moment, more - 1, until + timedelta(microseconds=1))
    else:
        last = calendar.last_until(moment, until)
    return Passed(total, listed, (record.seq + total - 1, last), following, record.seq + total)


def _move_to(record: ScheduleRecord, moment: datetime | None, seq: int) -> None:
    record.next_at = moment.timestamp() if moment is not None else None
    record.seq = seq


def skip_passed(plan: Plan, now: float, reason: str) -> None:
    """Skip every occurrence up to ``now`` (paused, stopped or dunning), recording them."""
    gone_by = passed(plan.record, now)
    _move_to(plan.record, gone_by.following, gone_by.seq)
    if gone_by.count:
        plan.bump("skipped", gone_by.count)
        plan.event(now, "skipped", reason=reason, count=gone_by.count, occurrences=[iso(at) for _, at in gone_by.listed])


def _late_ones(record: ScheduleRecord, gone_by: Passed, now: float) -> list[tuple[int, datetime]]:
    """The passed occurrences less than :data:`MISSED_GRACE` late, with their numbers (the ``skip`` policy
    fires those; at most :data:`MAX_FIRE`)."""
    calendar = record.spec.calendar()
    first, (_, last) = gone_by.listed[0][1], gone_by.last or gone_by.listed[-1]
    moment = calendar.next_after(max(first, _utc(now - MISSED_GRACE)) - timedelta(microseconds=1))
    seq = record.seq + calendar.count_between(first, moment) if moment is not None else 0
    found: list[tuple[int, datetime]] = []
    for _ in range(MAX_FIRE):
        if moment is None or moment > last:
            break
        found.append((seq, moment))
        seq += 1
        moment = calendar.next_after(moment)
    return found


def _fire_due(plan: Plan, now: float, flow_kind: str, caps: SchedulesSettings) -> str:
    """Fire the occurrences due by the ``missed`` policy; "" or why the schedule must stop."""
    record = plan.record
    policy = record.spec.missed
    unfired: dict[str, int] = {}  # occurrences the policy did not fire, by counter
    if policy == "each":
        due, moment, seq = _due_occurrences(record, now, limit=MAX_FIRE)
        fire, count, listed = due, len(due), due
    else:
        gone_by = passed(record, now)
        moment, seq, count, listed = gone_by.following, gone_by.seq, gone_by.count, gone_by.listed
        if not count:
            return ""
        last = [gone_by.last] if gone_by.last is not None else []
        fire = last if policy == "once" else _late_ones(record, gone_by, now)
        if count > len(fire):
            unfired["coalesced" if policy == "once" else "skipped"] = count - len(fire)
    for counter, by in unfired.items():
        plan.bump(counter, by)
    if not count:
        return ""
    if count > 1 or any(now - at.timestamp() > MISSED_GRACE for _, at in listed):
        # It says what it did not fire, as the record counted it: a capped history sums it up from here
        # (schedules/lua/update.lua).
        plan.event(
            now,
            "missed",
            policy=policy,
            count=count,
            occurrences=[iso(at) for _, at in listed[:LISTED]],
            fired=[iso(at) for _, at in fire[:LISTED]],
            **unfired,
        )
    if any(index >= MAX_INDEX for index, _ in fire):
        return f"occurrence {max(index for index, _ in fire)} is past the {MAX_INDEX} a schedule's order ids have room for"
    # Due at the occurrence itself: one the contract does not allow yet waits at the rule's time of day.
    fired = [new_attempt(record, flow_kind, at, index, 0, at.timestamp()) for index, at in fire]
    for attempt in fired:
        _begin(plan, attempt, now, caps)
    record.open.extend(fired)
    _move_to(record, moment, seq)
    return ""


def advance(record: ScheduleRecord, now: float, flows: Mapping[str, FlowRecord], flow_kind: str, caps: SchedulesSettings) -> Plan:
    """The scheduler's look at a due schedule (see the module docstring); ``caps``: the dunning caps."""
    plan = Plan(record.copy())
    current = plan.record
    if current.state not in (S.ACTIVE, S.DUNNING, S.CANCELLED) or (current.state is S.CANCELLED and not current.open):
        return plan
    kept: list[Attempt] = []
    stop = ""
    for attempt in current.open:
        still, what = _look(plan, attempt, flows.get(attempt.flow_id), now, flow_kind, caps)
        kept.extend(still)
        if what.startswith("stop:") and not stop:
            stop = what[5:]
    current.open = kept
    if current.state is S.CANCELLED:
        return plan  # its charges in flight followed to their end; nothing else
    if not stop:
        current.state = S.DUNNING if any(attempt.attempt > 0 for attempt in kept) else S.ACTIVE
        if current.state is S.ACTIVE:
            if record.state is S.DUNNING:
                # Whatever ended the dunning (a success, a cancelled retry, a failure): the occurrences
                # that passed meanwhile are skipped, never fired all at once.
                skip_passed(plan, now, "dunning")
            if current.fires():
                stop = _fire_due(plan, now, flow_kind, caps)
    if stop:
        current.state = S.NEEDS_ATTENTION
        current.reason = stop
        plan.event(now, "needs attention", reason=stop)
        return plan
    if current.state is S.ACTIVE and current.next_at is None and not current.open:
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


def resume(
    record: ScheduleRecord, now: float, by: str, flows: Mapping[str, FlowRecord] = NO_FLOWS, flow_kind: str = MIT_KIND
) -> Plan:
    """Go on from now: occurrences passed meanwhile are skipped; open attempts are looked at at once, and
    an occurrence whose flow failed for a reason other than a decline is charged again (:func:`_again`).

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
    current.open = [
        _again(plan, attempt, now, flow_kind) if failed(attempt, flows.get(attempt.flow_id)) else attempt
        for attempt in current.open
    ]
    for attempt in current.open:
        if attempt.started:
            attempt.due = min(attempt.due, now)
    current.state = S.DUNNING if any(attempt.attempt > 0 for attempt in current.open) else S.ACTIVE
    skip_passed(plan, now, record.state.value)
    if current.next_at is None and not current.open:
        current.state = S.COMPLETED
        plan.event(now, "completed", occurrences=current.seq)
    return plan


def _again(plan: Plan, attempt: Attempt, now: float, flow_kind: str) -> Attempt:
    """A fresh charge of an occurrence whose flow failed for a reason other than a decline (nothing was
    charged): resuming means the cause was seen to, and the occurrence is still owed. Not a dunning retry
    (no decline to count)."""
    if attempt.attempt + 1 >= MAX_ATTEMPT:
        raise OperatorError(f"{attempt.occurrence} was charged {attempt.attempt + 1} times, the most its order ids allow")
    again = _next_attempt(attempt, plan.record, flow_kind, now, attempt.declines())
    again.first_decline = None
    plan.event(now, "charge again", occurrence=attempt.occurrence, attempt=again.attempt, failed=attempt.flow_id)
    return again


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
        current.ledger["paid"] = max(now, current.ledger.get("paid") or 0.0)  # when is not known: now, the later
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
    """Stop for good. Charges not yet started are dropped; started ones stay open, and their flows are
    cancelled next (``Schedules.cancel``: one that sent nothing ends cancelled, one whose call may have
    been sent ends as the gateway says): the scheduler still follows them (``advance``), so what they
    charge or decline is counted and told (``schedule.charged``, ``schedule.declined``), and nothing is
    retried or fired."""
    plan = Plan(record.copy())
    if record.state in FINAL:
        raise OperatorError(f"schedule {record.id} is already {record.state}")
    current = plan.record
    in_flight = [attempt.flow_id for attempt in current.open if attempt.started]
    dropped = [f"{attempt.occurrence}#{attempt.attempt}" for attempt in current.open if not attempt.started]
    current.open = [attempt for attempt in current.open if attempt.started]
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
