"""Merchant events: what happened to a flow or a schedule, told to the merchant instead of asked.

Every event is written by the same Lua script as the change that causes it (``workflows/engine/lua/events.lua``
for flows, ``workflows/schedules/lua/update.lua`` for schedules): an outbox in the record's own hash
slot, never a second write a crash could skip, so an event exists if and only if its transition
happened. One type has no flow or schedule: ``notification.unknown_order``, written by the receiver
(``workflows.unknown_orders``) with its own once-per-order mark. Each partition has one Redis stream
(``Keys.events``, ``ScheduleKeys.events``); an event's id is its stream's tag and entry id
(``evt_p3_1795398043974-0``), unique and ordered within the partition.

This module reads them: :class:`EventFeed` pages through every stream after a :class:`Cursor` (the
pull feed, ``GET /events``, ``Engine.events``), and webhooks fan out from the same streams. The
dispatcher trims the streams to ``DURAPAY_EVENTS__RETENTION`` (:meth:`EventFeed.trim`, run by
``workflows.engine.trim.EventTrimmer``).

Types and their ``data`` (JSON; card data never appears):

==========================  =========================================================================
``flow.created``            ``state`` (ready, or sleeping until ``runAt``), ``step``
``flow.waiting``            ``customerUrl`` (the page to send the customer to), ``deadline``, ``signals``
``flow.succeeded``          ``operation`` (operationId, orderId, type, result, amount, currency, ...)
``flow.failed``             ``reason``, ``error`` (type, responseCode, decline ...), ``decline``
                            (``soft``/``hard``/null), ``operation``
``flow.cancelled``          ``reason``
``flow.needs_attention``    ``reason``, ``error`` (its ``type`` says why: LatePayment, WorkerLost ...)
``payment.late``            ``operation`` (the payment reported), ``endedAs`` (how the flow ended)
``schedule.charged``        ``occurrence``, ``attempt``, ``flow``
``schedule.declined``       ``occurrence``, ``attempt``, ``flow``, ``responseCode``, ``decline``
``schedule.dunning``        ``occurrence``, ``attempt`` (the retry), ``at`` (when it runs)
``schedule.needs_attention`` ``reason``
``schedule.completed``      ``occurrences``
``notification.unknown_order`` ``verified`` (false), ``claimed`` (operationId, operationResult, amount,
                            currency: what a notification of an order no flow holds said, its token
                            unchecked)
``reconciliation.mismatch`` ``category``, ``what``, ``report``, ``state``, ``operation`` (the gateway's),
                            ``named`` (the operation the flow names): ``workflows.reconciliation``
``gateway.unavailable``     ``terminal``, ``failures``, ``until`` (when one probe call may go), ``error``
                            (type, status, message of the failure that opened the breaker):
                            ``workflows.engine.gate``, written by ``engine/lua/gate.lua``
``gateway.recovered``       ``terminal``, ``since`` (when the breaker opened), ``seconds`` (how long)
==========================  =========================================================================

Every event also carries ``flow`` and ``kind`` (or ``schedule``), ``orderId`` and ``operationId``
where known, and ``time`` (POSIX seconds; ``timestamp`` in ISO 8601 on the wire);
``notification.unknown_order`` has no flow, and its ``operationId`` is null (the claimed one is in
``data``).
"""

from __future__ import annotations

import heapq
import json
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from durapay.workflows.engine.clock import server_time
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.sensitive import identifiers, mask, operation_ids_in

FLOW_TYPES = (
    "flow.created",
    "flow.waiting",
    "flow.succeeded",
    "flow.failed",
    "flow.cancelled",
    "flow.needs_attention",
    "payment.late",
)
SCHEDULE_TYPES = (
    "schedule.charged",
    "schedule.declined",
    "schedule.dunning",
    "schedule.needs_attention",
    "schedule.completed",
)
#: Events without a flow or schedule: the receiver's (``workflows.unknown_orders``).
NOTIFICATION_TYPES = ("notification.unknown_order",)
#: A reconciliation's mismatch (``workflows.reconciliation.report``): with its flow, or none for money no flow claims.
RECONCILIATION_TYPES = ("reconciliation.mismatch",)
#: The gateway's breaker opened or closed (``workflows.engine.gate``): no flow, no schedule.
GATEWAY_TYPES = ("gateway.unavailable", "gateway.recovered")
EVENT_TYPES = FLOW_TYPES + SCHEDULE_TYPES + NOTIFICATION_TYPES + RECONCILIATION_TYPES + GATEWAY_TYPES


@dataclass(frozen=True)
class Event:
    """One event as read back: its id (``evt_<stream tag>_<entry id>``), type, time and body."""

    id: str
    type: str
    time: float
    body: dict[str, Any] = field(repr=False)

    @property
    def stream(self) -> str:
        return self.id.split("_")[1]

    @property
    def entry(self) -> str:
        return self.id.split("_", 2)[2]

    def wire(self) -> dict[str, Any]:
        """The event as the feed and webhooks send it (Standard Webhooks payload: type, timestamp, data)."""
        subject = {key: value for key, value in self.body.items() if key not in {"type", "time", "data"}}
        return {"id": self.id, "type": self.type, "timestamp": iso(self.time), **subject, "data": self.body.get("data") or {}}


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Cursor:
    """Where a reader stands: the last entry id read on each stream (``p0``, ``s3``...). Its text form
    (``p0=1795398043974-0.p1=0-0``) is what ``GET /events?after=`` takes and answers as ``next``."""

    positions: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return ".".join(f"{stream}={entry}" for stream, entry in sorted(self.positions.items()))

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """The cursor of ``text`` (empty: from the beginning). Raises ValueError naming what is wrong."""
        if not text:
            return cls()
        positions: dict[str, str] = {}
        for part in text.split("."):
            stream, sep, entry = part.partition("=")
            millis, dash, seq = entry.partition("-")
            if (
                not sep
                or not stream
                or not dash
                or not (millis.isascii() and millis.isdigit())
                or not (seq.isascii() and seq.isdigit())
            ):
                raise ValueError(f"{part!r} is not a stream position (expected like p0=1795398043974-0)")
            positions[stream] = entry
        return cls(positions)

    def after(self, event: Event) -> Cursor:
        return Cursor({**self.positions, event.stream: event.entry})


#: Entries one trim pass drops at most per stream (``EventFeed.trim``): a stream that grew for months
#: is cut down over several passes, none holding the server long.
TRIM_LIMIT = 10_000

#: Fetches of ``limit`` entries per stream one :meth:`EventFeed.read` looks through to fill a page of
#: the types asked for (the cursor keeps the place beyond).
READ_ROUNDS = 8


def _order(event: Event) -> tuple[float, str]:
    """An event's place in the merged feed: its time, then its id (stream and entry)."""
    return (event.time, event.id)


class EventFeed:
    """Reads the event streams of flows (``p<n>``) and schedules (``s<n>``), oldest first per stream."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    def streams(self) -> dict[str, str]:
        """Stream tag -> key, for every partition of flows and schedules."""
        found = {f"p{p}": self.keys.events(p) for p in range(self.keys.partitions)}
        found |= {f"s{p}": schedule_events_key(self.keys, p) for p in range(self.keys.partitions)}
        return found

    def read(
        self, after: Cursor | None = None, *, types: Iterable[str] | None = None, limit: int = 100
    ) -> tuple[list[Event], Cursor]:
        """Up to ``limit`` events after ``after``, in time order across streams (in entry order within
        one), and the cursor after the last one returned. Events of other types are stepped over: the
        cursor moves past them too, and a page with types may be short (at most ``READ_ROUNDS`` fetches
        of ``limit`` entries per stream are looked through) while more events follow: a reader goes on
        for as long as the cursor moves."""
        cursor = after or Cursor()
        wanted = set(types) if types else None
        streams = self.streams()
        fetched: dict[str, deque[Event]] = {tag: deque() for tag in streams}
        more = set(streams)  # streams that may hold entries beyond what was fetched
        page: list[Event] = []
        for _ in range(READ_ROUNDS):
            # Only the streams whose fetch ran out are read again, from the cursor (its last entry).
            refill = [tag for tag in streams if tag in more and not fetched[tag]]
            pipe = self.redis.pipeline(transaction=False)
            for tag in refill:
                pipe.xrange(streams[tag], min=_exclusive(cursor.positions.get(tag)), count=limit)
            for tag, entries in zip(refill, pipe.execute(), strict=True):
                fetched[tag].extend(decode_entry(tag, entry_id, values) for entry_id, values in entries)
                if len(entries) < limit:
                    more.discard(tag)
            # Interleaved by time across streams, but always in entry order within one: a stream's
            # events never overtake each other (their times come from the writers' clocks, the ids from
            # the server's), so no cursor can pass an event it did not return. The merge stops when a
            # stream that may hold more runs out of what was fetched: its next event could come before
            # any other stream's next one.
            heads = [(_order(events[0]), tag) for tag, events in fetched.items() if events]
            heapq.heapify(heads)
            while heads and len(page) < limit:
                tag = heapq.heappop(heads)[1]
                event = fetched[tag].popleft()
                cursor = cursor.after(event)
                if wanted is None or event.type in wanted:
                    page.append(event)
                if fetched[tag]:
                    heapq.heappush(heads, (_order(fetched[tag][0]), tag))
                elif tag in more:
                    break
            if len(page) >= limit or not more:
                break
        return page, cursor

    def end(self) -> Cursor:
        """The cursor after the last event of every stream now: following from it gives what comes next
        (``durapay listen``, ``durapay events ls --follow`` without ``--after``). One round trip."""
        streams = self.streams()
        pipe = self.redis.pipeline(transaction=False)
        for key in streams.values():
            pipe.xrevrange(key, count=1)
        positions = {}
        for tag, entries in zip(streams, pipe.execute(), strict=True):
            if entries:
                entry = entries[0][0]
                positions[tag] = entry.decode() if isinstance(entry, bytes) else str(entry)
        return Cursor(positions)

    def follow(
        self,
        after: Cursor | None = None,
        *,
        types: Iterable[str] | None = None,
        poll: float = 0.5,
        stop: Any = None,
    ) -> Iterator[tuple[Event, Cursor]]:
        """Every event after ``after``, as it comes (polling every ``poll`` seconds while none comes), with
        the cursor to resume from after it; ends when ``stop()`` is true (or the caller stops reading)."""
        cursor = after or Cursor()
        while stop is None or not stop():
            page, following = self.read(cursor, types=types)
            for event in page:
                cursor = cursor.after(event)
                yield event, cursor
            cursor = following
            if not page:
                time.sleep(poll)

    def trim(self, *, older_than_seconds: float, limit: int = TRIM_LIMIT) -> tuple[int, bool]:
        """Drop the events older than ``older_than_seconds`` by the server's clock (it stamps the entry
        ids; no process's clock has a say), about ``limit`` at most per stream. Returns how many were
        dropped, and whether some stream may hold more (the caller passes again soon).

        Two steps per stream: an approximate ``XTRIM MINID ~ ... LIMIT`` frees whole stream nodes, at most
        ``limit`` entries; where it stopped well short of that, only the node holding the horizon is left,
        and an exact ``XTRIM MINID`` drops its old entries (one node's at most). A stream whose first step
        came near the limit is left for the next pass."""
        horizon = f"{int(server_time(self.redis) * 1000) - int(older_than_seconds * 1000)}-0"
        streams = list(self.streams().values())
        pipe = self.redis.pipeline(transaction=False)
        for key in streams:
            pipe.xtrim(key, minid=horizon, approximate=True, limit=limit)
        rough = [int(dropped) for dropped in pipe.execute()]
        # Whole nodes are removed only while they fit under the limit: well short of it, the step stopped
        # at the node holding the horizon.
        exact = [key for key, dropped in zip(streams, rough, strict=True) if dropped <= limit // 2]
        pipe = self.redis.pipeline(transaction=False)
        for key in exact:
            pipe.xtrim(key, minid=horizon, approximate=False)
        finer = [int(dropped) for dropped in pipe.execute()] if exact else []
        return sum(rough) + sum(finer), len(exact) < len(streams)


def schedule_events_key(keys: Keys, partition: int) -> str:
    """The schedules' stream of ``partition`` (in the schedules' slot, see ``schedules.store``)."""
    return f"{keys.prefix}:{{s{partition}}}:events"


def _exclusive(entry: str | None) -> str:
    return f"({entry}" if entry else "-"


def decode_entry(tag: str, entry_id: Any, values: Any) -> Event:
    """The event of one stream entry (``tag``: the stream's, ``p3``)."""
    entry = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    raw = values.get(b"e") or values.get("e") or b"{}"
    # A reason or a gateway answer may hold a card number (workflows.engine.sensitive); the event's operation ids
    # (its own and those of its outcome and error, all the gateway's) are identifiers, whole in its text.
    decoded = json.loads(raw)
    body = mask(decoded, identifiers(operation_ids_in(decoded)))
    return Event(f"evt_{tag}_{entry}", str(body.get("type")), float(body.get("time") or 0.0), body)
