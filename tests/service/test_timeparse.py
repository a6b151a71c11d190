"""``since`` looks back (ages allowed); ``run_at`` looks ahead (a delay is written ``in 2h`` or ``+2h``)."""

from __future__ import annotations

import pytest

from durapay.service.timeparse import parse_run_at, parse_since

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("in 2h", NOW + 7200), ("+2h", NOW + 7200), ("+90s", NOW + 90), ("in 7d", NOW + 7 * 86400),
     ("1800003600", NOW + 3600), ("2027-01-15T09:00:00Z", NOW + 3600), ("2027-01-15T10:00:00+01:00", NOW + 3600)],
)  # fmt: skip
def test_run_at_forms(text: str, expected: float) -> None:
    assert parse_run_at(text, now=NOW) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [("2h", "ambiguous"), ("1", "not in the future"), ("2027-01-15T08:00:00Z", "not in the future"),
     ("2027-01-15T08:00:00", "no UTC offset"),
     ("nan", "expected a future time"), ("tomorrow", "expected a future time"), ("in 0s", "not in the future")],
)  # fmt: skip
def test_run_at_refusals_say_what_is_accepted(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as caught:
        parse_run_at(text, now=NOW)
    assert "in 2h" in str(caught.value) and "age" not in str(caught.value)


def test_since_keeps_ages() -> None:
    assert parse_since("2h", now=NOW) == NOW - 7200
    assert parse_since("1800000000", now=NOW) == NOW
    with pytest.raises(ValueError, match="an age"):
        parse_since("inf", now=NOW)
