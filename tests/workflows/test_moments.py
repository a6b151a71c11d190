"""The one rule for writing a moment for people (``workflows.moments``): ISO 8601 to the second with its
offset, UTC written ``Z``, an object's own time zone named after the offset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from durapay.gateway import GatewayTime
from durapay.workflows.moments import moment_text, time_of_day
from tests.times import RULE


def test_every_form_durapay_keeps_is_written_one_way() -> None:
    instant = datetime(2026, 11, 23, 5, 0, 43, 974000, tzinfo=UTC)
    forms = [
        instant.timestamp(),  # a record's created, updated, due
        instant,
        instant.astimezone(timezone(timedelta(hours=1))),
        "2026-11-23T05:00:43.974Z",  # an event's timestamp, a webhook attempt's at
        "2026-11-23T06:00:43.974+01:00",
        GatewayTime("2026-11-23 06:00:43.974"),  # the gateway's operationTime, in UTC+01:00 without saying so
        GatewayTime("2026-11-23T05:00:43.974Z"),
    ]
    assert {moment_text(form) for form in forms} == {"2026-11-23T05:00:43Z"}


def test_an_object_with_a_time_zone_of_its_own_names_it() -> None:
    instant = datetime(2027, 1, 31, 6, 0, tzinfo=UTC).timestamp()
    assert moment_text(instant, "Europe/Rome") == "2027-01-31T07:00:00+01:00 (Europe/Rome)"
    assert moment_text(instant, "UTC") == "2027-01-31T06:00:00Z"
    assert RULE.match(moment_text(instant, "America/Argentina/Buenos_Aires"))
    assert time_of_day(instant, "Europe/Rome") == "07:00:00 Europe/Rome"
    assert time_of_day(instant) == "06:00:00 UTC"


def test_nothing_is_empty_and_what_is_no_moment_is_shown_as_it_came() -> None:
    assert moment_text(None) == "" and moment_text("") == ""
    assert moment_text("soon") == "soon"
