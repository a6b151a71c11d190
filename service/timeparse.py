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

_SPAN = r"(\d{1,9}(?:\.\d{1,6})?)([smhd])"
_AGE = re.compile(rf"^{_SPAN}$")
_DELAY = re.compile(rf"^(?:in\s+|\+){_SPAN}$")
_POSIX = re.compile(r"^\d{1,12}(?:\.\d{1,9})?$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

SINCE_FORMS = "POSIX seconds, an ISO 8601 time (2026-01-01T00:00:00Z) or an age (15m, 2h, 7d)"
RUN_AT_FORMS = (
    "a future time: POSIX seconds, ISO 8601 with an offset (2026-01-31T09:00:00+01:00 or ...Z) or a delay (in 2h, +15m, +7d)"
)


def _span(match: re.Match[str]) -> float:
    return float(match.group(1)) * _UNIT[match.group(2)]


def _absolute(value: str, *, need_offset: bool) -> float | None:
    """POSIX seconds or ISO 8601, else None; an ISO time without offset is UTC unless ``need_offset``."""
    if _POSIX.match(value):
        return float(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        if need_offset:
            raise ValueError(f"{value!r} has no UTC offset; write it as {value}Z or with +01:00 (expected {RUN_AT_FORMS})")
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_since(text: str, *, now: float) -> float:
    """POSIX seconds from ``1767225600``, ``2026-01-01T00:00:00Z`` or an age (``90s``, ``15m``, ``2h``, ``7d``)."""
    value = text.strip()
    age = _AGE.match(value)
    if age:
        return now - _span(age)
    found = _absolute(value, need_offset=False)
    if found is None or not math.isfinite(found):
        raise ValueError(f"expected {SINCE_FORMS}")
    return found


def parse_run_at(text: str, *, now: float) -> float:
    """POSIX seconds of a time after ``now``: ``1767225600``, ``2026-01-31T09:00:00+01:00``, ``in 2h``, ``+2h``."""
    value = text.strip()
    delay = _DELAY.match(value)
    if delay:
        when = now + _span(delay)
    elif _AGE.match(value):
        raise ValueError(f"{value!r} is ambiguous: write a delay as 'in {value}' or '+{value}' (expected {RUN_AT_FORMS})")
    else:
        found = _absolute(value, need_offset=True)
        if found is None or not math.isfinite(found):
            raise ValueError(f"expected {RUN_AT_FORMS}")
        when = found
    if when <= now:
        moment = datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds")
        raise ValueError(f"{moment} is not in the future (expected {RUN_AT_FORMS})")
    return when
