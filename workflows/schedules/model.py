"""What a schedule is: its input (validated once, at ``create``), its states, and its record in Redis.

The input uses the gateway's camelCase names where they are gateway fields (``contractId``,
``amount`` in minor units, ``currency``, ``description``, ``customerId``, ``captureType``). The record
keeps the input as ``spec`` plus what the scheduler has done: the next occurrence (``next_at``) and its
sequence number, the *open attempts* (charges started or waiting for their dunning retry), counters,
the last outcome and the reason of a stop.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from durapay.gateway import GATEWAY_ZONE, Amount, CaptureType, Currency, StrictModel, check_amount
from durapay.gateway._strict import unknown_value
from durapay.workflows.engine import CardIdentifier, compact_sorted, mask_text, refuse_card_identifiers
from durapay.workflows.engine.jsonform import compact
from durapay.workflows.schedules.rules import ZONES, Calendar, Rule, first_closer, instant, iso, zone

DEFAULT_DUNNING = (1, 3, 7)
_T = TypeVar("_T")


#: How a stored spec is read back: checked when the schedule was created (``ScheduleInput._window``).
STORED = {"stored": True}


def _when(value: Any) -> Any:
    """``"2026-01-31"`` stays a date (a whole local day); anything longer is a datetime."""
    if isinstance(value, str) and len(value) == 10:
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO date (YYYY-MM-DD)") from None
    return value


#: An ISO date (``2026-01-31``: local midnight, or the whole day for ``end``) or datetime (naive = local).
When = Annotated[datetime | date, BeforeValidator(_when)]


def gateway_day(moment: datetime) -> date:
    """The date ``moment`` falls on for the gateway, which counts a contract's days between payments:
    calendar dates in UTC+01:00, the zone of its operation times, whatever the hour (docs/gateway.md)."""
    return moment.astimezone(GATEWAY_ZONE).date()


class ScheduleState(StrEnum):
    """``active`` fires by its rule; ``dunning`` holds the rule while a declined charge is retried;
    ``paused`` fires nothing; ``needs_attention`` stopped after a hard decline, exhausted dunning or a
    failure only a person can judge (``resume`` or ``cancel`` moves it on; an occurrence whose flow is
    gone is resolved first: ``resolve``); ``completed`` and ``cancelled`` are final."""

    ACTIVE = "active"
    DUNNING = "dunning"
    PAUSED = "paused"
    NEEDS_ATTENTION = "needs_attention"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


#: States in which the scheduler looks at the schedule (it is on the due set).
RUNNING = frozenset({ScheduleState.ACTIVE, ScheduleState.DUNNING})
FINAL = frozenset({ScheduleState.COMPLETED, ScheduleState.CANCELLED})


#: The one cross-field refusal the OpenAPI document can state (``missed: each`` with a contract frequency):
#: clients generated from it, and the API's fuzz test, then know it is not a valid request.
_NOT_EACH_WITH_A_FREQUENCY: JsonDict = {
    "not": {
        "required": ["missed", "contractFrequency"],
        "properties": {"missed": {"const": "each"}, "contractFrequency": {"type": "integer"}},
    }
}


class ScheduleInput(StrictModel):
    """A recurring merchant-initiated charge of ``contractId`` (merchant input: unknown fields refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_NOT_EACH_WITH_A_FREQUENCY)

    contractId: str = Field(min_length=1, max_length=255)
    amount: Amount = Field(ge=1)  # described by Amount: its bound in each currency
    currency: Currency
    description: str = Field(min_length=1, max_length=255)
    customerId: str | None = Field(default=None, max_length=27)
    rule: Rule
    timezone: str = Field(default="UTC", json_schema_extra={"enum": [*ZONES]})
    start: When
    end: When | None = None
    count: int | None = Field(default=None, ge=1)
    missed: Literal["once", "each", "skip"] = "once"
    dunning: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        default=DEFAULT_DUNNING, max_length=12, description="retry after these days (increasing)"
    )
    captureType: CaptureType | None = None
    terminal: str | None = Field(
        default=None,
        max_length=32,
        description="the gateway terminal every charge of it runs on (DURAPAY_TERMINALS; none: default), whose key "
        "made the contract: another terminal's key would not find it",
    )
    contractFrequency: int | None = Field(
        default=None,
        ge=1,
        le=9999,
        description="the contract's contractFrequency (days), as its first payment created it (MIT_SCHEDULED): "
        "the gateway refuses a charge fewer days after the contract's last payment, so a rule whose "
        "occurrences can fall closer is refused here, and a charge that would come too early waits",
    )

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("dunning")
    @classmethod
    def _increasing(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(days < 1 for days in value):
            raise ValueError("every delay must be at least 1 day")
        if any(later <= earlier for earlier, later in itertools.pairwise(value)):
            raise ValueError("delays count from the first decline, so they must increase (e.g. [1, 3, 7])")
        return value

    @model_validator(mode="after")
    def _window(self, info: ValidationInfo) -> ScheduleInput:
        if info.context and info.context.get("stored"):
            return self  # read back from Redis: checked when it was created
        try:  # its contractId and customerId are shown whole: neither may be a card number
            refuse_card_identifiers(self.model_dump(mode="json"))
        except CardIdentifier as exc:
            raise PydanticCustomError("card_identifier", "{reason}", {"reason": exc.reason, "field": exc.field}) from None
        try:
            check_amount(self.amount, self.currency)
        except ValueError as exc:
            raise ValueError(f"amount: {exc}") from None
        calendar = self.calendar()
        if calendar.end is not None and calendar.end < calendar.start:
            raise ValueError("end: must not be before start")
        if calendar.first() is None:
            raise ValueError("rule: never fires between start and end")
        if self.contractFrequency is not None:
            self._spacing(calendar, self.contractFrequency)
        return self

    def _spacing(self, calendar: Calendar, days: int) -> None:
        """Refuse what the gateway would refuse on a contract of ``contractFrequency`` days: occurrences
        closer than that (in the gateway's days), and missed occurrences fired together."""
        close = first_closer(calendar, gateway_day, days, count=self.count)
        if close is not None:
            earlier, later = (gateway_day(moment) for moment in close)
            raise ValueError(
                f"rule: occurrences fall {(later - earlier).days} days apart ({earlier} and {later}, the gateway's "
                f"days), fewer than the contract's contractFrequency of {days}: the gateway refuses a charge made "
                f"sooner. Use a rule whose occurrences are at least {days} days apart (e.g. "
                f'{{"every": "days", "interval": {days}}}; a monthly rule has months of 28 days), or a contract '
                f"created with a contractFrequency of at most {(later - earlier).days}"
            )
        if self.missed == "each":
            raise ValueError(
                f"missed: each fires missed occurrences together, fewer than the contractFrequency of {days} days "
                'apart: use "once" or "skip"'
            )

    def calendar(self) -> Calendar:
        tz = zone(self.timezone)
        end = instant(self.end, tz, end_of_day=True) if self.end is not None else None
        start = self.start
        wall = start if isinstance(start, datetime) and start.tzinfo is None else None
        if not isinstance(start, datetime):
            wall = datetime.combine(start, time())
        return Calendar(self.rule, tz, instant(start, tz), end, wall)

    def dumped(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


#: What an operator may say the gateway shows for an occurrence whose flow is gone (``Resolution``).
OUTCOMES = ("charged", "not_charged")


def _occurrence(value: str) -> str:
    """An occurrence as the schedule lists it (``2026-01-31T08:00:00Z``): any ISO datetime with a UTC offset
    is read as that instant (``2026-01-31T09:00:00+01:00`` is the same occurrence). Anything else is kept
    as given: it names no open occurrence, and the refusal says which ones there are (no JSON schema can
    say what parses as a datetime, so the document's string stays the rule here)."""
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text
    return iso(moment) if moment.tzinfo is not None else text


class Resolution(StrictModel):
    """What the gateway shows for an occurrence whose charge flow is gone before its outcome was read
    (operator input: unknown fields and values refused, naming the closest known one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    occurrence: Annotated[str, Field(min_length=1, max_length=40), AfterValidator(_occurrence)] = Field(
        description="the occurrence as the schedule lists it (open attempts, history), e.g. 2026-01-31T08:00:00Z "
        "(another UTC offset names the same instant)"
    )
    outcome: Literal["charged", "not_charged"] = Field(
        description="charged: the gateway took the money (counted as a charge); not_charged: it did not (the "
        "occurrence is closed without a charge and never fired again)"
    )
    operationId: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        pattern=r"^\S+$",
        description="the gateway operation found for the occurrence, if any: with charged, the one that charged "
        "it; with not_charged, e.g. a declined one (kept in the history)",
    )

    @field_validator("outcome", mode="before")
    @classmethod
    def _known_outcome(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in OUTCOMES:
            raise unknown_value(value, OUTCOMES)
        return value


@dataclass
class Attempt:
    """One charge of one occurrence: attempt 0 is the charge itself, 1.. its dunning retries.

    ``flow_id`` is known before the flow is started (it derives from ``key``), so the record says what
    must exist before it does: a scheduler that died between writing and starting is caught up at the
    next check, which finds the flow missing and starts it with the same key and input. Once the flow
    is known to exist (``created``), a missing flow means an expired one, never a lost start: the
    occurrence is never started again (the gateway's idempotency window is not forever).
    """

    occurrence: str
    index: int
    attempt: int
    key: str
    flow_id: str
    data: dict[str, Any]
    due: float
    started: bool = False
    first_decline: float | None = None
    checks: int = 0
    #: The flow was seen to exist (right after its start, or at a look): it is never started again, even
    #: once its record has expired. When it was started (to tell a lost start from an expired flow).
    created: bool = False
    started_at: float | None = None
    #: Declines of this occurrence before this attempt: which dunning delay comes next. An attempt may
    #: also follow a failure that was no decline (charged again at ``resume``). None in attempts written
    #: before it was kept: their attempt number, as then.
    declined: int | None = None

    @classmethod
    def parse(cls, item: Mapping[str, Any]) -> Attempt:
        return cls(**item)

    def declines(self) -> int:
        return self.attempt if self.declined is None else self.declined


def _tree(value: Any) -> Any:
    """A copy of JSON-like ``value`` (dicts, lists, scalars): ``deepcopy`` without its memo."""
    if isinstance(value, dict):
        return {key: _tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_tree(item) for item in value]
    return value


def _shallow(value: _T) -> _T:
    """A shallow copy of a dataclass instance (``copy.copy`` and ``dataclasses.replace`` cost four times as much)."""
    clone = object.__new__(type(value))
    clone.__dict__.update(value.__dict__)
    return clone


def _copy_attempt(attempt: Attempt) -> Attempt:
    clone = _shallow(attempt)
    clone.data = _tree(attempt.data)
    return clone


def _text(value: bytes | None) -> str:
    return value.decode() if value else ""


def open_json(attempts: list[Attempt], created: frozenset[str] = frozenset()) -> str:
    """The ``open`` field: the attempts as JSON, those whose key is in ``created`` marked created."""
    # vars(), not asdict(): asdict deep-copies every value only for json to read it once
    items = [{**vars(attempt), "created": True} if attempt.key in created else vars(attempt) for attempt in attempts]
    return compact(items)


@dataclass
class ScheduleRecord:
    """One schedule as read from Redis."""

    id: str
    state: ScheduleState
    version: int
    created: float
    updated: float
    spec: ScheduleInput
    next_at: float | None
    seq: int
    open: list[Attempt] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    last: dict[str, Any] | None = None
    reason: str = ""
    start_key: str = ""
    #: What the dunning caps and the contract's frequency count from: ``paid`` (when the schedule's last
    #: charge was seen made), ``retries`` (when each retry of the last 30 days started), ``declines``
    #: (when each decline of the last day was seen).
    ledger: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[bytes, bytes | None]) -> ScheduleRecord:
        """The record from its hash as read (``HGETALL``: field name -> bytes)."""
        record = cls.read([raw.get(name) for name in _RECORD_KEYS])
        if record is None:
            raise KeyError("id")
        return record

    @classmethod
    def read(cls, values: Sequence[bytes | None]) -> ScheduleRecord | None:
        """The record from ``HMGET <record> *RECORD_FIELDS`` (None: no such schedule). Each field is read as
        it is, nothing else decoded (``int``, ``float`` and ``json`` read bytes; the spec's JSON goes to
        pydantic as it is)."""
        id_, state, version, created, updated, spec, next_at, seq, opened, counts, last, reason, start_key, ledger = values
        if id_ is None:
            return None
        return cls(
            id=id_.decode(),
            state=ScheduleState(_text(state)),
            version=int(version or 0),
            created=float(created or 0),
            updated=float(updated or created or 0),
            spec=ScheduleInput.model_validate_json(spec or b"", context=STORED),
            next_at=float(next_at) if next_at else None,
            seq=int(seq or 0),
            open=[Attempt.parse(item) for item in json.loads(opened)] if opened and opened != b"[]" else [],
            counts=json.loads(counts) if counts and counts != b"{}" else {},
            last=json.loads(last) if last else None,
            reason=_text(reason),
            start_key=_text(start_key),
            ledger=json.loads(ledger) if ledger and ledger != b"{}" else {},
        )

    def copy(self) -> ScheduleRecord:
        """A copy that can change without touching this one (the policy changes the copy and the store
        compares against the original), cheaper than ``deepcopy``: each attempt and its ``data`` are
        copied, ``counts`` holds numbers and ``last`` plain values (one level each is enough); ``spec`` is
        shared, as it is frozen and holds only immutable values (a change of amount replaces it)."""
        clone = _shallow(self)
        clone.open = [_copy_attempt(attempt) for attempt in self.open]
        clone.counts = dict(self.counts)
        clone.last = dict(self.last) if self.last else None
        clone.ledger = {name: list(value) if isinstance(value, list) else value for name, value in self.ledger.items()}
        return clone

    def fields(self, since: ScheduleRecord | None = None) -> dict[str, str]:
        """The hash fields that the scheduler and the operator change (not id, created, spec...); with
        ``since`` (the record as stored), only those that differ from it: a compare-and-set sends and
        writes no more (the spec, a few hundred bytes of JSON, changes only with the amount)."""
        fields = {
            "next_at": repr(self.next_at) if self.next_at is not None else "",
            "seq": str(self.seq),
            "open": open_json(self.open),
        }
        if since is None or self.reason != since.reason:
            fields["reason"] = self.reason
        if since is None or (self.spec is not since.spec and self.spec != since.spec):
            fields["spec"] = self.spec.model_dump_json(exclude_none=True)
        if since is None or self.counts != since.counts:
            fields["counts"] = compact_sorted(self.counts)
        if since is None or self.last != since.last:
            fields["last"] = compact(self.last) if self.last else ""
        if since is None or self.ledger != since.ledger:
            fields["ledger"] = compact_sorted(self.ledger)
        return fields

    def due(self) -> float | None:
        """When the scheduler must look at this schedule next (None: not on the due set). A cancelled
        schedule is looked at until its charges in flight have ended (their outcome is counted and told)."""
        if self.state not in RUNNING and self.state is not ScheduleState.CANCELLED:
            return None
        times = [attempt.due for attempt in self.open]
        if self.fires() and self.next_at is not None:
            times.append(self.next_at)
        return min(times) if times else None

    def ended(self) -> bool:
        """Completed or cancelled with nothing in flight: nothing will change it again, and it is kept for
        the schedules' retention only (``store``)."""
        return self.state in FINAL and self.due() is None

    def fires(self) -> bool:
        """Whether the rule fires its next occurrence when due: an active schedule does, unless its contract
        has a frequency and a charge is open (one charge at a time: each moves the date the contract
        allows next)."""
        return self.state is ScheduleState.ACTIVE and not (self.spec.contractFrequency and self.open)

    def summary(self) -> dict[str, Any]:
        """A JSON-able view: id, state, rule, next run, counts, last outcome, open attempts."""
        tz = zone(self.spec.timezone)

        def local(moment: float | None) -> str | None:
            return datetime.fromtimestamp(moment, UTC).astimezone(tz).isoformat() if moment is not None else None

        spec = self.spec.dumped()
        return {
            "id": self.id,
            "state": self.state.value,
            "contractId": self.spec.contractId,
            "amount": self.spec.amount,
            "currency": self.spec.currency,
            "description": mask_text(self.spec.description),  # a card number typed in it is never shown
            "rule": spec["rule"],
            "timezone": self.spec.timezone,
            "start": spec["start"],
            "end": spec.get("end"),
            "count": self.spec.count,
            "missed": self.spec.missed,
            "dunning": list(self.spec.dunning),
            "terminal": self.spec.terminal or "default",  # the gateway terminal its charges run on
            "nextRun": iso(datetime.fromtimestamp(self.next_at, UTC)) if self.next_at is not None else None,
            "nextRunLocal": local(self.next_at),
            "occurrences": self.seq,
            "counts": {name: self.counts.get(name, 0) for name in COUNTERS},
            "last": self.last,
            "open": [
                {"occurrence": a.occurrence, "attempt": a.attempt, "flow": a.flow_id, "started": a.started, "due": local(a.due)}
                for a in self.open
            ],
            "reason": self.reason or None,
            "created": self.created,
            "updated": self.updated,
            "key": self.start_key or None,
        }


#: The hash fields a record is read from (all but ``input_hash``, which only ``create`` compares), in the
#: order ``ScheduleRecord.read`` unpacks them.
RECORD_FIELDS = (
    "id",
    "state",
    "version",
    "created",
    "updated",
    "spec",
    "next_at",
    "seq",
    "open",
    "counts",
    "last",
    "reason",
    "start_key",
    "ledger",
)
_RECORD_KEYS = tuple(name.encode() for name in RECORD_FIELDS)

#: What ``summary()["counts"]`` reports: occurrences fired, charges that succeeded, declines, dunning
#: retries started, occurrences skipped (missed with "skip", passed while paused or dunning) and
#: occurrences folded into one charge by the "once" policy, and occurrences whose flow was gone that an
#: operator closed as not charged at the gateway (``Schedules.resolve``: never fired again).
COUNTERS = ("fired", "charged", "declined", "retried", "skipped", "coalesced", "not_charged")
