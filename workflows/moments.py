"""How durapay writes a moment for people: one rule on every surface.

The rule: ISO 8601 to the second, always with its offset; in UTC (``2026-11-23T05:00:43Z``), unless the
object has a time zone of its own (a schedule's ``timezone``), which is then named after the offset
(``2027-01-31T07:00:00+01:00 (Europe/Rome)``). The CLI's tables and records, the console's pages (flows,
schedules, webhooks, reconciliation), ``webhooks attempts``, a schedule's next run and the gateway's
``operationTime`` all go through :func:`moment_text`.

Why one module: before it, times were written five ways (the CLI without a zone, the console with
``UTC``, webhook pages in ISO ``Z`` with milliseconds, a schedule's next run with an unnamed ``+01:00``,
the gateway's ``operationTime`` as it came, unlabelled, in UTC+01:00): a person could not compare two
of them without knowing which surface used which convention.

The wire keeps its own forms (POSIX seconds in flow views, ISO ``Z`` with milliseconds in events, the
gateway's text in operations): those are for programs, documented in docs/api.md and docs/events.md.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# The time module alone, not the gateway package: the CLI's tables import this, and a Tab in the shell
# must not load the gateway's models (tests/service/cli/test_completion.py).
from durapay.gateway._time import GatewayTime

#: What a zone named so is: no name is written after the offset.
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Z", "GMT", "Etc/GMT", "UCT", "Zulu"})


def moment_of(value: Any) -> datetime | None:
    """An aware datetime from what durapay keeps a moment as: POSIX seconds, an aware ``datetime`` (a naive
    one is UTC), a gateway time (``GatewayTime``: either of the gateway's forms, its zone when none is
    written), or ISO 8601 text (no offset: UTC, the API's rule for ``since``). None for nothing or for
    what is none of these."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC) if math.isfinite(value) and value > 0 else None
    if isinstance(value, GatewayTime):
        return value.moment
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return None


def moment_text(value: Any, zone: str | tzinfo | None = None) -> str:
    """``value`` (anything :func:`moment_of` reads) written by the rule: ``2026-11-23T05:00:43Z``, or in
    ``zone`` (an IANA name) ``2027-01-31T07:00:00+01:00 (Europe/Rome)``. ``""`` for nothing; text that is
    no moment is returned as it came (never hidden, never guessed at)."""
    moment = moment_of(value)
    if moment is None:
        return "" if value is None or value == "" else str(value)
    name, where = _zone(zone)
    local = moment.astimezone(where).replace(microsecond=0)
    if name is None:
        return local.strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{local.isoformat()} ({name})"


def time_of_day(value: Any, zone: str | tzinfo | None = None) -> str:
    """The wall-clock time of ``value`` by the same rule (``09:30:00 UTC``, ``07:00:00 Europe/Rome``): what
    a schedule created at that moment charges at, every time it fires."""
    moment = moment_of(value)
    if moment is None:
        return ""
    name, where = _zone(zone)
    return f"{moment.astimezone(where).strftime('%H:%M:%S')} {name or 'UTC'}"


def _zone(zone: str | tzinfo | None) -> tuple[str | None, tzinfo]:
    """The zone's name to write (None: UTC, written ``Z``) and the zone itself; an unknown name is UTC."""
    if zone is None:
        return None, UTC
    if isinstance(zone, tzinfo):
        key = getattr(zone, "key", None)
        return (None, UTC) if zone is UTC or key in _UTC_NAMES else (str(key or zone), zone)
    if zone in _UTC_NAMES:
        return None, UTC
    try:
        return zone, ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return None, UTC
