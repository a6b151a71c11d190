"""Rule arithmetic, pure: month ends, leap years, DST in Europe/Rome and America/New_York, cron, counts, ends.

"Now" is passed in (``upcoming(..., now=...)``), never frozen: a frozen ``time.monotonic`` would also
stop the timers of every event loop running in the process (the test servers' threads).
"""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from croniter import croniter

from durapay.workflows.engine import InputError
from durapay.workflows.schedules import Calendar, ScheduleInput, occurrences, upcoming
from durapay.workflows.schedules.api import Schedules
from durapay.workflows.schedules.rules import iso

ROME = "Europe/Rome"
NEW_YORK = "America/New_York"


def spec(rule: dict[str, Any], start: str, timezone: str = "UTC", **extra: Any) -> ScheduleInput:
    data = {"contractId": "c-1", "amount": 1500, "currency": "EUR", "description": "plan", "rule": rule, "start": start}
    return ScheduleInput.model_validate({**data, "timezone": timezone, **extra})


def calendar(rule: dict[str, Any], start: str, timezone: str = "UTC", **extra: Any) -> Calendar:
    return spec(rule, start, timezone, **extra).calendar()


def stamps(moments: list[datetime]) -> list[str]:
    return [iso(moment) for moment in moments]


def local(moments: list[datetime], timezone: str) -> list[str]:
    from zoneinfo import ZoneInfo

    return [moment.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M %z") for moment in moments]


# -- month ends and leap years -----------------------------------------------------------------------


def test_monthly_day_31_clamps_to_each_month_end_without_drifting() -> None:
    found = occurrences(calendar({"every": "month", "day": 31}, "2023-01-31T10:00:00"), count=6)
    assert stamps(found) == [
        "2023-01-31T10:00:00Z",
        "2023-02-28T10:00:00Z",
        "2023-03-31T10:00:00Z",
        "2023-04-30T10:00:00Z",
        "2023-05-31T10:00:00Z",
        "2023-06-30T10:00:00Z",
    ]


@pytest.mark.parametrize(
    ("year", "february"), [(2024, "2024-02-29"), (2025, "2025-02-28"), (2100, "2100-02-28"), (2000, "2000-02-29")]
)
def test_monthly_day_29_in_february_follows_leap_years(year: int, february: str) -> None:
    found = occurrences(calendar({"every": "month", "day": 29}, f"{year}-01-01"), count=3)
    assert [moment.date().isoformat() for moment in found] == [f"{year}-01-29", february, f"{year}-03-29"]


def test_every_365_days_from_a_leap_day() -> None:
    found = occurrences(calendar({"every": "days", "interval": 365}, "2024-02-29T12:00:00"), count=3)
    assert [moment.date() for moment in found] == [date(2024, 2, 29), date(2025, 2, 28), date(2026, 2, 28)]


def test_a_monthly_day_before_the_start_begins_next_month() -> None:
    found = occurrences(calendar({"every": "month", "day": 5}, "2026-01-20T08:00:00"), count=2)
    assert stamps(found) == ["2026-02-05T08:00:00Z", "2026-03-05T08:00:00Z"]


# -- daylight saving time ------------------------------------------------------------------------------


def test_daily_at_nine_in_rome_keeps_local_time_across_both_changes() -> None:
    spring = occurrences(calendar({"every": "days"}, "2026-03-28T09:00:00", ROME), count=3)
    assert local(spring, ROME) == ["2026-03-28 09:00 +0100", "2026-03-29 09:00 +0200", "2026-03-30 09:00 +0200"]
    assert spring[1] - spring[0] == timedelta(hours=23)
    autumn = occurrences(calendar({"every": "days"}, "2026-10-24T09:00:00", ROME), count=2)
    assert local(autumn, ROME) == ["2026-10-24 09:00 +0200", "2026-10-25 09:00 +0100"]
    assert autumn[1] - autumn[0] == timedelta(hours=25)


def test_a_wall_time_in_the_spring_gap_fires_once_after_the_gap() -> None:
    found = occurrences(calendar({"every": "days"}, "2026-03-28T02:30:00", ROME), count=3)
    assert local(found, ROME) == ["2026-03-28 02:30 +0100", "2026-03-29 03:30 +0200", "2026-03-30 02:30 +0200"]


def test_a_repeated_wall_time_in_autumn_fires_once_at_its_first_instant() -> None:
    found = occurrences(calendar({"every": "days"}, "2026-10-31T01:30:00", NEW_YORK), count=3)
    assert local(found, NEW_YORK) == ["2026-10-31 01:30 -0400", "2026-11-01 01:30 -0400", "2026-11-02 01:30 -0500"]


def test_monthly_in_new_york_keeps_the_local_hour_across_the_change() -> None:
    found = occurrences(calendar({"every": "month", "day": 1}, "2026-02-01T09:00:00", NEW_YORK), count=3)
    assert stamps(found) == ["2026-02-01T14:00:00Z", "2026-03-01T14:00:00Z", "2026-04-01T13:00:00Z"]


def test_weekly_on_monday_in_rome_across_the_spring_change() -> None:
    found = occurrences(calendar({"every": "week", "weekday": "monday"}, "2026-03-19T07:15:00", ROME), count=3)
    assert local(found, ROME) == ["2026-03-23 07:15 +0100", "2026-03-30 07:15 +0200", "2026-04-06 07:15 +0200"]
    assert all(moment.astimezone(UTC).weekday() == 0 for moment in found)


# -- cron ------------------------------------------------------------------------------------------------


def test_cron_weekdays_at_nine_in_new_york_across_spring_forward() -> None:
    found = occurrences(calendar({"cron": "0 9 * * 1-5"}, "2026-03-05", NEW_YORK), count=4)
    assert stamps(found) == ["2026-03-05T14:00:00Z", "2026-03-06T14:00:00Z", "2026-03-09T13:00:00Z", "2026-03-10T13:00:00Z"]


def test_cron_in_the_rome_gap_and_fold_never_fires_twice() -> None:
    spring = occurrences(calendar({"cron": "30 2 * * *"}, "2026-03-28", ROME), count=3)
    assert local(spring, ROME) == ["2026-03-28 02:30 +0100", "2026-03-29 03:30 +0200", "2026-03-30 02:30 +0200"]
    every_half_hour = occurrences(calendar({"cron": "*/30 * * * *"}, "2026-03-29T01:00:00", ROME), count=4)
    assert local(every_half_hour, ROME) == [
        "2026-03-29 01:00 +0100",
        "2026-03-29 01:30 +0100",
        "2026-03-29 03:00 +0200",
        "2026-03-29 03:30 +0200",
    ]
    autumn = occurrences(calendar({"cron": "30 2 * * *"}, "2026-10-24", ROME), count=3)
    assert local(autumn, ROME) == ["2026-10-24 02:30 +0200", "2026-10-25 02:30 +0200", "2026-10-26 02:30 +0100"]


def test_cron_instants_strictly_increase_over_a_year_of_dst() -> None:
    found = occurrences(calendar({"cron": "*/20 1-3 * * *"}, "2026-01-01", NEW_YORK), limit=3000)
    assert all(later > earlier for earlier, later in itertools.pairwise(found))


# -- counts, ends and "now" ------------------------------------------------------------------------------


def test_count_limits_the_occurrences() -> None:
    assert len(occurrences(calendar({"every": "days", "interval": 2}, "2026-01-01"), count=5)) == 5


def test_an_end_date_includes_its_whole_local_day() -> None:
    found = occurrences(calendar({"every": "days"}, "2026-06-01T23:30:00", ROME, end="2026-06-03"))
    assert local(found, ROME) == ["2026-06-01 23:30 +0200", "2026-06-02 23:30 +0200", "2026-06-03 23:30 +0200"]


def test_an_end_datetime_is_inclusive() -> None:
    found = occurrences(calendar({"every": "week", "weekday": "friday"}, "2026-01-01", end="2026-01-16T00:00:00"))
    assert stamps(found) == ["2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z", "2026-01-16T00:00:00Z"]


def test_upcoming_counts_from_now() -> None:
    now = datetime(2026, 5, 10, 12, tzinfo=UTC)
    found = upcoming(calendar({"every": "month", "day": 31}, "2026-01-31T10:00:00"), 3, now=now)
    assert stamps(found) == ["2026-05-31T10:00:00Z", "2026-06-30T10:00:00Z", "2026-07-31T10:00:00Z"]


def test_upcoming_within_a_count_that_ends_soon() -> None:
    now = datetime(2026, 5, 10, 12, tzinfo=UTC)
    found = upcoming(calendar({"every": "month", "day": 1}, "2026-01-01"), 5, now=now, count=6)
    assert stamps(found) == ["2026-06-01T00:00:00Z"]


def test_upcoming_hourly_cron_in_rome_skips_the_missing_hour() -> None:
    now = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # 01:30 in Rome, half an hour before the clocks jump
    found = upcoming(calendar({"cron": "0 * * * *"}, "2026-03-01", ROME), 3, now=now)
    assert local(found, ROME) == ["2026-03-29 03:00 +0200", "2026-03-29 04:00 +0200", "2026-03-29 05:00 +0200"]


def test_upcoming_quarter_hours_in_new_york_during_the_repeated_hour() -> None:
    now = datetime(2026, 11, 1, 5, 10, tzinfo=UTC)  # 01:10 EDT in New York, the first of two 01:10s
    found = upcoming(calendar({"cron": "*/15 * * * *"}, "2026-10-01", NEW_YORK), 4, now=now)
    assert local(found, NEW_YORK) == [
        "2026-11-01 01:15 -0400",
        "2026-11-01 01:30 -0400",
        "2026-11-01 01:45 -0400",
        "2026-11-01 02:00 -0500",
    ]


# -- refused rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"rule": {"every": "year"}}, "rule", "must be"),
        ({"rule": {"every": "month", "day": 32}}, "rule.monthly.day", "less than or equal to 31"),
        ({"rule": {"cron": "61 * * * *"}}, "rule.cron.cron", "not a valid cron"),
        ({"rule": {"cron": "0 0 * * * *"}}, "rule.cron.cron", "five fields"),
        ({"rule": {"cron": "0 0 30 2 *"}}, "rule", "never fires"),
        ({"timezone": "Mars/Olympus"}, "timezone", "IANA"),
        ({"end": "2025-01-01"}, "end", "before start"),
        ({"dunning": [3, 1]}, "dunning", "increase"),
        ({"amount": 0}, "amount", "greater than or equal to 1"),
        ({"start": "2026-13-01"}, "start", "ISO date"),
    ],
)
def test_bad_input_names_the_field_and_the_reason(change: dict[str, Any], field: str, reason: str) -> None:
    data = {
        "contractId": "c-1",
        "amount": 1500,
        "currency": "EUR",
        "description": "d",
        "rule": {"every": "days"},
        "start": "2026-01-01",
    }
    with pytest.raises(InputError) as raised:
        Schedules.validate({**data, **change})
    assert raised.value.field == field
    assert reason in raised.value.reason


# -- what a calendar computes once ---------------------------------------------------------------------


def _brute_force(cal: Calendar, after: datetime) -> datetime:
    """The first occurrence after ``after`` by walking every candidate from the start (no estimate, nothing
    cached): the wall time of candidate n computed from the start each time, as the rules define it."""
    import calendar as months
    from datetime import time

    from durapay.workflows.schedules.rules import WEEKDAYS, EveryDays, Monthly, Weekly, to_utc

    local = cal.start.astimezone(cal.tz).replace(tzinfo=None, fold=0)
    threshold = max(after, cal.start - timedelta(microseconds=1))
    for n in itertools.count():
        if isinstance(cal.rule, EveryDays):
            day = local.date() + timedelta(days=n * cal.rule.interval)
        elif isinstance(cal.rule, Weekly):
            day = local.date() + timedelta(days=(WEEKDAYS.index(cal.rule.weekday) - local.weekday()) % 7 + 7 * n)
        else:
            assert isinstance(cal.rule, Monthly)
            year, month = divmod(local.year * 12 + local.month - 1 + n, 12)
            day = date(year, month + 1, min(cal.rule.day, months.monthrange(year, month + 1)[1]))
        found = to_utc(datetime.combine(day, time(local.hour, local.minute, local.second, local.microsecond)), cal.tz)
        if found > threshold:
            return found
    raise AssertionError("unreachable")


@pytest.mark.parametrize("timezone", ["UTC", ROME, NEW_YORK, "Australia/Lord_Howe"])
@pytest.mark.parametrize(
    "rule",
    [
        {"every": "days", "interval": 1},
        {"every": "days", "interval": 10},
        {"every": "week", "weekday": "sunday"},
        {"every": "month", "day": 31},
        {"every": "month", "day": 15},
    ],
)
def test_the_next_occurrence_is_the_first_candidate_past_the_threshold(rule: dict[str, Any], timezone: str) -> None:
    """The start's local time, first day and step are computed once per calendar; every answer over three
    years of thresholds (hourly steps around daylight-saving changes included) matches a walk from the start."""
    cal = calendar(rule, "2026-01-31T02:30:00", timezone)
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    while moment < datetime(2029, 1, 1, tzinfo=UTC):
        assert cal.next_after(moment) == _brute_force(cal, moment), moment
        moment += timedelta(hours=37, minutes=13)


def test_a_calendar_changed_with_replace_computes_its_start_again() -> None:
    import dataclasses

    cal = calendar({"every": "days", "interval": 1}, "2026-03-01T09:00:00")
    later = dataclasses.replace(cal, start=datetime(2026, 3, 1, 18, tzinfo=UTC))
    assert later != cal and later.first() == datetime(2026, 3, 1, 18, tzinfo=UTC)
    assert cal.first() == datetime(2026, 3, 1, 9, tzinfo=UTC)


# -- a start in a spring gap (issue 23, item 8) ----------------------------------------------------------


@pytest.mark.parametrize("rule", [{"every": "days"}, {"every": "week", "weekday": "sunday"}, {"every": "month", "day": 29}])
def test_a_start_in_the_spring_gap_moves_that_night_only(rule: dict[str, Any]) -> None:
    """02:30 does not exist in Rome on 29 March 2026: that night fires at 03:30, and every later occurrence
    at the 02:30 given (it kept 03:30 forever)."""
    found = occurrences(calendar(rule, "2026-03-29T02:30:00", ROME), count=3)
    assert local(found, ROME)[0] == "2026-03-29 03:30 +0200"
    assert [moment[11:16] for moment in local(found, ROME)[1:]] == ["02:30", "02:30"]


def test_a_date_only_start_whose_midnight_is_skipped_fires_at_midnight_after() -> None:
    """Havana skips from 00:00 to 01:00 on 8 March 2026: a start of that date fires at 01:00 that day and
    at midnight after (it fired at 01:00 every day)."""
    found = occurrences(calendar({"every": "days"}, "2026-03-08", "America/Havana"), count=3)
    assert local(found, "America/Havana") == ["2026-03-08 01:00 -0400", "2026-03-09 00:00 -0400", "2026-03-10 00:00 -0400"]


def test_an_aware_start_is_an_instant_and_keeps_its_own_wall_time() -> None:
    found = occurrences(calendar({"every": "days"}, "2026-03-29T01:30:00+00:00", ROME), count=2)
    assert local(found, ROME) == ["2026-03-29 03:30 +0200", "2026-03-30 03:30 +0200"]


# -- counting what passed without walking it (issue 23, item 9) ---------------------------------------------


def _walked(cal: Calendar, first: datetime, stop: datetime) -> int:
    count, moment = 0, cal.next_after(first - timedelta(microseconds=1))
    while moment is not None and moment < stop:
        count, moment = count + 1, cal.next_after(moment)
    return count


@pytest.mark.parametrize(
    ("rule", "timezone"),
    [
        ({"cron": "* * * * *"}, ROME),
        ({"cron": "*/20 1-3 * * *"}, NEW_YORK),
        ({"cron": "30 2 * * *"}, ROME),
        ({"cron": "*/30 * * * 1-5"}, "Australia/Lord_Howe"),
        ({"cron": "0 9 L * *"}, "UTC"),
        ({"every": "days", "interval": 3}, ROME),
        ({"every": "month", "day": 31}, NEW_YORK),
    ],
)
def test_count_between_matches_a_walk_across_daylight_saving_changes(rule: dict[str, Any], timezone: str) -> None:
    cal = calendar(rule, "2026-03-20", timezone)
    for first, stop in [
        (datetime(2026, 3, 27, 22, 17, tzinfo=UTC), datetime(2026, 4, 6, 1, 3, tzinfo=UTC)),
        (datetime(2026, 10, 24, tzinfo=UTC), datetime(2026, 11, 3, 12, tzinfo=UTC)),
    ]:
        start = cal.next_after(first)
        assert start is not None
        assert cal.count_between(start, stop) == _walked(cal, start, stop), (rule, timezone, first)


def test_last_until_and_nth_find_what_a_walk_finds() -> None:
    cal = calendar({"cron": "*/7 9-17 * * 1-5"}, "2026-03-20", ROME)
    first = cal.first()
    assert first is not None
    until = datetime(2026, 4, 2, 3, tzinfo=UTC)
    walked = [moment for moment in itertools.takewhile(lambda m: m <= until, cal.iterate())]
    assert cal.last_until(first, until) == walked[-1]
    assert [cal.nth(first, k, until) for k in (0, 1, 100, len(walked) - 1)] == [walked[k] for k in (0, 1, 100, len(walked) - 1)]


class _Counted(croniter):
    """Stands in for croniter in ``rules``: counts every rule evaluation (``get_next``)."""

    calls = 0

    def get_next(self, *args: Any, **kwargs: Any) -> Any:
        _Counted.calls += 1
        return super().get_next(*args, **kwargs)


@pytest.mark.parametrize("days", [1, 7])
def test_counting_a_week_of_a_rule_firing_every_minute_costs_a_few_evaluations(
    days: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipping passed occurrences must not walk them: a ``* * * * *`` rule over a week is counted with a
    few evaluations per day (walking took 10,080 looks, each walking back three hours)."""
    import durapay.workflows.schedules.rules as rules

    cal = calendar({"cron": "* * * * *"}, "2026-06-01", ROME)
    first = datetime(2026, 6, 1, 8, tzinfo=UTC)
    monkeypatch.setattr(rules, "croniter", _Counted)
    _Counted.calls = 0
    assert cal.count_between(first, first + timedelta(days=days)) == days * 1440
    assert _Counted.calls <= days + 2
