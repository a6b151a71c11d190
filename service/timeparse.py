"""Points in time as the API and CLI accept them: one parser, two meanings.

* ``since`` (``?since=``, ``durapay flows ls --since``) looks back: POSIX seconds, ISO 8601, or an *age*
  (``15m``, ``2h``, ``7d`` = that long before now). :func:`parse_since`.
* ``run_at`` (``?run_at=``, ``durapay start --run-at``) looks ahead, and a mistake there moves money at
  the wrong time: POSIX seconds, ISO 8601 *with an offset* (``2026-01-31T09:00:00+01:00``, ``...Z``), or
  a *delay* (``in 2h``, ``+2h``, ``+90s``, ``in 7d``). A bare ``2h`` is refused (it would be an age, two
  hours ago), and so is any time that is not in the future. :func:`parse_run_at`.

Both raise ValueError with a one-line reason that lists what the parameter accepts.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

# One set of pieces for the parser and for the patterns the OpenAPI document states (ASCII digits).
_NUMBER = r"[0-9]{1,12}(?:\.[0-9]{1,9})?"
_SPAN = r"[0-9]{1,9}(?:\.[0-9]{1,6})?[smhd]"
_DATE = r"[1-9][0-9]{3}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
_CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\.[0-9]{1,6})?)?"
_OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"

#: What ``?since=`` and ``?run_at=`` accept, as the OpenAPI document states it.
SINCE_PATTERN = rf"^(?:{_NUMBER}|{_SPAN}|{_DATE}T{_CLOCK}{_OFFSET}?)$"
RUN_AT_PATTERN = rf"^(?:{_NUMBER}|(?:in |\+){_SPAN}|{_DATE}T{_CLOCK}{_OFFSET})$"

_AGE = re.compile(r"^([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhd])$")
_DELAY = re.compile(r"^(?:in |\+)([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhd])$")
_POSIX = re.compile(rf"^{_NUMBER}$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

SINCE_FORMS = "POSIX seconds, an ISO 8601 time (2026-01-01T00:00:00Z) or an age (15m, 2h, 7d)"
RUN_AT_FORMS = (
    "a future time: POSIX seconds, ISO 8601 with an offset (2026-01-31T09:00:00+01:00 or ...Z) or a delay (in 2h, +15m, +7d)"
)


def _span(match: re.Match[str]) -> float:
    return float(match.group(1)) * _UNIT[match.group(2)]


def _absolute(value: str) -> float:
    """POSIX seconds or an ISO 8601 time that matched the pattern (no offset = UTC)."""
    if _POSIX.match(value):
        return float(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:  # the pattern cannot know month lengths: 2026-02-30
        raise ValueError(f"{value!r} is not a real date and time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_since(text: str, *, now: float) -> float:
    """POSIX seconds from ``1767225600``, ``2026-01-01T00:00:00Z`` or an age (``90s``, ``15m``, ``2h``, ``7d``)."""
    if not re.match(SINCE_PATTERN, text):
        raise ValueError(f"expected {SINCE_FORMS}")
    age = _AGE.match(text)
    return now - _span(age) if age else _absolute(text)


def parse_run_at(text: str, *, now: float) -> float:
    """POSIX seconds of a time after ``now``: ``1767225600``, ``2026-01-31T09:00:00+01:00``, ``in 2h``, ``+2h``."""
    if _AGE.match(text):
        raise ValueError(f"{text!r} is ambiguous: write a delay as 'in {text}' or '+{text}' (expected {RUN_AT_FORMS})")
    if re.match(SINCE_PATTERN, text) and not re.match(RUN_AT_PATTERN, text):
        raise ValueError(f"{text!r} has no UTC offset; add Z or one like +01:00 (expected {RUN_AT_FORMS})")
    if not re.match(RUN_AT_PATTERN, text):
        raise ValueError(f"expected {RUN_AT_FORMS}")
    delay = _DELAY.match(text)
    when = now + _span(delay) if delay else _absolute(text)
    if not math.isfinite(when) or when <= now:
        moment = datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds") if math.isfinite(when) else text
        raise ValueError(f"{moment} is not in the future (expected {RUN_AT_FORMS})")
    return when
