"""What every list endpoint shares: a time window of at most a month, newest first, ``maxRecords``.

"For the next page set toTime equal to the lastOperationTime value of the last record" (docs/gateway.md,
Times): bounds are inclusive, so the boundary record repeats on the next page; callers drop it by id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from durapay.gateway import parse_gateway_time
from durapay.simulator._protocol import SimError

#: Records a list answers when the query gives no ``maxRecords`` (the gateway's default is not published).
DEFAULT_MAX_RECORDS = 100
MAX_WINDOW = timedelta(days=31)

T = TypeVar("T")


def _moment(value: str | None, field: str) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        return parse_gateway_time(value)
    except ValueError:
        raise SimError.rejected("PS0008", f"{field} {value!r}") from None


@dataclass(frozen=True)
class Window:
    start: datetime | None
    end: datetime | None

    @classmethod
    def of(cls, from_time: str | None, to_time: str | None) -> Window:
        start, end = _moment(from_time, "fromTime"), _moment(to_time, "toTime")
        if start is not None and end is not None and (end < start or end - start > MAX_WINDOW):
            raise SimError.rejected("PS0013", "toTime must follow fromTime by at most one month")
        return cls(start, end)

    def holds(self, moment: str | None) -> bool:
        if self.start is None and self.end is None:
            return True
        if not moment:
            return False
        when = parse_gateway_time(moment)
        return (self.start is None or when >= self.start) and (self.end is None or when <= self.end)


def newest_first(items: Iterable[T], key: Callable[[T], str], max_records: int | None) -> list[T]:
    """Newest first by the time ``key`` gives (either gateway form: ordered as moments, not as text)."""
    ordered = sorted(items, key=lambda item: parse_gateway_time(key(item)), reverse=True)
    return ordered[: max_records or DEFAULT_MAX_RECORDS]
