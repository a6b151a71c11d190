"""The gateway's two ways of writing a moment, read into one aware ``datetime``.

Published examples write ISO 8601 in UTC (``2022-09-01T01:20:00.001Z``); the real test environment
answers ``2023-11-28 12:41:46.724`` (a space, milliseconds, no offset). One published note says the
gateway's timestamps are in UTC+01:00, so a time without an offset is read in that zone
(docs/gateway.md). The simulator writes operation times the test environment's way with the same
zone, so both sides keep one rule.

Response fields holding a time are :class:`GatewayTime`: the string exactly as sent (records and JSON
keep it, a value this module cannot read is still accepted) with its parsed ``.moment``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

#: The zone of a gateway time written without an offset.
GATEWAY_ZONE = timezone(timedelta(hours=1))


def parse_gateway_time(text: str) -> datetime:
    """An aware datetime from either form; ValueError when ``text`` is neither."""
    value = text.strip()
    if value[-1:] in ("Z", "z"):
        value = value[:-1] + "+00:00"
    moment = datetime.fromisoformat(value)  # Python 3.11 reads "T" or " " and any fraction length
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=GATEWAY_ZONE)


def format_gateway_time(moment: datetime) -> str:
    """The test environment's form, ``2023-11-28 12:41:46.724``, in :data:`GATEWAY_ZONE`."""
    local = moment.astimezone(GATEWAY_ZONE)
    return local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond // 1000:03d}"


class GatewayTime(str):
    """A time as the gateway wrote it; ``.moment`` is its aware datetime, or None if unreadable."""

    __slots__ = ()

    @property
    def moment(self) -> datetime | None:
        try:
            return parse_gateway_time(self)
        except ValueError:
            return None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(), serialization=core_schema.to_string_ser_schema()
        )
