"""Trimming what does not expire by itself: the listing indexes of expired flows, and old merchant events.

A finished flow's record and log expire on their own (``DURAPAY_ENGINE__RETENTION``); its entries in the state and
kind indexes (sorted sets, see ``keys``) do not, so the dispatcher trims them. Two rules:

* **Only the gone.** An entry is dropped only when its record no longer exists: a flow may live longer
  than the retention (a timer months ahead, a flow waiting for a person), and a moved clock (the
  demo's fast-forward) must not hide flows that still exist.
* **Never stalled, and as fast as flows finish.** Entries are read oldest first, but the live ones at
  the front (long-lived flows) are stepped over, not read again and again: per index the trimmer
  keeps how many live entries lead it (``offset``) and starts after them, wrapping to the front once
  it reaches the end. A pass reads every index in one round trip, checks the candidates in a second
  and removes the gone in a third; the dispatcher runs a pass every few seconds, and at once again
  while a pass still finds a full batch (a backlog), so trimming keeps pace with the finishing rate.

The merchant events' streams (one per partition, flows' and schedules') are trimmed to
``DURAPAY_EVENTS__RETENTION`` by :class:`EventTrimmer`, on the same rhythm:

* **By the server's clock**, which stamps the entry ids (``XTRIM MINID``): a process's clock, or the
  demo's fast-forward, has no say.
* **Bounded**: a pass drops at most about ``limit`` entries per stream (a stream that grew for months
  goes over several passes, at every tick while some is left), and is a few commands per stream.
* **No delivery cut short**: a webhook delivery's retries end within the retention (the settings
  refuse a retry window that reaches it), so its event is still there for its last attempt. An event
  older than the retention is gone whatever else happened (docs/events.md, Retention).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from durapay.workflows.engine.events import TRIM_LIMIT, EventFeed
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.states import TERMINAL

#: Seconds between passes of each trimmer (flows' indexes, events, ended schedules), unless its last pass
#: found a backlog (then: every tick).
TRIM_INTERVAL = 10.0


class IndexTrimmer:
    """One per dispatcher. ``batch``: entries read per index and pass."""

    def __init__(self, client: Any, keys: Keys, retention_seconds: float, *, batch: int = 1000) -> None:
        self.redis = client
        self.keys = keys
        self.retention_seconds = retention_seconds
        self.batch = batch
        self.offsets: dict[str, int] = {}
        self.backlog = False

    def indexes(self, kinds: Iterable[str]) -> list[str]:
        """Every index a finished flow stays in: its terminal state's and its kind's, per partition."""
        found = []
        for partition in range(self.keys.partitions):
            found += [self.keys.by_state(partition, state.value) for state in sorted(TERMINAL)]
            found += [self.keys.by_kind(partition, kind) for kind in sorted(kinds)]
        return found

    def run(self, *, now: float, kinds: Iterable[str]) -> int:
        """One pass over every index; returns how many entries were dropped. Sets ``backlog`` when some
        index still had a full batch of old entries (run again soon)."""
        horizon = now - self.retention_seconds
        indexes = self.indexes(kinds)
        pipe = self.redis.pipeline(transaction=False)
        for index in indexes:
            pipe.zrangebyscore(index, "-inf", horizon, start=self.offsets.get(index, 0), num=self.batch)
        read = zip(indexes, pipe.execute(), strict=True)
        candidates = {index: [member.decode() for member in members] for index, members in read}
        pipe = self.redis.pipeline(transaction=False)
        for members in candidates.values():
            for flow_id in members:
                pipe.exists(self.keys.flow(flow_id))
        exists = iter(pipe.execute())
        pipe = self.redis.pipeline(transaction=False)
        dropped = 0
        self.backlog = False
        for index, members in candidates.items():
            gone = [flow_id for flow_id in members if not next(exists)]
            live = len(members) - len(gone)
            if len(members) < self.batch:
                self.offsets[index] = 0  # reached the end of the old entries: start at the front next time
            else:
                self.offsets[index] = self.offsets.get(index, 0) + live
                self.backlog = True
            if gone:
                pipe.zrem(index, *gone)
                dropped += len(gone)
        if dropped:
            pipe.execute()
        return dropped


class EventTrimmer:
    """One per dispatcher: drops the events older than ``retention_seconds`` from every stream."""

    def __init__(self, client: Any, keys: Keys, retention_seconds: float, *, limit: int = TRIM_LIMIT) -> None:
        self.feed = EventFeed(client, keys)
        self.retention_seconds = retention_seconds
        self.limit = limit
        self.backlog = False

    def run(self) -> int:
        """One pass over every stream; returns how many events were dropped. Sets ``backlog`` when some
        stream may hold more old events than the pass dropped (run again soon)."""
        dropped, self.backlog = self.feed.trim(older_than_seconds=self.retention_seconds, limit=self.limit)
        return dropped
