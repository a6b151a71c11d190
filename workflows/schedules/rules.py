"""When a schedule fires: its rule, in its time zone, from its start to its end. Pure arithmetic, no I/O.

A rule is one of ``{"every": "days", "interval": N}``, ``{"every": "month", "day": D}``,
``{"every": "week", "weekday": "monday"}`` or ``{"cron": "0 9 * * 1-5"}``. Occurrences are computed in
*wall-clock time* of the schedule's IANA zone and only then turned into instants, so "09:00 in Rome"
stays 09:00 across daylight-saving changes (the interval between two daily occurrences is then 23 or
25 hours). The time of day of the day-based rules is the start's, as it was given: a start of
``2026-03-29T02:30`` in Rome (a wall time that night skips) fires at 03:30 that night and at 02:30 every
day after, and a date-only start on a day whose midnight is skipped fires at 01:00 that day and at
midnight after. Two rules settle the DST edge cases:

* a wall time that does not exist (the hour skipped in spring) is read with the offset before the
  change, i.e. it moves forward by the gap: 02:30 on the spring-forward night fires at 03:30, that night
  only;
* a wall time that happens twice (the hour repeated in autumn) fires once, at its first instant.

Instants are therefore strictly increasing; a wall time that lands on an instant already passed (two
cron times folded onto one instant by the gap) is dropped, never fired twice.

A monthly day past the month's end clamps to its last day (31 → 30 April, 28 or 29 February) without
drifting: the next month is on day D again. ``end`` is inclusive (a date means the whole local day).
``count`` is applied by :func:`occurrences`; a running schedule counts with its own sequence number.

Occurrences that passed are counted, not walked (:meth:`Calendar.count_between`, :meth:`Calendar.last_until`,
:meth:`Calendar.nth`): a schedule that skips a week of a rule firing every minute evaluates the rule a
few times per day skipped, not ten thousand times.
"""

from __future__ import annotations

import calendar as _calendar
import re
from bisect import bisect_left
from collections.abc import Callable, Iterator
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
#: A spring change skips at most this much wall time (the tz database's largest gap is Samoa's skipped day
#: of 2011): a cron walk starts back by the gap of a change this recent, if there was one.
GAP_WINDOW = timedelta(days=1)
#: How far a rule's spacing is checked at creation (:func:`first_closer`): four years hold every pair of
#: month lengths and a leap day; at most this many occurrences.
SPACING_HORIZON = timedelta(days=4 * 366)
SPACING_LIMIT = 1500
_TICK = timedelta(microseconds=1)


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
    """The occurrences of ``rule`` in ``tz`` from ``start`` (inclusive) to ``end`` (inclusive, optional).

    ``wall``: the start as the wall time it was given in (naive), when it was one. A wall time in a spring
    gap names an instant whose own wall time is later (02:30 is read as 03:30), and the day-based rules
    keep the time of day given, not the shifted one. Used only while it names ``start`` (a calendar
    changed with ``dataclasses.replace`` to another start reads that start's own wall time).
    """

    rule: EveryDays | Monthly | Weekly | Cron
    tz: ZoneInfo
    start: datetime
    end: datetime | None = None
    wall: datetime | None = None
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
        if self.wall is not None and to_utc(self.wall, self.tz) == self.start:
            local = self.wall.replace(tzinfo=None, fold=0)
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
        # A wall time in a spring gap reads as an instant in the gap's length after the change, so one
        # earlier than the threshold's own may still be the next occurrence: within that length after a
        # change, start back by the gap. Otherwise start at the threshold's own wall time (a walk of a
        # few steps: starting hours back cost a frequent rule hundreds of steps per occurrence).
        local = threshold.astimezone(self.tz)
        gap = max(_offset(local) - _offset((threshold - GAP_WINDOW).astimezone(self.tz)), timedelta(0))
        if gap and _offset((threshold - gap).astimezone(self.tz)) == _offset(local):
            gap = timedelta(0)  # the change is more than its gap ago
        walker = croniter(self.rule.cron, local.replace(tzinfo=None, fold=0) - gap)
        for _ in range(MAX_STEPS):
            try:
                wall = walker.get_next(datetime)
            except Exception:  # noqa: BLE001 - croniter gives up on expressions that never match
                return None
            found = to_utc(wall, self.tz)
            if found > threshold:
                return found
        return None

    # -- counting what passed without walking it ------------------------------------------------------

    def count_between(self, first: datetime, stop: datetime) -> int:
        """How many occurrences fall in [``first``, ``stop``), ``first`` not before the start. Computed, not
        walked: the day-based rules by candidate number, cron per local day (:meth:`_cron_count`)."""
        if self.end is not None:
            stop = min(stop, self.end + _TICK)
        if stop <= first:
            return 0
        if isinstance(self.rule, Cron):
            return self._cron_count(first, stop)
        return self._index(stop) - self._index(first)

    def last_until(self, floor: datetime, until: datetime) -> datetime:
        """The last occurrence at or before ``until``, ``floor`` being one (at or before it). Found by
        halving the time between them (about 45 looks across a year), never by walking the occurrences."""
        found, high = floor, until
        for _ in range(MAX_STEPS):
            after = self.next_after(found)
            if after is None or after > high:
                return found
            middle = after + (high - after) / 2
            beyond = self.next_after(middle)
            if beyond is not None and beyond <= high:
                found = beyond
            else:  # nothing in (middle, high]: the last one is at or before middle
                found, high = after, middle
        return found

    def nth(self, first: datetime, k: int, beyond: datetime) -> datetime:
        """The occurrence ``k`` after ``first`` (an occurrence; 0 is ``first``), ``beyond`` being a moment
        with more than ``k`` occurrences in [``first``, ``beyond``). Found by halving that time with
        :meth:`count_between`, never by walking the occurrences."""
        low, high = first, beyond  # occurrences in [first, low) <= k < occurrences in [first, high)
        for _ in range(MAX_STEPS):
            if high - low <= _TICK:
                break
            middle = low + (high - low) / 2
            if self.count_between(first, middle) > k:
                high = middle
            else:
                low = middle
        return low  # the one occurrence in [low, high): the k-th

    def _index(self, moment: datetime) -> int:
        """How many candidates (of a day-based rule, from candidate 0) come before ``moment``."""
        n = self._estimate(moment - _TICK)
        for _ in range(MAX_STEPS):
            if to_utc(self._candidate(n), self.tz) >= moment:
                break
            n += 1
        return n

    def _cron_count(self, first: datetime, stop: datetime) -> int:
        """Occurrences of a cron rule in [``first``, ``stop``), per local day, never per occurrence. The next
        day with any occurrence is found by the rule (one evaluation per such day); on a day whose UTC
        offset does not change, the occurrences are the rule's times of day in range (its minutes and
        hours, counted); a day with a change (a gap moves or drops wall times) is walked."""
        assert isinstance(self.rule, Cron)
        minutes, hours = croniter(self.rule.cron).expanded[:2]
        times = sorted(
            hour * 3600 + minute * 60
            for hour in (range(24) if hours == ["*"] else [int(value) for value in hours])
            for minute in (range(60) if minutes == ["*"] else [int(value) for value in minutes])
        )
        day = first.astimezone(self.tz).date()
        last = (stop - _TICK).astimezone(self.tz).date()
        total = 0
        for _ in range(MAX_STEPS):
            try:
                found = croniter(self.rule.cron, datetime.combine(day, time()) - timedelta(seconds=1)).get_next(datetime)
            except Exception:  # noqa: BLE001 - croniter gives up on expressions that never match
                break
            day = found.date()
            if day > last:
                break
            opens = to_utc(datetime.combine(day, time()), self.tz)
            closes = to_utc(datetime.combine(day + timedelta(days=1), time()), self.tz)
            low, high = max(first, opens), min(stop, closes)
            steady = closes - opens == timedelta(days=1) and _offset(opens.astimezone(self.tz)) == _offset(
                (closes - _TICK).astimezone(self.tz)
            )
            if steady:  # wall time is time since the day opened
                since = [(moment - opens).total_seconds() for moment in (low, high)]
                total += bisect_left(times, since[1]) - bisect_left(times, since[0])
            else:
                moment = self.next_after(low - _TICK)
                for _ in range(2 * len(times) + 1):  # the day's wall times (and a gap's from the day before)
                    if moment is None or moment >= high:
                        break
                    total += 1
                    moment = self.next_after(moment)
            day += timedelta(days=1)
        return total


def _offset(moment: datetime) -> timedelta:
    return moment.utcoffset() or timedelta(0)


def first_closer(
    calendar: Calendar, day: Callable[[datetime], date], days: int, *, count: int | None = None
) -> tuple[datetime, datetime] | None:
    """The first two consecutive occurrences fewer than ``days`` apart, counted in dates by ``day`` (the
    date a moment falls on for whoever counts: the gateway's), or None. Checked over the first
    :data:`SPACING_HORIZON` of the calendar (every pair of month lengths, a leap day) and at most
    :data:`SPACING_LIMIT` occurrences (``count`` fewer, when given)."""
    horizon = calendar.start + SPACING_HORIZON
    previous: datetime | None = None
    for index, moment in enumerate(calendar.iterate()):
        if moment > horizon or index >= min(count or SPACING_LIMIT, SPACING_LIMIT):
            break
        if previous is not None and (day(moment) - day(previous)).days < days:
            return previous, moment
        previous = moment
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
