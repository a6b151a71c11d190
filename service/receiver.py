"""The notification receiver: the gateway's server-to-server POST that moves a waiting flow on.

The gateway sends ``{eventId, eventTime, securityToken, operation}`` to the ``notificationUrl`` of the
order (``DURAPAY_RECEIVER__PUBLIC_URL``); this path is the only one open without the API key, so
everything it reads is treated as hostile until the token matches:

1. **Size**: at most ``DURAPAY_RECEIVER__MAX_BODY_BYTES``; a larger declared ``Content-Length`` is
   refused with 413 before reading, a larger streamed body as soon as the limit is crossed (counted
   ``oversized``; the API's gate reads nothing of this path, ``service.api_receiver`` reads it).
2. **Shape**: not UTF-8 JSON as the one input boundary reads it (``service.inbound``: UTF-16/32 or a
   byte order mark, nested deeper than its limit, a lone surrogate or a control character in an id, a
   number out of range), not an object, a field of the wrong type, no ``operation.orderId`` -> 400
   naming the problem (``{"outcome": "KO", "error": "..."}``); nothing is looked up.
3. **Token**: compared in constant time against every token kept for the order. A wrong token, a
   token of another order, no token and an unknown order all get the *same* answer, 401
   ``{"outcome": "KO", "error": "notification refused"}`` (an unknown order is compared against a
   random token, so timing does not tell either), and ``notifications_rejected`` is counted.
   An unknown order (no flow holds it: its record and lookups expired, or it was never durapay's) is
   also counted ``unknown_order`` and logged at WARNING with what it claims, and the merchant gets one
   ``notification.unknown_order`` event (``workflows.unknown_orders``: once per order id per hour, at
   most ``DURAPAY_RECEIVER__UNKNOWN_ORDER_EVENTS_PER_MINUTE``, the rest counted
   ``unknown_order_capped``), so that a payment on an order durapay forgot is found. That work is done
   after the answer is sent (:attr:`Receipt.after`, run by the HTTP route once the 401 is out), so the
   answer and its timing stay those of a bad token. An *authentic* notification that reaches no flow
   (its order lookup outlived the flow's record, or names none) is acknowledged, and told the same way.
4. **Once**: the event id (``eventId``, or a digest of the body when the gateway sent none) is
   claimed with ``SET NX`` and a TTL (``DURAPAY_RECEIVER__EVENT_TTL_SECONDS``). A repeated event is
   acknowledged with 200 and nothing else. A claim left ``pending`` by a receiver that died before
   finishing is taken over after ``stale_seconds``, so the gateway's retry still lands.
5. **The gateway's word**: the token proves only who the notification is for (it travels in every
   notification of the order), not what it says. Before the flow is signalled, the notified operation is
   read back, ``GET /operations/{operationId}`` (:meth:`NotificationReceiver.read_back`), and the
   signal carries the operation *as the gateway answered it*: a made-up result or amount never reaches
   a flow, and a payment is reported (taken, or ``late_payment``) only when the gateway has it.
   The gateway has no such operation (404): 503 ``operation not found at the gateway; try again``,
   counted ``unverified`` (the gateway retries an event it was not answered 200, and the operation may
   not be readable yet). The read fails (timeout, connection, 5xx...): 503, counted ``failed``. The
   operation read is another order's (or another operation): refused like a bad token (401, counted
   ``rejected``). In each of these the claim is released, so that a retry is processed.
6. **Durable before 200**: the flow gets a ``notification`` signal (stored in its record: resumed now
   if it waits, kept otherwise), the claim is marked done, and only then does the gateway get 200
   ``{"outcome": "OK"}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from durapay.config.settings import DEFAULT_TERMINAL, ReceiverSettings
from durapay.config.tracing import TRACE_FIELD, FlowTag
from durapay.gateway import (
    Catalogue,
    GatewayError,
    InvalidSecurityToken,
    Notification,
    NotificationError,
    Operation,
    parse_notification,
    verify_security_token,
)
from durapay.gateway import NotFound as OperationNotFound
from durapay.service.inbound import Refusal, decode_json, shown
from durapay.workflows.engine import Engine, Identifier, NotDurable, NotFound, ScriptPipeline, mask_text
from durapay.workflows.unknown_orders import UnknownOrders, bounded, claims

log = logging.getLogger("durapay.receiver")

OK: dict[str, Any] = {"outcome": "OK"}
REFUSED: dict[str, Any] = {"outcome": "KO", "error": "notification refused"}
REFUSED_STATUS = 401
#: The gateway has no such operation (404): not signalled, the gateway is asked to send it again.
UNVERIFIED: dict[str, Any] = {"outcome": "KO", "error": "operation not found at the gateway; try again"}
#: The operation could not be read (timeout, connection, 5xx...): the gateway is asked to send it again.
UNREAD: dict[str, Any] = {"outcome": "KO", "error": "could not read the operation at the gateway; try again"}

#: An operation id read back at the gateway has a character other than dots and spaces (also in the
#: OpenAPI document of the route, ``service.api_receiver``).
AN_OPERATION_ID = re.compile(r"[^.\s]")

#: Counter names (``engine.keys.counter(name)``) the receiver increments; ``/metrics`` reports them.
COUNTERS = (
    "accepted",
    "duplicate",
    "rejected",
    "malformed",
    "oversized",
    "unrouted",
    "unverified",
    "failed",
    "late_payment",
    "unknown_order",
    "unknown_order_capped",
)

# Compare-and-set of an event claim: take over a stale ``pending`` claim, or mark it ``done``.
_SWAP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
"""

_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True)
class Receipt:
    """What to answer the gateway, and what to do once it is answered (``after``: work whose time must
    not show in the answer's, run by the caller after sending it; see :meth:`NotificationReceiver.receive`)."""

    status: int
    body: dict[str, Any]
    after: Callable[[], None] | None = field(default=None, compare=False, repr=False)


def counter_key(engine: Engine, name: str) -> str:
    return str(engine.keys.counter(f"notifications_{name}"))


def bad_request(reason: str) -> Receipt:
    """A 400 naming the problem: quoting the body's text, so a card number in it is masked and its
    control characters escaped (the API's error answers alike, ``service.errors.error_response``)."""
    return Receipt(400, {"outcome": "KO", "error": shown(mask_text(reason))})


class NotificationReceiver:
    """Checks, records and delivers notifications. One per process; thread safe (Redis does the locking)."""

    def __init__(
        self,
        engine: Engine,
        settings: ReceiverSettings,
        *,
        stale_seconds: float = 30.0,
        settle_seconds: float = 2.0,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.redis: Any = engine.redis
        self.stale_seconds = stale_seconds
        self.settle_seconds = settle_seconds
        self._decoy = secrets.token_hex(16)
        self._swap = engine.redis.register_script(_SWAP)
        self._drop = engine.redis.register_script(_DROP)
        self.unknown_orders = UnknownOrders(
            engine.redis, engine.keys, engine.clock.now, per_minute=settings.unknown_order_events_per_minute
        )

    def count(self, name: str) -> None:
        try:
            self.redis.incr(counter_key(self.engine, name))
        except redis.RedisError:
            log.warning("could not count notifications_%s", name)

    def oversized(self) -> Receipt:
        self.count("oversized")
        return Receipt(413, {"outcome": "KO", "error": f"body larger than {self.settings.max_body_bytes} bytes"})

    def receive(self, body: bytes, *, defer: bool = False) -> Receipt:
        """Handle one notification body (already bounded in size); never raises on bad input.

        With ``defer`` the answer may carry work to do once it is sent (:attr:`Receipt.after`: the
        bookkeeping of an unknown order); without, that work is done before returning."""
        if not body.strip():
            self.count("malformed")
            return bad_request("body is empty")
        try:
            # The one input boundary (service.inbound): UTF-8 JSON, bounded in depth on the decoded text,
            # no lone surrogate or control character in an id, no number out of range.
            data = decode_json(body)
        except Refusal as refused:
            self.count("malformed")
            return bad_request(refused.reason if refused.field in (None, "(body)") else str(refused))
        if not isinstance(data, dict):
            self.count("malformed")
            return bad_request(f"body must be a JSON object, got {type(data).__name__}")
        try:
            notification = parse_notification(data)
        except NotificationError as exc:
            self.count("malformed")
            return bad_request(str(exc))
        except RecursionError:
            self.count("malformed")
            return bad_request("operation: nested too deeply")
        order_id = notification.order_id
        if not order_id:
            self.count("malformed")
            return bad_request("operation.orderId: missing")
        operation_id = notification.operation.operationId if notification.operation else ""
        if not operation_id.strip():
            self.count("malformed")  # nothing to read back at the gateway
            return bad_request("operation.operationId: missing")
        if not AN_OPERATION_ID.search(operation_id):
            self.count("malformed")  # dots: a path segment, not an id (the read would ask another URL)
            return bad_request("operation.operationId: not an operation id")
        try:
            receipt = self._deliver(notification, data, order_id, body)
            if receipt.after is not None and not defer:
                receipt.after()
                return Receipt(receipt.status, receipt.body)
            return receipt
        except (redis.RedisError, NotDurable) as exc:
            # Not recorded (Redis down), or recorded but not yet durable: the gateway must send it again.
            log.warning("notification for order %r not recorded: %s", bounded(order_id), exc)
            return Receipt(503, {"outcome": "KO", "error": "not recorded; try again"})

    def _deliver(self, notification: Notification, data: dict[str, Any], order_id: str, body: bytes) -> Receipt:
        flow_id, kept = self.engine.orders.lookup(order_id)
        try:
            # An unknown order is compared against a random token: same work, same answer.
            verify_security_token(notification, kept or [self._decoy])
            authentic = bool(kept)
        except InvalidSecurityToken:
            authentic = False
        if not authentic:
            self.count("rejected")
            if flow_id is None and not kept:
                return self._unknown(notification, order_id)
            log.warning("notification refused for order %r (known order)", bounded(order_id))
            return Receipt(REFUSED_STATUS, REFUSED)
        event_id = self.event_id(notification.eventId, body)
        if flow_id is None:
            self.count("unrouted")
            log.warning("authentic notification %s for order %s has no flow; acknowledged", event_id, order_id)
            return Receipt(200, OK, after=lambda: self.unknown_order(order_id, claims(notification.operation)))
        if self.engine.tracing.on:
            return self._traced_once(event_id, flow_id, notification, data)
        return self._once(event_id, flow_id, notification, data)

    def _traced_once(self, event_id: str, flow_id: str, notification: Notification, data: dict[str, Any]) -> Receipt:
        """:meth:`_once` in a span naming the flow (its read-back of the operation and its resume under it),
        linked to the flow's start (``config.tracing``). One read of the record more, only when tracing."""
        record = self.engine.store.get(flow_id)
        tag = FlowTag(
            flow_id, record.kind if record is not None else "", record.terminal if record is not None else DEFAULT_TERMINAL
        )
        link = record.fields.get(TRACE_FIELD, "") if record is not None else ""
        self.engine.tracing.tag_current(tag)  # the request's server span
        with self.engine.tracing.flow_span("notification", tag, link=link, attributes={"durapay.event": event_id}):
            receipt = self._once(event_id, flow_id, notification, data)
            self.engine.tracing.annotate({"durapay.answer": receipt.status})
            return receipt

    def _unknown(self, notification: Notification, order_id: str) -> Receipt:
        """An order no flow holds: refused like a bad token (its token cannot be checked), logged with
        what the body claims, then (after the answer) counted and told to the merchant."""
        claimed = claims(notification.operation)
        log.warning(
            "notification refused for order %r: no flow holds it (expired, or never durapay's), its token cannot be "
            "checked; it claims operation %r %s of %s %s; look the order up at the gateway",
            bounded(order_id),
            claimed["operationId"],
            claimed["operationResult"],
            claimed["amount"],
            claimed["currency"],
        )
        return Receipt(REFUSED_STATUS, REFUSED, after=lambda: self.unknown_order(order_id, claimed))

    def unknown_order(self, order_id: str, claimed: dict[str, str | None], *, verified: bool = False) -> None:
        """Tell the merchant of a notification for ``order_id`` that no flow holds (``notification.unknown_order``,
        bounded: see ``workflows.unknown_orders``) and count it. Never raises: it runs after the answer."""
        announced = None
        if self.engine.settings.events.enabled:
            try:
                announced = self.unknown_orders.announce(order_id, claimed, verified=verified)
            except Exception as exc:  # noqa: BLE001 - a cluster client raises its own; the count still runs
                log.warning("notification.unknown_order for order %r not written: %s", bounded(order_id), exc)
        self.count("unknown_order")
        if announced == "capped":
            self.count("unknown_order_capped")
            log.info("notification.unknown_order for order %r not written: the minute's cap is reached", bounded(order_id))

    @staticmethod
    def event_id(given: str | None, body: bytes) -> str:
        if given and len(given) <= 200:
            return given
        return "sha256:" + hashlib.sha256(given.encode() if given else body).hexdigest()

    def _once(self, event_id: str, flow_id: str, notification: Notification, data: dict[str, Any]) -> Receipt:
        key = self.engine.keys.event(event_id)
        pending = json.dumps({"state": "pending", "flow": flow_id, "t": self.engine.clock.now()})
        if not self.redis.set(key, pending, nx=True, ex=self.settings.event_ttl_seconds):
            taken = self._settle(key, event_id)
            if taken is None:
                self.count("duplicate")
                return Receipt(200, OK)
            if taken == "":
                return Receipt(503, {"outcome": "KO", "error": "this event is being recorded; try again"})
            pending = taken
        try:
            verified = self._verify(notification, event_id, self.terminal_of(flow_id))
        except Exception:
            self.count("failed")
            self._release(key, pending)
            raise
        if isinstance(verified, Receipt):
            self._release(key, pending)
            return verified
        # The gateway's operation, never the body's: only what the gateway has moves money state.
        payload = {"eventId": event_id, "eventTime": data.get("eventTime"), "operation": verified.wire()}
        try:
            result = self._hand_over(flow_id, payload)
        except Exception:
            self.count("failed")
            self._release(key, pending)
            raise
        pipe = ScriptPipeline(self.redis)
        pipe.call(self._swap, [key], [pending, json.dumps({"state": "done", "flow": flow_id, "result": result})])
        pipe.command("INCRBY", counter_key(self.engine, "accepted"), 1)
        pipe.execute()
        # The operation as the gateway has it (read back): an identifier, whole in the log line (an
        # operation id the body only claims is not, and is masked like any number there).
        log.info("notification %s for flow %s: %s (operation %s)", event_id, flow_id, result, Identifier(verified.operationId))
        if result == "missing":
            # Its order lookup outlived the flow's record: money no flow shows, told like an unknown order.
            order_id = str(verified.orderId)
            return Receipt(200, OK, after=lambda: self.unknown_order(order_id, claims(verified), verified=True))
        return Receipt(200, OK)

    def terminal_of(self, flow_id: str) -> str | None:
        """The gateway terminal of the flow a notification is for: its read-back uses that terminal's key
        (another terminal's would not see the operation). One read (the record's ``kind`` and ``terminal``, both
        plain on a packed record: ``workflows.engine.compact.PLAIN``), also when this process declares no terminal
        but default: the flow may be of a terminal removed from the settings since. None when the record is
        gone (its order lookup outlived it): the terminal is not known then, and :meth:`_verify` reads with
        each declared terminal's key."""
        known, named = self.redis.hmget(self.engine.keys.flow(flow_id), "kind", "terminal")
        if known is None:
            return None
        return named.decode() if isinstance(named, bytes) else named or DEFAULT_TERMINAL

    def read_back(self, notified: Operation, terminal: str = DEFAULT_TERMINAL) -> Operation:
        """The notified operation as the gateway has it: ``GET /operations/{operationId}``, with the key of
        the flow's own terminal."""
        return self.engine.gateway(terminal).call(Catalogue.get_operation, notified.operationId)

    def _verify(self, notification: Notification, event_id: str, terminal: str | None = DEFAULT_TERMINAL) -> Operation | Receipt:
        """The operation to signal (the gateway's), or what to answer instead. ``terminal``: the flow's
        (its key only reads it back), or None when its record is gone: then each declared terminal's key in
        turn (``default`` first) until one's gateway has the operation, since the order's terminal is not
        known and only the right key sees it (a payment no flow shows is then told, not retried for ever)."""
        notified = notification.operation
        assert notified is not None  # receive() refused a notification without one
        if terminal is not None and terminal not in self.engine.terminals.names:
            # Never read with another terminal's key: the gateway sends it again, and a process declaring
            # the terminal verifies it (docs/operations.md, Terminals: removing one).
            self.count("failed")
            log.error(
                "notification %s: the flow's terminal %r is not in this process's settings (DURAPAY_TERMINALS); retry asked",
                event_id,
                terminal,
            )
            return Receipt(503, {"outcome": "KO", "error": f"the flow's terminal {terminal!r} is not declared here; try again"})
        found: Operation | None = None
        unread: GatewayError | None = None
        for name in [terminal] if terminal is not None else self.engine.terminals.names:
            try:
                found = self.read_back(notified, name)
                break
            except OperationNotFound:
                continue
            except GatewayError as exc:  # another terminal's key may still find it: read on, then answer
                unread = exc
        if found is None and unread is not None:
            self.count("failed")
            log.warning("notification %s: operation %s not read at the gateway: %s", event_id, notified.operationId, unread)
            return Receipt(503, UNREAD)
        if found is None:
            self.count("unverified")
            log.warning(
                "notification %s: the gateway has no operation %s (order %s); not signalled, retry asked",
                event_id,
                notified.operationId,
                notified.orderId,
            )
            return Receipt(503, UNVERIFIED)
        if found.operationId != notified.operationId or found.orderId != notified.orderId:
            self.count("rejected")
            log.warning(
                "notification %s refused: operation %s is of order %s at the gateway, not of the notified %s",
                event_id,
                notified.operationId,
                found.orderId,
                notified.orderId,
            )
            return Receipt(REFUSED_STATUS, REFUSED)
        return found

    def _hand_over(self, flow_id: str, payload: dict[str, Any]) -> str:
        """Signal the flow. A payment reported for a flow that already ended without one is never
        dropped: the engine moves the flow to a person (``late_payment``)."""
        try:
            result = self.engine.signal(flow_id, "notification", payload, by="notification")
            if result == "late_payment":
                self.count("late_payment")
            return result
        except NotFound:
            return "missing"

    def _release(self, key: str, claim: str) -> None:
        """Free our claim after a failure, so that the gateway's retry is not taken for a repeat."""
        try:
            self._drop(keys=[key], args=[claim])
        except redis.RedisError:
            log.warning("could not release the claim %s; a retry takes it over after %ss", key, self.stale_seconds)

    def _settle(self, key: str, event_id: str) -> str | None:
        """A repeat: None once the first delivery is done; the new claim when a stale one was taken
        over; "" when the first delivery is still in flight after ``settle_seconds``."""
        deadline = time.monotonic() + self.settle_seconds
        pause = 0.01
        while True:
            raw = self.redis.get(key)
            if raw is None:
                # Expired or freed after a failure: claim it afresh.
                fresh = json.dumps({"state": "pending", "t": self.engine.clock.now()})
                if self.redis.set(key, fresh, nx=True, ex=self.settings.event_ttl_seconds):
                    return fresh
                continue
            try:
                claim = json.loads(raw)
            except ValueError:
                claim = {"state": "pending", "t": 0}
            if claim.get("state") == "done":
                return None
            if self.engine.clock.now() - float(claim.get("t", 0)) > self.stale_seconds:
                fresh = json.dumps({"state": "pending", "flow": claim.get("flow"), "t": self.engine.clock.now()})
                if self._swap(keys=[key], args=[raw, fresh]):
                    log.warning("notification %s: took over a stale claim", event_id)
                    return fresh
                continue
            if time.monotonic() >= deadline:
                return ""
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
