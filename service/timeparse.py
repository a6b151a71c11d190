"""Points in time as the API and CLI accept them: POSIX seconds, ISO 8601, or an age like ``15m``.

One parser for ``?since=``, ``?run_at=`` and ``durapay flows ls --since``, so the three agree.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(text: str, *, now: float) -> float:
    """POSIX seconds from ``1767225600``, ``2026-01-01T00:00:00Z`` or an age (``90s``, ``15m``, ``2h``,
    ``7d`` = that long before ``now``). Raises ValueError with a one-line reason."""
    value = text.strip()
    age = _AGE.match(value)
    if age:
        return now - float(age.group(1)) * _UNIT[age.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError("expected POSIX seconds, an ISO 8601 time (2026-01-01T00:00:00Z) or an age (15m, 2h, 7d)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
