"""Webhook endpoints: where events are sent, which types, with which secret; kept in Redis.

One hash, ``<prefix>:webhooks:endpoints`` (endpoint id -> JSON), read whole at every fan-out: a
merchant has a handful of endpoints, not thousands. Endpoints come from the API, the CLI (both through
:class:`EndpointStore`) and the settings (``DURAPAY_WEBHOOKS__ENDPOINTS``, written here by
:meth:`EndpointStore.sync_configured` with an id derived from the URL, so every process agrees).

URLs are checked (:func:`check_url`): https only and no loopback, private, link-local or otherwise
internal address, so that a webhook cannot be pointed at the internal network; the delivery checks the
resolved address again before each attempt (a name may resolve elsewhere later).
``DURAPAY_WEBHOOKS__ALLOW_PRIVATE=true`` lifts both rules, for development and tests.

A rotation makes a new secret and keeps the previous one valid for ``rotation_hours``: meanwhile every
attempt carries both signatures, and a receiver holding either accepts it.

**Health: the failing streak.** An endpoint is disabled (``delivery``) at a failed delivery attempt made
``disable_after_days`` or more after its *failing streak* began. The streak is meant to say "every
attempt has failed, and the endpoint was being tried all along"; one rule says when it starts and ends
(kept here, in ``<prefix>:webhooks:failing``: endpoint id -> ``"<since> <awaited>"``, POSIX seconds):

* **It starts** at a failed delivery attempt when no streak is running (``since``: that attempt's time).
* **It goes on** at each failed delivery attempt that comes while it still awaits one: a failure that
  schedules a retry makes the streak await that retry (``awaited``: the latest retry time so far),
  plus :data:`STREAK_SLACK` for a worker that is late.
* **It ends** at a successful delivery, at a successful ``webhook.test`` (the endpoint answers again)
  and at an operator's ``enable`` (the operator's word that it is fixed, whatever its last attempts
  said); and when the endpoint is removed.
* **It lapses** when it awaits nothing: a delivery *given up* schedules no retry (nor does one dropped),
  so once every failing delivery of the endpoint was given up, the next failure, whenever it comes,
  starts a new streak. Durapay did not try the endpoint meanwhile; the days it was not tried
  are not days of failing. What was given up is lost to the endpoint (``durapay events replay``
  sends it again), which is the cost of a failing endpoint, not a reason to disable it later.

A failed test neither starts nor prolongs a streak: it retries nothing, and an operator probing an
endpoint must not bring it nearer to being disabled. With the default settings (a delivery retried
for 3 days, disabled after 5), an endpoint is disabled only when deliveries keep failing for 5 days
running: new events keep coming and none gets through.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from durapay.config.settings import WebhooksSettings
from durapay.gateway import lookup
from durapay.workflows.engine import CARD_IDENTIFIER, EVENT_TYPES, Keys, card_like, derived_id, mask_text, server_time
from durapay.workflows.webhooks.signing import new_secret, secret_key

#: The synthetic type sent by ``durapay webhooks test`` (never written to the event streams).
TEST_TYPE = "webhook.test"

#: Writes a new endpoint stamped with the server's time (``after``: the ms from which stream entries are
#: its, compared with entry ids by the fan-out; stamped in the same step as the write, see fanout.lua's
#: read_at). ``after`` is the millisecond *following* the creation's: an event written earlier in the
#: creation's own millisecond is not the endpoint's (``EndpointStore._write`` then waits for the server's
#: clock to reach ``after``, so an event written once the creation is answered always is).
_ADD = """
local t = redis.call('TIME')
local endpoint = cjson.decode(ARGV[2])
endpoint['created'] = tonumber(t[1]) + tonumber(t[2]) / 1000000
endpoint['after'] = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + 1
local encoded = cjson.encode(endpoint)
redis.call('HSET', KEYS[1], ARGV[1], encoded)
return encoded
"""

#: How late an awaited retry may come and still prolong the failing streak: an attempt comes after its
#: due time by the dispatcher's tick, a worker's queue, a lease ended on a lost task (a minute) or a
#: restart. An hour covers those and is nothing beside the days a streak is measured in; a retry later
#: than that starts a new streak (the lenient side: an endpoint is disabled later, never sooner).
STREAK_SLACK = 3600.0

#: Counts a failed delivery attempt in the endpoint's failing streak (the rule: module docstring) and
#: answers when the streak began. KEYS: 1 the streaks hash. ARGV: 1 endpoint id, 2 now, 3 when the
#: streak awaits the next attempt after this one (the retry's time; now when none follows), 4 the
#: slack. A value not of the form "<since> <awaited>" (one written before streaks lapsed) starts anew.
_FAILED = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local now = tonumber(ARGV[2])
local since, awaited = ARGV[2], ARGV[3]
if raw then
  local held_since, held_awaited = string.match(raw, '^(%S+) (%S+)$')
  if tonumber(held_since) and tonumber(held_awaited) and now <= tonumber(held_awaited) + tonumber(ARGV[4]) then
    since = held_since
    if tonumber(held_awaited) > tonumber(awaited) then awaited = held_awaited end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], since .. ' ' .. awaited)
return since
"""

_PATCH = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return nil end
local endpoint = cjson.decode(raw)
for name, value in pairs(cjson.decode(ARGV[2])) do endpoint[name] = value end
local encoded = cjson.encode(endpoint)
redis.call('HSET', KEYS[1], ARGV[1], encoded)
return encoded
"""


class EndpointError(ValueError):
    """An endpoint input refused: ``field`` names it, ``reason`` says why (not worth retrying as is)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Endpoint:
    """One endpoint. ``events`` empty: every type. Times are POSIX seconds (the server's clock)."""

    id: str
    url: str
    secret: str
    events: list[str] = field(default_factory=list)
    description: str = ""
    created: float = 0.0
    after: int = 0
    enabled: bool = True
    disabled_reason: str = ""
    disabled_at: float | None = None
    previous_secret: str = ""
    previous_until: float = 0.0
    source: str = "api"

    def __post_init__(self) -> None:
        # Free text is masked where it is written (workflows.engine.sensitive): a card number typed into a
        # description, or quoted in the reason it was disabled, is never stored or shown whole.
        object.__setattr__(self, "description", mask_text(self.description))
        object.__setattr__(self, "disabled_reason", mask_text(self.disabled_reason))

    def wants(self, event_type: str) -> bool:
        return not self.events or event_type in self.events

    def secrets(self, now: float) -> list[str]:
        """The secrets an attempt at ``now`` is signed with: the current one, and the previous one while valid."""
        return [self.secret, self.previous_secret] if self.previous_secret and now < self.previous_until else [self.secret]

    def view(self, *, with_secret: bool = False) -> dict[str, Any]:
        """The endpoint as the API and CLI show it (the secret only right after it was made)."""
        shown: dict[str, Any] = {
            "id": self.id,
            "url": self.url,
            "events": list(self.events),
            "description": self.description,
            "created": self.created,
            "enabled": self.enabled,
            "disabledReason": self.disabled_reason or None,
            "disabledAt": self.disabled_at,
            "rotating": bool(self.previous_secret),
            "previousSecretUntil": self.previous_until or None,
            "source": self.source,
        }
        if with_secret:
            shown["secret"] = self.secret
        return shown

    def fanout(self) -> dict[str, Any]:
        """What the fan-out script needs: id, types, after (the first ms of stream entry ids that are its)."""
        return {"id": self.id, "types": list(self.events), "after": self.after}


def check_types(types: list[str] | None) -> list[str]:
    """The event types, each known; raises EndpointError naming the first unknown one (and a near one)."""
    import difflib

    found: list[str] = []
    for name in types or []:
        if name not in EVENT_TYPES:
            near = difflib.get_close_matches(name, EVENT_TYPES, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(EVENT_TYPES)}"
            raise EndpointError("events", f"unknown event type {name!r}{hint}")
        if name not in found:
            found.append(name)
    return found


def check_url(url: str, *, allow_private: bool) -> str:
    """``url`` if an endpoint may have it; raises EndpointError (field ``url``) saying why not."""
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:  # "Invalid IPv6 URL", a bracket left open: not a 500 (issue 26)
        raise EndpointError("url", f"is not a URL: {exc}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise EndpointError("url", "must be an absolute https:// URL")
    if parts.username or parts.password:
        raise EndpointError("url", "must not carry a user or password")
    found = card_like(url)
    if found is not None:  # a URL is shown whole, like an identifier: it may hold no card number
        raise EndpointError("url", f"{CARD_IDENTIFIER} or in a URL (it holds {found}, which passes the Luhn check)")
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError:
        raise EndpointError("url", "has a port that is not a number from 0 to 65535") from None
    if not _HOST.match(parts.hostname) and not _ip(parts.hostname):
        raise EndpointError("url", f"{parts.hostname[:100]!r} is not a valid host name (DNS labels of letters, digits, '-')")
    if allow_private:
        return url.strip()
    if parts.scheme != "https":
        raise EndpointError("url", "must be https:// (http only with DURAPAY_WEBHOOKS__ALLOW_PRIVATE=true)")
    host = parts.hostname.rstrip(".").lower()
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        raise EndpointError("url", f"{host} is a local name (allowed only with DURAPAY_WEBHOOKS__ALLOW_PRIVATE=true)")
    address = literal_address(host)
    if address is None:
        return url.strip()  # a name: its addresses are checked at each delivery (see resolve_public)
    if not public(address):
        raise EndpointError("url", f"{address} is not a public address (allowed only with DURAPAY_WEBHOOKS__ALLOW_PRIVATE=true)")
    return url.strip()


_HOST = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$")


def _ip(host: str) -> bool:
    return literal_address(host) is not None


#: A host whose last label is a number (decimal, or hex with 0x) is an IPv4 address, as the resolver and
#: browsers read it (WHATWG URL: "ends in a number"), not a name.
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


def literal_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a URL's host names literally, as the resolver reads it at delivery, or None for a name.
    Besides ``a.b.c.d`` and ``[v6]`` that is every numeric IPv4 form ``getaddrinfo`` takes: one number
    (``2130706433``), octal (``0177.0.0.1``), hex (``0x7f000001``), short (``127.1``): each the address it
    resolves to, judged by :func:`public` like any other, at registration as at delivery."""
    bare = host.strip("[]").rstrip(".").lower()
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if not _NUMERIC_LABEL.match(bare.rsplit(".", 1)[-1]):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare))
    except OSError:
        return ipaddress.IPv4Address(0)  # a number the resolver does not read: no public address (0.0.0.0)


NAT64 = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a webhook may connect to ``address``: a global address that embeds no private IPv4 one.

    ``is_global`` alone let through IPv6 forms that carry an IPv4 address a router or the host may
    reach: IPv4-compatible (``::127.0.0.1``), NAT64 (``64:ff9b::/96``), 6to4 (``2002::/16``), Teredo
    (``2001::/32``, whose client address is the obfuscated one) and IPv4-mapped (``::ffff:10.0.0.1``).
    Nor a multicast address (``224.0.0.0/4``, ``ff00::/8``: ``is_global`` says yes to 224.0.0.1)."""
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded: list[ipaddress.IPv4Address] = []
        if address.ipv4_mapped is not None:
            embedded.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            embedded.append(address.sixtofour)
        if address.teredo is not None:
            embedded += list(address.teredo)
        if address in NAT64 or address in IPV4_COMPATIBLE:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return all(inner.is_global for inner in embedded)
    return True


class NotPublic(PermissionError):
    """A webhook URL's host resolves to an address that is not public; the message does not name it
    (an attempt's error is shown to whoever reads the endpoint's attempts)."""


def resolve_public(url: str) -> str:
    """The address to connect to for ``url``: its host resolved once, every address checked with
    :func:`public`. The delivery connects to this address (sending the host's name for TLS and
    ``Host``), never resolving again: a name that answered a public address to the check and a
    private one to the connection (DNS rebinding) gets no connection.

    Raises NotPublic (naming no address) or OSError when the name does not resolve (TimeoutError when
    it does not within the current call's deadline: ``durapay.gateway.lookup``)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").strip("[]")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    found = lookup(host, port, proto=socket.IPPROTO_TCP)[:16]
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    if not addresses:
        raise OSError(f"{host} has no address")
    if not all(public(address) for address in addresses):
        raise NotPublic(f"{host} resolves to an address that is not public: refused")
    return str(addresses[0])


class EndpointStore:
    """Add, list, remove, rotate, disable endpoints (the one writer of the endpoints hash), and keep
    their failing streaks (the one writer of those too: the rule is in the module's docstring)."""

    def __init__(self, client: Any, keys: Keys, settings: WebhooksSettings) -> None:
        self.redis = client
        self.keys = keys
        self.settings = settings
        self.key = f"{keys.prefix}:webhooks:endpoints"
        self.failing_key = f"{keys.prefix}:webhooks:failing"
        self._patch = client.register_script(_PATCH)
        self._add = client.register_script(_ADD)
        self._failed = client.register_script(_FAILED)

    def now(self) -> float:
        return server_time(self.redis)

    def add(
        self,
        url: str,
        events: list[str] | None = None,
        *,
        description: str = "",
        secret: str | None = None,
        source: str = "api",
    ) -> Endpoint:
        """A new endpoint; ``source`` says who added it (``api``, ``cli``; ``config`` for the configured ones)."""
        checked = check_url(url, allow_private=self.settings.allow_private)
        types = check_types(events)
        if len(description) > 500:
            raise EndpointError("description", "at most 500 characters")
        if secret is not None:
            try:
                secret_key(secret)
            except ValueError as exc:
                raise EndpointError("secret", str(exc)) from None
        endpoint = Endpoint(
            id="we_" + uuid.uuid4().hex[:16],
            url=checked,
            secret=secret or new_secret(),
            events=types,
            description=description,
            source=source,
        )
        return self._write(endpoint)

    def _write(self, endpoint: Endpoint) -> Endpoint:
        """Write ``endpoint``, answering only once the server's clock reached its ``after`` (at most a
        millisecond; a server clock stepped back is waited for a second at most, then the events of that
        ambiguous moment may miss the endpoint): whatever the caller writes next is in its range of events."""
        written = _endpoint(self._add(keys=[self.key], args=[endpoint.id, json.dumps(asdict(endpoint))]))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if int(self.now() * 1000) >= written.after:
                break
            time.sleep(0.0002)
        return written

    def sync_configured(self) -> list[Endpoint]:
        """Write the endpoints of the settings (same URL, same id); their secret and types follow the settings."""
        written = []
        for configured in self.settings.endpoints:
            endpoint_id = derived_id("we_cfg_", configured.url)[:23]
            held = self.get(endpoint_id)
            endpoint = Endpoint(
                id=endpoint_id,
                url=check_url(configured.url, allow_private=self.settings.allow_private),
                secret=configured.secret.get_secret_value(),
                events=check_types(configured.events),
                description=configured.description,
                source="config",
            )
            try:
                secret_key(endpoint.secret)
            except ValueError as exc:
                raise EndpointError("secret", str(exc)) from None
            if held is None:
                endpoint = self._write(endpoint)
            elif (held.url, held.secret, held.events, held.description) != (
                endpoint.url,
                endpoint.secret,
                endpoint.events,
                endpoint.description,
            ):
                endpoint = (
                    self._set(
                        endpoint.id,
                        url=endpoint.url,
                        secret=endpoint.secret,
                        events=endpoint.events,
                        description=endpoint.description,
                    )
                    or endpoint
                )
            else:
                endpoint = held
            written.append(endpoint)
        return written

    @staticmethod
    def decode(raw: Any) -> Endpoint:
        return _endpoint(raw)

    def get(self, endpoint_id: str) -> Endpoint | None:
        raw = self.redis.hget(self.key, endpoint_id)
        return _endpoint(raw) if raw else None

    def all(self) -> list[Endpoint]:
        found = [_endpoint(raw) for raw in self.redis.hvals(self.key)]
        return sorted(found, key=lambda endpoint: (endpoint.created, endpoint.id))

    def remove(self, endpoint_id: str) -> bool:
        """Forget the endpoint and its failing streak; its pending deliveries are dropped when they come due."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hdel(self.key, endpoint_id)
        pipe.hdel(self.failing_key, endpoint_id)
        removed, _ = pipe.execute()
        return bool(removed)

    def rotate(self, endpoint_id: str) -> Endpoint | None:
        """A new secret; the current one stays valid for ``rotation_hours`` (both signatures sent)."""
        held = self.get(endpoint_id)
        if held is None:
            return None
        until = self.now() + self.settings.rotation_hours * 3600
        return self._set(endpoint_id, secret=new_secret(), previous_secret=held.secret, previous_until=until)

    def disable(self, endpoint_id: str, reason: str) -> Endpoint | None:
        return self._set(endpoint_id, enabled=False, disabled_reason=reason, disabled_at=self.now())

    def enable(self, endpoint_id: str) -> Endpoint | None:
        """Enable the endpoint and end its failing streak: the operator says it works again, so the
        failures before do not count towards disabling it (its next failure starts a new streak)."""
        endpoint = self._set(endpoint_id, enabled=True, disabled_reason="", disabled_at=None)
        if endpoint is not None:
            self.recovered(endpoint_id)
        return endpoint

    def failed(self, endpoint_id: str, now: float, retry_at: float | None) -> float:
        """Count a failed delivery attempt made at ``now`` in the endpoint's failing streak; answers when
        the streak began (``now`` when this failure starts one). ``retry_at``: when the failed delivery
        is tried again (None when it is given up: the streak then awaits nothing of it)."""
        awaited = now if retry_at is None else max(now, retry_at)
        since = self._failed(keys=[self.failing_key], args=[endpoint_id, repr(now), repr(awaited), repr(STREAK_SLACK)])
        return float(since)

    def recovered(self, endpoint_id: str) -> None:
        """End the endpoint's failing streak (a success, a passing test, an operator's enable)."""
        self.redis.hdel(self.failing_key, endpoint_id)

    def _set(self, endpoint_id: str, **changes: Any) -> Endpoint | None:
        raw = self._patch(keys=[self.key], args=[endpoint_id, json.dumps(changes)])
        return _endpoint(raw) if raw else None


def _endpoint(raw: Any) -> Endpoint:
    data = json.loads(raw)
    known = set(Endpoint.__dataclass_fields__)
    endpoint = Endpoint(**{name: value for name, value in data.items() if name in known})
    return replace(endpoint, events=list(endpoint.events or []))
