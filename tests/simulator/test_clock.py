"""The simulator's clock: real time plus a movable offset, and the gateway's timestamp form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from durapay.simulator._clock import Clock, iso, parse_iso

FIXED = datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)


def test_advance_and_set_move_only_the_offset() -> None:
    clock = Clock(wall=lambda: FIXED)
    assert clock.now() == FIXED
    assert clock.advance(90) == FIXED + timedelta(seconds=90)
    assert clock.set(datetime(2026, 3, 2, tzinfo=UTC)) == datetime(2026, 3, 2, tzinfo=UTC)
    assert clock.offset_seconds == (datetime(2026, 3, 2, tzinfo=UTC) - FIXED).total_seconds()
    clock.reset()
    assert clock.now() == FIXED


def test_iso_is_utc_with_milliseconds_and_round_trips() -> None:
    assert iso(FIXED) == "2026-03-01T10:00:00.123Z"
    assert parse_iso("2026-03-01T10:00:00.123Z") == FIXED.replace(microsecond=123000)
    assert parse_iso("2026-03-01T11:00:00+01:00") == datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert parse_iso("2026-03-01T10:00:00") == datetime(2026, 3, 1, 10, tzinfo=UTC)
