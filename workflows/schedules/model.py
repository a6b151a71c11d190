"""What a schedule is: its input (validated once, at ``create``), its states, and its record in Redis.

The input uses the gateway's camelCase names where they are gateway fields (``contractId``,
``amount`` in minor units, ``currency``, ``description``, ``customerId``, ``captureType``). The record
keeps the input as ``spec`` plus what the scheduler has done: the next occurrence (``next_at``) and its
sequence number, the *open attempts* (charges started or waiting for their dunning retry), counters,
the last outcome and the reason of a stop.
"""

from __future__ import annotations

import copy as _copy
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gateway import Amount, CaptureType, Currency, StrictModel, check_amount
from workflows.schedules.rules import ZONES, Calendar, Rule, instant, iso, zone

DEFAULT_DUNNING = (1, 3, 7)


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


class ScheduleState(StrEnum):
    """``active`` fires by its rule; ``dunning`` holds the rule while a declined charge is retried;
    ``paused`` fires nothing; ``needs_attention`` stopped after a hard decline, exhausted dunning or a
    failure only a person can judge (``resume`` or ``cancel`` moves it on); ``completed`` and
    ``cancelled`` are final."""

    ACTIVE = "active"
    DUNNING = "dunning"
    PAUSED = "paused"
    NEEDS_ATTENTION = "needs_attention"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


#: States in which the scheduler looks at the schedule (it is on the due set).
RUNNING = frozenset({ScheduleState.ACTIVE, ScheduleState.DUNNING})
FINAL = frozenset({ScheduleState.COMPLETED, ScheduleState.CANCELLED})


class ScheduleInput(StrictModel):
    """A recurring merchant-initiated charge of ``contractId`` (merchant input: unknown fields refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    contractId: str = Field(min_length=1, max_length=255)
    amount: Amount = Field(ge=1, description="minor units (1500 = 15.00 EUR)")
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
        try:
            check_amount(self.amount, self.currency)
        except ValueError as exc:
            raise ValueError(f"amount: {exc}") from None
        calendar = self.calendar()
        if calendar.end is not None and calendar.end < calendar.start:
            raise ValueError("end: must not be before start")
        if calendar.first() is None:
            raise ValueError("rule: never fires between start and end")
        return self

    def calendar(self) -> Calendar:
        tz = zone(self.timezone)
        end = instant(self.end, tz, end_of_day=True) if self.end is not None else None
        return Calendar(self.rule, tz, instant(self.start, tz), end)

    def dumped(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


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

    @classmethod
    def parse(cls, item: Mapping[str, Any]) -> Attempt:
        return cls(**dict(item))


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

    @classmethod
    def parse(cls, raw: Mapping[bytes, bytes]) -> ScheduleRecord:
        data = {key.decode(): value.decode() for key, value in raw.items()}
        return cls(
            id=data["id"],
            state=ScheduleState(data["state"]),
            version=int(data["version"]),
            created=float(data["created"]),
            updated=float(data.get("updated") or data["created"]),
            spec=ScheduleInput.model_validate_json(data["spec"], context={"stored": True}),
            next_at=float(data["next_at"]) if data.get("next_at") else None,
            seq=int(data.get("seq") or 0),
            open=[Attempt.parse(item) for item in json.loads(data.get("open") or "[]")],
            counts=json.loads(data.get("counts") or "{}"),
            last=json.loads(data["last"]) if data.get("last") else None,
            reason=data.get("reason", ""),
            start_key=data.get("start_key", ""),
        )

    def copy(self) -> ScheduleRecord:
        """A copy that can change without touching this one (the policy changes the copy and the store
        compares against the original), cheaper than ``deepcopy``: each attempt and its ``data`` are
        copied, ``counts`` holds numbers and ``last`` plain values (one level each is enough); ``spec`` is
        shared, as it is frozen and holds only immutable values (a change of amount replaces it)."""
        return replace(
            self,
            open=[replace(attempt, data=_copy.deepcopy(attempt.data)) for attempt in self.open],
            counts=dict(self.counts),
            last=dict(self.last) if self.last else None,
        )

    def fields(self) -> dict[str, str]:
        """The hash fields that the scheduler and the operator change (not id, created, spec...)."""
        return {
            "spec": self.spec.model_dump_json(exclude_none=True),
            "next_at": repr(self.next_at) if self.next_at is not None else "",
            "seq": str(self.seq),
            # vars(), not asdict(): asdict deep-copies every value only for json to read it once
            "open": json.dumps([vars(attempt) for attempt in self.open], separators=(",", ":")),
            "counts": json.dumps(self.counts, separators=(",", ":"), sort_keys=True),
            "last": json.dumps(self.last, separators=(",", ":")) if self.last else "",
            "reason": self.reason,
        }

    def due(self) -> float | None:
        """When the scheduler must look at this schedule next (None: not on the due set)."""
        if self.state not in RUNNING:
            return None
        times = [attempt.due for attempt in self.open]
        if self.state is ScheduleState.ACTIVE and self.next_at is not None:
            times.append(self.next_at)
        return min(times) if times else None

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
            "description": self.spec.description,
            "rule": spec["rule"],
            "timezone": self.spec.timezone,
            "start": spec["start"],
            "end": spec.get("end"),
            "count": self.spec.count,
            "missed": self.spec.missed,
            "dunning": list(self.spec.dunning),
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


#: What ``summary()["counts"]`` reports: occurrences fired, charges that succeeded, declines, dunning
#: retries started, occurrences skipped (missed with "skip", passed while paused or dunning) and
#: occurrences folded into one charge by the "once" policy.
COUNTERS = ("fired", "charged", "declined", "retried", "skipped", "coalesced")
