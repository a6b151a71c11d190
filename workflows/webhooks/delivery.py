"""Webhook delivery: from the event streams to each subscribed endpoint, durably, at least once.

The path of an event, every step either atomic or repeated until it holds:

1. **Fan-out** (the dispatcher's ticker, ``fanout.lua``): the stream's new entries become one delivery
   per subscribed endpoint on the partition's delivery due set, and the stream's fan-out cursor moves
   past them, in one script; an event is ahead of the cursor or has its deliveries, never neither.
2. **Take** (same ticker, ``take_due.lua``): due deliveries are pushed back by a lease and sent to the
   workers as ``durapay.webhooks.deliver`` tasks; a lost task, or a worker killed mid-attempt, leaves
   the delivery on the due set, where it comes due again when the lease ends.
3. **Attempt** (a worker, :meth:`Webhooks.deliver`): a signed POST (``signing``) with a timeout;
   ``record.lua`` then logs the attempt and removes the delivery (2xx, or given up) or puts it back
   due at its next retry, in one script.

Retries: immediately, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h... each with +-20% jitter, and
never sooner than an answer's ``Retry-After``; a delivery still failing ``retry_days`` after its first
attempt is given up (logged and kept in the attempts). ``410 Gone`` disables the endpoint at once; an
endpoint whose failing streak has lasted ``disable_after_days`` is disabled too, and reported (error
log, and its reason on ``GET /webhooks``). The streak (``endpoints``' docstring has the rule) starts at
a failed attempt and goes on while failed deliveries still have retries due; a successful delivery, a
successful test and an operator's ``enable`` end it, and a give-up lets it lapse. A receiver may see an
event more than once (a worker killed after the POST, before its record): the ``webhook-id`` header,
the event id, is the same on every attempt.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from durapay.config.settings import DEFAULT_TERMINAL, WEBHOOK_JITTER, WEBHOOK_RETRY_AFTER_CAP_SECONDS, WebhooksSettings
from durapay.config.tracing import OFF, TRACE_FIELD, FlowTag, Tracing
from durapay.gateway import bounded
from durapay.workflows.engine import (
    Cursor,
    Event,
    EventFeed,
    Keys,
    ScriptPipeline,
    decode_entry,
    iso,
    moment_id,
    server_time,
    source,
)
from durapay.workflows.webhooks.endpoints import TEST_TYPE, Endpoint, EndpointStore, resolve_public
from durapay.workflows.webhooks.signing import sign
from durapay.workflows.webhooks.transport import Poster

log = logging.getLogger("durapay.webhooks")

#: The default delay before attempt n+1 (index n: attempts made so far; ``DURAPAY_WEBHOOKS__RETRY_DELAYS``).
SCHEDULE = tuple(WebhooksSettings().retry_delays)
JITTER = WEBHOOK_JITTER
#: Deliveries of one endpoint sent in one task (fewer broker messages; a failure defers the rest).
TASK_BATCH = 20
#: The longest Retry-After honoured (a longer one is taken as this).
RETRY_AFTER_CAP = WEBHOOK_RETRY_AFTER_CAP_SECONDS

Send = Callable[[str, list[str]], None]


def _lua(name: str) -> str:
    return source(f"webhooks/lua/{name}")


def next_delay(attempts: int, rng: random.Random, delays: Sequence[float] = SCHEDULE) -> float:
    """Seconds before the next attempt after ``attempts`` attempts (jittered, never negative)."""
    base = delays[min(attempts, len(delays) - 1)]
    return max(0.0, base * (1 + rng.uniform(-JITTER, JITTER)))


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds asked by a ``Retry-After`` header (seconds or an HTTP date), capped; None if absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


def payload(event: Event) -> bytes:
    """The body of every delivery of ``event`` (its wire form, compact JSON): what is signed and sent."""
    return json.dumps(event.wire(), separators=(",", ":")).encode()


def signed_headers(msg_id: str, body: bytes, secrets_: Sequence[str], at: float) -> dict[str, str]:
    """The headers of one delivery: JSON, durapay's agent, and the Standard Webhooks signature at ``at``
    with every secret in ``secrets_`` (``durapay listen`` signs its forwards the same way)."""
    headers = {"content-type": "application/json", "user-agent": "durapay-webhooks/1"}
    return headers | sign(msg_id, body, secrets_, timestamp=int(at))


@dataclass(frozen=True)
class Slot:
    """The delivery keys of one event stream (``p3``, ``s0``), all in that stream's hash slot."""

    tag: str
    stream: str
    base: str

    @property
    def cursor(self) -> str:
        return f"{self.base}:whk:cursor"

    @property
    def due(self) -> str:
        return f"{self.base}:whk:due"

    @property
    def state(self) -> str:
        return f"{self.base}:whk:state"

    def attempts(self, endpoint_id: str) -> str:
        return f"{self.base}:whk:attempts:{endpoint_id}"


class Webhooks:
    """Fan-out, delivery and the read side (attempts, replay) of webhooks. One per process."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        settings: WebhooksSettings,
        *,
        send: Send | None = None,
        now: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self.redis = client
        self.keys = keys
        #: Each delivery attempt a span linked to its flow's trace (``config.tracing``); off by default.
        self.tracing = tracing
        self.settings = settings
        self.send = send
        self.now = now
        self.rng = rng or random.Random()
        self.endpoints = EndpointStore(client, keys, settings)
        self.feed = EventFeed(client, keys)
        self.slots = {tag: Slot(tag, key, key.rsplit(":", 1)[0]) for tag, key in self.feed.streams().items()}
        self._fanout = client.register_script(_lua("fanout.lua"))
        self._record = client.register_script(_lua("record.lua"))
        self._replay = client.register_script(_lua("replay.lua"))
        self._take = client.register_script(source("engine/lua/take_due.lua"))
        self.poster = Poster(timeout=settings.timeout, connect_timeout=settings.connect_timeout)

    # -- the dispatcher's side ---------------------------------------------------------------------

    def tick(self) -> int:
        """One pass (a dispatcher ticker): fan new events out, then send what is due. Returns deliveries sent."""
        self.fanout()
        return self.send_due()

    def fanout(self) -> int:
        """Fan every stream's new events out to the enabled endpoints; returns deliveries added."""
        # The time first, then the endpoints (two round trips: a cluster takes no TIME in a pipeline).
        read_at = int(server_time(self.redis) * 1000)
        raw = self.redis.hvals(self.endpoints.key)
        wanted = [endpoint.fanout() for endpoint in self.endpoints.all() if endpoint.enabled] if raw else []
        now = self.now()
        pipe = ScriptPipeline(self.redis)
        for slot in self.slots.values():
            pipe.call(
                self._fanout,
                [slot.stream, slot.cursor, slot.due, slot.state],
                [json.dumps(wanted), repr(now), self.settings.batch, read_at],
            )
        return sum(int(added) for _, added in pipe.execute())

    def send_due(self) -> int:
        """Take the due deliveries of every stream (pushed back by a lease) and send them; returns how many."""
        now = self.now()
        pipe = ScriptPipeline(self.redis)
        for slot in self.slots.values():
            pipe.call(self._take, [slot.due], [repr(now), self.settings.batch, self.settings.lease_seconds])
        sent = 0
        for slot, members in zip(self.slots.values(), pipe.execute(), strict=True):
            by_endpoint: dict[str, list[str]] = {}
            for raw in members:
                member = raw.decode() if isinstance(raw, bytes) else str(raw)
                by_endpoint.setdefault(member.partition("|")[2], []).append(member)
            for batch in by_endpoint.values():
                for start in range(0, len(batch), TASK_BATCH):
                    chunk = batch[start : start + TASK_BATCH]
                    if self.send is not None:
                        self.send(slot.tag, chunk)
                    else:
                        self.deliver_many(slot.tag, chunk)
                    sent += len(chunk)
        return sent

    # -- the worker's side -------------------------------------------------------------------------

    def deliver_many(self, tag: str, members: list[str]) -> list[dict[str, Any]]:
        """Attempt each delivery of ``members`` (one endpoint's, one stream's) in turn; the attempts made.

        When an attempt fails, the endpoint is taken as failing: the deliveries not tried yet are put
        back due at that attempt's next time (untried, their counts unchanged), not sent into the same
        outage one by one, each no later than the end of its own retry window (its last attempt is made
        there, while its event is still kept: the settings check the window against the retention). The
        batch also stops at half a lease, putting the rest back due now, so that
        no delivery of it is taken again while this task still holds it."""
        started = time.monotonic()
        made: list[dict[str, Any]] = []
        for index, member in enumerate(members):
            if time.monotonic() - started > self.settings.lease_seconds / 2:
                self._put_back(tag, members[index:], self.now())
                break
            attempt = self.deliver(tag, member)
            if attempt is None:
                continue
            made.append(attempt)
            if not attempt["ok"] and attempt.get("nextAt") is not None:
                self._put_back(tag, members[index + 1 :], float(attempt["nextAt"]))
                break
        return made

    def _put_back(self, tag: str, members: list[str], due: float) -> None:
        """Make ``members`` due at ``due``, or at the end of its retry window for one whose window ends
        sooner (one never tried yet has not started its window)."""
        if not members:
            return
        slot = self.slots[tag]
        window = self.settings.retry_days * 86400
        states = self.redis.hmget(slot.state, members)
        dues = {}
        for member, raw in zip(members, states, strict=True):
            first = json.loads(raw).get("f") if raw else None
            dues[member] = min(due, float(first) + window) if first is not None else due
        self.redis.zadd(slot.due, dues, xx=True)

    def deliver(self, tag: str, member: str) -> dict[str, Any] | None:
        """Make one attempt of the delivery ``member`` (``<entry id>|<endpoint id>``) of stream ``tag``
        and record it. Returns the attempt, or None when there was nothing to do (already done)."""
        slot = self.slots.get(tag)
        if slot is None:
            return None
        entry, _, endpoint_id = member.partition("|")
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(slot.state, member)
        pipe.zscore(slot.due, member)
        pipe.xrange(slot.stream, min=entry, max=entry)
        pipe.hget(self.endpoints.key, endpoint_id)
        raw_state, score, entries, raw_endpoint = pipe.execute()
        if raw_state is None or score is None:
            return None  # delivered (or dropped) by an earlier try of this task
        if float(score) > self.now() + self.settings.lease_seconds + 1:
            return None  # a stale copy of a task: its delivery was rescheduled later (a Retry-After...)
        state = json.loads(raw_state)
        made = int(state.get("n", 0))
        endpoint = self.endpoints.decode(raw_endpoint) if raw_endpoint else None
        if not entries:
            return self._drop(slot, member, endpoint_id, made, "event expired (older than the retention)")
        if endpoint is None:
            return self._drop(slot, member, endpoint_id, made, "endpoint removed")
        if not endpoint.enabled:
            return self._drop(slot, member, endpoint_id, made, f"endpoint disabled: {endpoint.disabled_reason}")
        event = decode_entry(tag, *entries[0])
        if self.tracing.on:
            attempt = self._traced_attempt(endpoint, event, made)
        else:
            attempt = self.attempt(endpoint, event.id, event.type, payload(event))
        attempt["attempt"] = made + 1
        now = self.now()
        following = self._following(attempt, endpoint, made, float(state.get("f", now)), now)
        pipe = ScriptPipeline(self.redis)
        pipe.call(
            self._record,
            [slot.due, slot.state, slot.attempts(endpoint.id)],
            [member, json.dumps(attempt), "" if following is None else repr(following), self.settings.attempts_kept, made],
        )
        if attempt["ok"]:
            pipe.command("HDEL", self.endpoints.failing_key, endpoint.id)  # a success ends the failing streak
        pipe.execute()
        return attempt

    def _traced_attempt(self, endpoint: Endpoint, event: Event, made: int) -> dict[str, Any]:
        """:meth:`attempt` in a span of its own (a delivery runs later than the transition it tells of),
        linked to the flow's trace when the event is a flow's."""
        flow_id, kind = str(event.body.get("flow") or ""), str(event.body.get("kind") or "")
        link = ""
        if flow_id:
            kept = self.redis.hget(self.keys.flow(flow_id), TRACE_FIELD)
            link = kept.decode() if kept else ""
        attributes: dict[str, Any] = {
            "durapay.event": event.id,
            "durapay.event_type": event.type,
            "durapay.endpoint": endpoint.id,
        }
        attributes["durapay.attempt"] = made + 1
        with self.tracing.flow_span(
            f"webhook {event.type}",
            FlowTag(flow_id, kind, str(event.body.get("terminal") or DEFAULT_TERMINAL)),  # an event off default names it
            link=link,
            attributes=attributes,
            root=True,
            kind="client",
        ):
            attempt = self.attempt(endpoint, event.id, event.type, payload(event))
            self.tracing.annotate({"http.response.status_code": attempt["status"] or 0, "durapay.delivered": attempt["ok"]})
        return attempt

    def attempt(self, endpoint: Endpoint, msg_id: str, event_type: str, body: bytes) -> dict[str, Any]:
        """POST ``body`` signed to ``endpoint`` once; the attempt as recorded (status, latency, excerpt...)."""
        started = time.time()
        record: dict[str, Any] = {"event": msg_id, "type": event_type, "endpoint": endpoint.id, "at": iso(started)}
        try:
            # One deadline for the name's resolution and the POST together (``Poster.deadline``).
            with bounded(self.poster.deadline):
                # Connect to the address checked, never resolving the name again (DNS rebinding).
                address = None if self.settings.allow_private else resolve_public(endpoint.url)
                headers = signed_headers(msg_id, body, endpoint.secrets(started), started)
                answer = self.poster.post(endpoint.url, body, headers, excerpt=self.settings.excerpt_bytes, address=address)
            record["status"] = answer.status
            record["ok"] = 200 <= answer.status < 300
            record["response"] = answer.text
            later = retry_after(answer.retry_after, time.time())
            if later is not None:
                record["retryAfter"] = later
        except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a name the resolver refuses
            record["status"] = None
            record["ok"] = False
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        record["latencyMs"] = round((time.time() - started) * 1000, 1)
        return record

    def _following(self, attempt: dict[str, Any], endpoint: Endpoint, made: int, first: float, now: float) -> float | None:
        """When the next attempt is due (None: no more), after the endpoint's health is updated."""
        if attempt["ok"]:
            attempt["outcome"] = "delivered"
            return None
        if attempt.get("status") == 410:
            self.endpoints.disable(endpoint.id, "410 Gone: the endpoint asked to receive no more")
            log.error("webhook endpoint %s (%s) answered 410 Gone: disabled", endpoint.id, endpoint.url)
            attempt["outcome"] = "endpoint disabled (410 Gone)"
            return None
        given_up = now - first >= self.settings.retry_days * 86400
        retry_at = None
        if not given_up:
            delay = next_delay(made + 1, self.rng, self.settings.retry_delays)
            # An endpoint's Retry-After is honoured up to the end of the retry window, never past it: the
            # event must still be there for the last attempt (the settings check the window against the
            # events' retention).
            window = first + self.settings.retry_days * 86400 - now
            retry_at = now + max(delay, min(float(attempt.get("retryAfter") or 0.0), window))
        # The failure joins the endpoint's failing streak, which then awaits this delivery's retry (a
        # give-up awaits nothing: with no other retry due, the streak lapses).
        since = self.endpoints.failed(endpoint.id, now, retry_at)
        if now - since >= self.settings.disable_after_days * 86400:
            days = (now - since) / 86400
            self.endpoints.disable(endpoint.id, f"failing for {days:.1f} days without a success")
            log.error("webhook endpoint %s (%s) failing for %.1f days: disabled", endpoint.id, endpoint.url, days)
            attempt["outcome"] = "endpoint disabled (failing)"
            return None
        if retry_at is None:
            log.warning("webhook %s to %s given up after %d attempts", attempt["event"], endpoint.id, made + 1)
            attempt["outcome"] = "given up"
            return None
        attempt["outcome"] = "retry"
        attempt["nextAttempt"] = iso(retry_at)
        attempt["nextAt"] = retry_at
        return retry_at

    def _drop(self, slot: Slot, member: str, endpoint_id: str, made: int, why: str) -> dict[str, Any]:
        attempt: dict[str, Any] = {
            "event": "evt_" + slot.tag + "_" + member.partition("|")[0],
            "endpoint": endpoint_id,
            "at": iso(time.time()),
        }
        attempt |= {"status": None, "ok": False, "outcome": "dropped", "error": why, "attempt": made + 1}
        kept = self.settings.attempts_kept
        self._record(keys=[slot.due, slot.state, slot.attempts(endpoint_id)], args=[member, json.dumps(attempt), "", kept, made])
        return attempt

    # -- the merchant's side: test, attempts, replay -------------------------------------------------

    def test(self, endpoint_id: str) -> dict[str, Any] | None:
        """Send one ``webhook.test`` event to the endpoint now (not retried) and record the attempt. A
        success ends the endpoint's failing streak; a failure leaves it as it was (see ``endpoints``)."""
        endpoint = self.endpoints.get(endpoint_id)
        if endpoint is None:
            return None
        moment = time.time()
        msg_id = f"evt_test_{moment_id(moment)}-{self.rng.randrange(1 << 16)}"
        body = {"id": msg_id, "type": TEST_TYPE, "timestamp": iso(moment), "data": {"endpoint": endpoint.id}}
        attempt = self.attempt(endpoint, msg_id, TEST_TYPE, json.dumps(body, separators=(",", ":")).encode())
        attempt["attempt"] = 1
        attempt["outcome"] = "delivered" if attempt["ok"] else "test failed"
        slot = next(iter(self.slots.values()))
        pipe = self.redis.pipeline(transaction=False)
        pipe.lpush(slot.attempts(endpoint.id), json.dumps(attempt))
        pipe.ltrim(slot.attempts(endpoint.id), 0, self.settings.attempts_kept - 1)
        if attempt["ok"]:
            pipe.hdel(self.endpoints.failing_key, endpoint.id)  # it answers again: the failing streak ends
        pipe.execute()
        return attempt

    def attempts(self, endpoint_id: str, *, limit: int = 50) -> list[dict[str, Any]]:
        """The endpoint's latest attempts, newest first (at most ``attempts_kept`` per stream are kept)."""
        pipe = self.redis.pipeline(transaction=False)
        for slot in self.slots.values():
            pipe.lrange(slot.attempts(endpoint_id), 0, limit - 1)
        found = [json.loads(raw) for rows in pipe.execute() for raw in rows]
        found.sort(key=lambda attempt: str(attempt.get("at")), reverse=True)
        return found[:limit]

    def pending(self) -> int:
        """Deliveries not yet made (due now or later), over every stream."""
        pipe = self.redis.pipeline(transaction=False)
        for slot in self.slots.values():
            pipe.zcard(slot.due)
        return sum(int(count) for count in pipe.execute())

    def deliver_now(self, endpoint_id: str | None = None, *, limit: int = 10_000) -> int:
        """Make the pending deliveries waiting for a later retry (of ``endpoint_id``, or every endpoint) due
        now, at most ``limit``: after a receiver's outage in development, instead of waiting out the backoff.
        A delivery due within a lease is left as it is: it may be in flight, and would be sent twice."""
        now = self.now()
        later = now + self.settings.lease_seconds + 1
        moved = 0
        for slot in self.slots.values():
            members = [
                m.decode() if isinstance(m, bytes) else str(m)
                for m in self.redis.zrangebyscore(slot.due, f"({later}", "+inf", start=0, num=limit - moved)
            ]
            if endpoint_id is not None:
                members = [member for member in members if member.partition("|")[2] == endpoint_id]
            if members:
                moved += int(self.redis.zadd(slot.due, dict.fromkeys(members, now), xx=True, ch=True))
            if moved >= limit:
                break
        return moved

    def replay(
        self,
        after: Cursor | None = None,
        *,
        until: float | None = None,
        endpoint_id: str | None = None,
        types: Iterable[str] | None = None,
    ) -> int:
        """Send again every event after ``after`` (up to time ``until``) to each enabled endpoint that
        wants it (or only ``endpoint_id``); returns the deliveries scheduled. The ids are the events'
        own, so an idempotent receiver applies nothing twice."""
        endpoints = [endpoint for endpoint in self.endpoints.all() if endpoint.enabled]
        if endpoint_id is not None:
            endpoints = [endpoint for endpoint in endpoints if endpoint.id == endpoint_id]
        by_slot: dict[str, list[str]] = {}
        cursor = after or Cursor()
        while endpoints:
            page, following = self.feed.read(cursor, types=types, limit=500)
            for event in page:
                if until is not None and event.time > until:
                    continue
                for endpoint in endpoints:
                    if endpoint.wants(event.type):
                        by_slot.setdefault(event.stream, []).append(f"{event.entry}|{endpoint.id}")
            if following == cursor:
                break
            cursor = following
        now = self.now()
        for tag, members in by_slot.items():
            slot = self.slots[tag]
            for start in range(0, len(members), 500):
                self._replay(keys=[slot.due, slot.state], args=[repr(now), *members[start : start + 500]])
        return sum(len(members) for members in by_slot.values())
