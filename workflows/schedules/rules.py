"""When a schedule fires: its rule, in its time zone, from its start to its end. Pure arithmetic, no I/O.

A rule is one of ``{"every": "days", "interval": N}``, ``{"every": "month", "day": D}``,
``{"every": "week", "weekday": "monday"}`` or ``{"cron": "0 9 * * 1-5"}``. Occurrences are computed in
*wall-clock time* of the schedule's IANA zone and only then turned into instants, so "09:00 in Rome"
stays 09:00 across daylight-saving changes (the interval between two daily occurrences is then 23 or
25 hours). The time of day of the day-based rules is the start's. Two rules settle the DST edge cases:

* a wall time that does not exist (the hour skipped in spring) is read with the offset before the
  change, i.e. it moves forward by the gap: 02:30 on the spring-forward night fires at 03:30;
* a wall time that happens twice (the hour repeated in autumn) fires once, at its first instant.

Instants are therefore strictly increasing; a wall time that lands on an instant already passed (two
cron times folded onto one instant by the gap) is dropped, never fired twice.

A monthly day past the month's end clamps to its last day (31 → 30 April, 28 or 29 February) without
drifting: the next month is on day D again. ``end`` is inclusive (a date means the whole local day).
``count`` is applied by :func:`occurrences`; a running schedule counts with its own sequence number.
"""

from __future__ import annotations

import calendar as _calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
Weekday = Literal["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]

#: A rule that finds no occurrence in this many steps is treated as exhausted (e.g. cron "0 0 30 2 *").
MAX_STEPS = 100_000


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EveryDays(_Rule):
    every: Literal["days"]
    interval: int = Field(default=1, ge=1, le=3660)


class Monthly(_Rule):
    every: Literal["month"]
    day: int = Field(ge=1, le=31)


class Weekly(_Rule):
    every: Literal["week"]
    weekday: Weekday


#: Five cron fields separated by single spaces (the API's document states the same pattern).
CRON_PATTERN = r"^[0-9A-Za-z*,/?#-]+( [0-9A-Za-z*,/?#-]+){4}$"


class Cron(_Rule):
    cron: str = Field(
        json_schema_extra={"pattern": CRON_PATTERN},
        description="five fields separated by spaces: minute hour day-of-month month day-of-week",
    )

    @field_validator("cron")
    @classmethod
    def _valid(cls, value: str) -> str:
        if not re.match(CRON_PATTERN, value):
            raise ValueError("must have five fields: minute hour day-of-month month day-of-week")
        if not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a valid cron expression")
        return value


def _rule_tag(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return type(value).__name__.lower()
    if not isinstance(value, dict):
        return None
    if "cron" in value:
        return "cron"
    return {"days": "everydays", "month": "monthly", "week": "weekly"}.get(str(value.get("every")))


Rule = Annotated[
    Annotated[EveryDays, Tag("everydays")]
    | Annotated[Monthly, Tag("monthly")]
    | Annotated[Weekly, Tag("weekly")]
    | Annotated[Cron, Tag("cron")],
    Discriminator(
        _rule_tag,
        custom_error_type="rule",
        custom_error_message='must be {"every": "days", "interval": N}, {"every": "month", "day": D}, '
        '{"every": "week", "weekday": "monday"} or {"cron": "m h dom mon dow"}',
    ),
]


#: The IANA zones a schedule may name (the tz database this Python reads), for the API's document.
ZONES = sorted(available_timezones())
_KNOWN_ZONES = frozenset(ZONES)


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ValueError naming it when unknown."""
    try:
        if name not in _KNOWN_ZONES:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not an IANA time zone (e.g. Europe/Rome, America/New_York, UTC)") from None


def instant(value: datetime | date, tz: ZoneInfo, *, end_of_day: bool = False) -> datetime:
    """``value`` as an aware UTC instant: a date is its local midnight (or its last microsecond with
    ``end_of_day``), a naive datetime is local wall time, an aware one is kept."""
    if not isinstance(value, datetime):
        moment = datetime.combine(value, time())
        if end_of_day:
            moment += timedelta(days=1, microseconds=-1)
        value = moment
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    return value.astimezone(UTC)


def to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """A naive local wall time as a UTC instant (fold=0: the earlier reading; see the module docstring)."""
    return wall.replace(tzinfo=tz, fold=0).astimezone(UTC)


@dataclass(frozen=True)
class Calendar:
    """The occurrences of ``rule`` in ``tz`` from ``start`` (inclusive) to ``end`` (inclusive, optional)."""

    rule: EveryDays | Monthly | Weekly | Cron
    tz: ZoneInfo
    start: datetime
    end: datetime | None = None
    # Set by __post_init__ (not fields: not compared, not shown).
    _before_start: datetime = field(init=False, repr=False, compare=False)
    _local: datetime = field(init=False, repr=False, compare=False)
    _clock: time = field(init=False, repr=False, compare=False)
    _first_day: date = field(init=False, repr=False, compare=False)
    _step_days: int = field(init=False, repr=False, compare=False)

    def first(self) -> datetime | None:
        return self.next_after(self._before_start)

    def next_after(self, after: datetime) -> datetime | None:
        """The first occurrence strictly after ``after`` (and not before ``start``), or None past ``end``."""
        threshold = max(after, self._before_start)
        found = self._cron_after(threshold) if isinstance(self.rule, Cron) else self._stepped_after(threshold)
        if found is None or (self.end is not None and found > self.end):
            return None
        return found

    def iterate(self, after: datetime | None = None) -> Iterator[datetime]:
        """Every occurrence after ``after`` (from the start when None), in order, up to ``end``."""
        current = self.next_after(after) if after is not None else self.first()
        while current is not None:
            yield current
            current = self.next_after(current)

    # -- the day-based rules: candidate n is a wall time computed directly, found by stepping ------

    def __post_init__(self) -> None:
        # What every candidate needs from the start (its local wall time, time of day, first day, step)
        # is computed once per calendar, not once per candidate.
        local = self.start.astimezone(self.tz).replace(tzinfo=None, fold=0)
        first = local.date()
        if isinstance(self.rule, Weekly):
            first += timedelta(days=(WEEKDAYS.index(self.rule.weekday) - local.weekday()) % 7)
        for name, value in (
            ("_before_start", self.start - timedelta(microseconds=1)),
            ("_local", local),
            ("_clock", local.time()),
            ("_first_day", first),
            ("_step_days", self.rule.interval if isinstance(self.rule, EveryDays) else 7),
        ):
            object.__setattr__(self, name, value)

    def _candidate(self, n: int) -> datetime:
        if isinstance(self.rule, Monthly):
            local = self._local
            months = local.year * 12 + local.month - 1 + n
            year, month = divmod(months, 12)
            last = _calendar.monthrange(year, month + 1)[1]
            return datetime.combine(date(year, month + 1, min(self.rule.day, last)), self._clock)
        return datetime.combine(self._first_day + timedelta(days=self._step_days * n), self._clock)

    def _estimate(self, threshold: datetime) -> int:
        """A candidate index at or before the answer (so stepping forward from it finds it)."""
        local = self._local
        target = threshold.astimezone(self.tz).replace(tzinfo=None)
        if isinstance(self.rule, Monthly):
            months = (target.year - local.year) * 12 + target.month - local.month
            return max(0, months - 1)
        days = (target.date() - local.date()).days
        return max(0, days // self._step_days - 1)

    def _stepped_after(self, threshold: datetime) -> datetime | None:
        n = self._estimate(threshold)
        for _ in range(MAX_STEPS):
            found = to_utc(self._candidate(n), self.tz)
            if found > threshold:
                return found
            n += 1
        return None

    # -- cron: walk wall times with croniter, keep the first whose instant is past the threshold -------

    def _cron_after(self, threshold: datetime) -> datetime | None:
        assert isinstance(self.rule, Cron)
        # Start a few hours back: a wall time in a spring gap reads as an instant after it, so a wall
        # time earlier than the threshold's own may still be the next occurrence.
        base = threshold.astimezone(self.tz).replace(tzinfo=None, fold=0) - timedelta(hours=3)
        walker = croniter(self.rule.cron, base)
        for _ in range(MAX_STEPS):
            try:
                wall = walker.get_next(datetime)
            except Exception:  # noqa: BLE001 - croniter gives up on expressions that never match
                return None
            found = to_utc(wall, self.tz)
            if found > threshold:
                return found
        return None


def occurrences(calendar: Calendar, *, count: int | None = None, limit: int = 1000) -> list[datetime]:
    """The first occurrences of ``calendar`` (at most ``count`` when given, and at most ``limit``)."""
    wanted = min(count, limit) if count is not None else limit
    found: list[datetime] = []
    for moment in calendar.iterate():
        if len(found) >= wanted:
            break
        found.append(moment)
    return found


def upcoming(calendar: Calendar, n: int, *, now: datetime | None = None, count: int | None = None) -> list[datetime]:
    """The next ``n`` occurrences after ``now`` (the current time when None), within ``count`` from the start."""
    moment = now or datetime.now(UTC)
    if count is None:
        return [at for _, at in zip(range(n), calendar.iterate(moment), strict=False)]
    return [at for at in occurrences(calendar, count=count, limit=count) if at > moment][:n]


def iso(moment: datetime) -> str:
    """An instant as ``2026-01-31T09:00:00Z`` (the form used in flow keys and history)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
