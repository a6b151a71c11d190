"""durapay's settings: one pydantic-settings tree read from ``DURAPAY_*`` variables.

Why one tree: every process (worker, scheduler, api, simulator, demo) reads the same names, and every
component receives the part it needs through its constructor. Nothing reads the environment elsewhere.
Nested groups use ``__``: ``DURAPAY_GATEWAY__BASE_URL`` sets ``settings.gateway.base_url``.

A missing or malformed value fails at start with :class:`SettingsError`, whose message is one line
naming the variable and the problem, e.g.
``DURAPAY_GATEWAY__TIMEOUT: Input should be a valid number, unable to parse string as a number``.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as _SourceError

from durapay.config.connect import parse_sentinel_url, several_addresses, split_addresses
from durapay.config.secrets import redact, secrets_given, secrets_in

ENV_PREFIX = "DURAPAY_"
ENV_NESTED_DELIMITER = "__"

#: The simulator's default API key (also its documented default); the gateway client uses it when no
#: key is configured so that the demo and tests run with nothing set.
SIMULATOR_API_KEY = "durapay-simulator-key"
#: The real gateway's published path prefix; the simulator serves the same prefix.
GATEWAY_PATH_PREFIX = "/api/phoenix-0.0/psp/api/v1"
#: Webhook retries (``workflows.webhooks.delivery``): each delay is jittered by +-this share, and an
#: endpoint's ``Retry-After`` is honoured up to this many seconds (and never past the retry window). Here
#: because the settings check that a delivery's retries end before its event is trimmed (:func:`load_settings`).
WEBHOOK_JITTER = 0.2
WEBHOOK_RETRY_AFTER_CAP_SECONDS = 86400.0


class SettingsError(Exception):
    """A setting is missing or malformed; the message is one line naming the variable."""


DAY = 86400.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}


def parse_duration(value: Any) -> Any:
    """A duration as seconds: ``30d``, ``12h``, ``90m``, ``120s``, or a number of seconds (a fraction too).
    What is not one (``3 weeks``, ``nan``, ``inf``) is refused saying so; other types are left to the field."""
    if isinstance(value, str):
        text = value.strip().lower()
        number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
        try:
            seconds = float(number) * _UNITS[unit]
        except ValueError:
            raise ValueError(f"{value!r} is not a duration (e.g. 30d, 12h, 90m, 120s, or seconds)") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        return value
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a duration: a finite number of seconds, or one with a unit (e.g. 30d, 12h)")
    return seconds


def shown(seconds: float) -> str:
    """A duration in the largest unit that states it whole (``3650d``, ``12h``, ``10s``), as the docs do."""
    for unit, size in (("d", DAY), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _within(seconds: float, low: float, high: float, written: str | None = None) -> float:
    """``seconds`` if within the range, else the refusal, in the documented units."""
    if seconds < low:
        raise ValueError(f"{written or shown(seconds)} is less than {shown(low)} (the range is {shown(low)} to {shown(high)})")
    if seconds > high:
        raise ValueError(f"{written or shown(seconds)} is more than {shown(high)} (the range is {shown(low)} to {shown(high)})")
    return seconds


def _in_range(low: float, high: float, *, whole: bool = False) -> Callable[[Any], Any]:
    """The check of a duration setting from ``low`` to ``high`` seconds (rounded up to whole seconds with
    ``whole``: a Redis expiry)."""

    def check(value: Any) -> Any:
        seconds = parse_duration(value)
        if not isinstance(seconds, float):
            return seconds  # not a duration's type: the field's own check names it
        _within(seconds, low, high, value.strip() if isinstance(value, str) else None)
        return math.ceil(seconds) if whole else seconds

    return check


#: Seconds written as a duration (:func:`parse_duration`): the flows' and schedules' retentions (10s to
#: 3650d), the events' (10s to 90d), the receiver's memory of event ids (10s to 3650d, whole seconds).
LongDuration = Annotated[float, BeforeValidator(_in_range(10, 3650 * DAY))]
EventsDuration = Annotated[float, BeforeValidator(_in_range(10, 90 * DAY))]
WholeSeconds = Annotated[int, BeforeValidator(_in_range(10, 3650 * DAY, whole=True))]


def _days_to_duration(name: str, low: float, high: float) -> Any:
    """A group's validator that still reads the older ``<name>_days`` (a number of days, or a duration)
    into ``<name>``, refusing both at once; its errors name the older variable, which is the one set."""
    older_name = f"__{name.upper()}_DAYS"

    def convert(cls: type, data: Any) -> Any:
        if isinstance(data, dict) and f"{name}_days" in data:
            data = dict(data)
            older = data.pop(f"{name}_days")
            if name in data:
                raise ValueError(f"set __{name.upper()} or {older_name} (the older form, in days), not both")
            try:
                days = float(older)
                seconds, written = days * DAY, f"{older} days"
            except (TypeError, ValueError):
                seconds, written = older, None  # a duration with its unit: read as such
            try:
                seconds = parse_duration(seconds)
                if isinstance(seconds, float):
                    _within(seconds, low, high, written)
            except ValueError as refused:
                raise ValueError(f"{older_name}: {refused}") from None
            data[name] = seconds
        return data

    return model_validator(mode="before")(classmethod(convert))  # type: ignore[arg-type]


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_url(value: str) -> str:
    if value and not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


class GatewaySettings(_Group):
    """How to reach the gateway. ``base_url`` includes the path prefix, as the real gateway publishes it."""

    base_url: str = Field(
        default="http://127.0.0.1:8781" + GATEWAY_PATH_PREFIX,
        description="Gateway base URL including the path prefix.",
    )
    api_key: SecretStr = Field(default=SecretStr(SIMULATOR_API_KEY), description="Sent as X-Api-Key.")
    timeout: float = Field(default=10.0, gt=0, description="Seconds to wait for a response (read).")
    connect_timeout: float = Field(default=3.0, gt=0, description="Seconds to wait for a connection.")
    plugin_name: str = Field(default="", description="Sent as x-plugin-name when set.")
    order_id_max_length: int = Field(
        default=18,
        ge=8,
        le=64,
        description="The gateway's longest orderId: merchant order ids are refused above it, derived ones cut to it.",
    )

    _url = field_validator("base_url")(_check_url)


class GatewayHealthSettings(_Group):
    """The gateway's health shared by every worker (``workflows.engine.gate``): a circuit breaker that stops calls
    after ``failures`` timeouts, 5xx or connection errors in a row within ``window_seconds``, and a rate
    limiter every worker draws from (with the hold of a 429's Retry-After)."""

    failures: int = Field(
        default=5, ge=1, le=1000, description="Timeouts, 5xx or connection errors in a row that open the breaker."
    )
    window_seconds: float = Field(default=30.0, gt=0, le=3600, description="The failures must fall within this window.")
    open_seconds: float = Field(
        default=15.0, gt=0, le=3600, description="How long the breaker stays open before one probe call is let through."
    )
    limiter: bool = Field(default=True, description="Share one rate limit (and a 429's Retry-After) across every worker.")
    rate_per_second: float = Field(default=200.0, gt=0, le=100000, description="Gateway calls per second, every worker together.")
    burst: int = Field(default=100, ge=1, le=100000, description="Calls allowed at once above the rate.")
    wait_seconds: float = Field(
        default=1.0, ge=0, le=30, description="A call whose slot is this near waits in the worker; a later one defers its flow."
    )
    outage_seconds: float = Field(
        default=3600.0,
        ge=10,
        le=30 * 86400,
        description="A flow that met the breaker open this long ends failed (needs_attention if money may have moved).",
    )


#: The terminal every flow runs on unless its start names another: the gateway of ``DURAPAY_GATEWAY__*``,
#: under the gate of ``DURAPAY_GATEWAY_HEALTH__*`` (every deployment before terminals had only it).
DEFAULT_TERMINAL = "default"
#: A terminal's name: short (it is written on the record of every flow of it, and in its gate's key).
TERMINAL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
#: Most terminals one deployment declares (each has its own gate, client and connection pool).
MAX_TERMINALS = 64


class TerminalSettings(_Group):
    """One gateway terminal of ``DURAPAY_TERMINALS`` (docs/configuration.md, Terminals): its own key (and
    base URL), its own gate (breaker, limiter, 429 hold) with its own rate and outage bound; the gateway's
    timeouts, plugin name and order id limit are the ones of ``DURAPAY_GATEWAY__*``, and the breaker's
    thresholds those of ``DURAPAY_GATEWAY_HEALTH__*`` (one gateway, however many terminals)."""

    base_url: str = Field(default="", description="Gateway base URL for this terminal; empty: DURAPAY_GATEWAY__BASE_URL.")
    api_key: SecretStr = Field(description="This terminal's X-Api-Key (a secret).")
    rate_per_second: float | None = Field(
        default=None,
        gt=0,
        le=100000,
        description="This terminal's gateway calls per second; none: DURAPAY_GATEWAY_HEALTH__RATE_PER_SECOND.",
    )
    burst: int | None = Field(
        default=None, ge=1, le=100000, description="This terminal's burst; none: DURAPAY_GATEWAY_HEALTH__BURST."
    )
    outage_seconds: float | None = Field(
        default=None,
        ge=10,
        le=30 * 86400,
        description="This terminal's outage bound; none: DURAPAY_GATEWAY_HEALTH__OUTAGE_SECONDS.",
    )

    _url = field_validator("base_url")(_check_url)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """A misspelt field (``api_kee``) is refused naming the field it most likely meant: ignored, the
        terminal would run on another key or without its own rate (pydantic's own refusal names neither)."""
        if isinstance(data, Mapping):
            known = list(cls.model_fields)
            for name in data:
                if name not in known:
                    guess = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
                    hint = f"; did you mean {guess[0]}?" if guess else ""
                    raise ValueError(f"{name!r} is not a terminal field{hint} (fields: {', '.join(known)})")
            if "api_key" not in data:
                raise ValueError("api_key is required (each terminal has its own key)")
        return data

    @field_validator("api_key")
    @classmethod
    def _key(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 4:
            raise ValueError("api_key must have at least 4 characters")
        return value


def _check_terminals(value: Any) -> Any:
    """Terminal names: refused before the fields are read, saying which name and why."""
    if isinstance(value, Mapping):
        if len(value) > MAX_TERMINALS:
            raise ValueError(f"at most {MAX_TERMINALS} terminals ({len(value)} declared)")
        for name in value:
            if name == DEFAULT_TERMINAL:
                raise ValueError(
                    f"{DEFAULT_TERMINAL!r} is the terminal of DURAPAY_GATEWAY__BASE_URL and __API_KEY: set those, or "
                    "name this terminal otherwise"
                )
            if not isinstance(name, str) or not TERMINAL_NAME.match(name):
                raise ValueError(f"{name!r} is not a terminal name (lowercase letters, digits, - and _, at most 32, e.g. it-web)")
    return value


class ReceiverSettings(_Group):
    """Where the gateway sends notifications: the public URL of durapay's receiver."""

    public_url: str = Field(
        default="http://127.0.0.1:8780/notifications",
        description="Public URL of the notification receiver, sent as notificationUrl.",
    )
    max_body_bytes: int = Field(default=64 * 1024, gt=0, description="Larger notification bodies are refused.")
    path: str = Field(
        default="/notifications",
        pattern=r"^/[A-Za-z0-9._~/-]*$",
        description="Path the receiver listens on (behind a proxy it may differ from public_url's path).",
    )
    event_ttl_seconds: WholeSeconds = Field(
        default=7 * 86400,
        description="How long a received eventId is remembered to ignore repeats (a duration, 10s to 3650d).",
    )
    unknown_order_events_per_minute: int = Field(
        default=60,
        ge=1,
        le=10_000,
        description="Most notification.unknown_order merchant events written per minute, all orders together (one per "
        "order id per hour at most); those above are counted, not written.",
    )

    _url = field_validator("public_url")(_check_url)


class ReconcileSettings(_Group):
    """Reconciliation against the gateway (``workflows.reconciliation``, docs/operations.md): how the
    gateway's operations are read (within its published list limits), how long reports are kept, and
    the scheduler's daily run."""

    daily: bool = Field(
        default=True,
        description="Run a reconciliation every day from durapay scheduler (on by default; off in the demo and "
        "chaos runs, which set it false for their own processes).",
    )
    daily_at: str = Field(
        default="03:00",
        pattern=r"^(?:[01][0-9]|2[0-3]):[0-5][0-9]$",
        description="Time of day (HH:MM, in time_zone) of the daily run.",
    )
    time_zone: str = Field(default="UTC", description="IANA time zone of daily_at (e.g. Europe/Rome).")
    window_hours: float = Field(
        default=24.0, gt=0, le=24 * 31, description="The daily run reads the operations of this many hours before it."
    )
    retention: LongDuration = Field(
        default=90 * DAY,
        description="How long reports are kept (10s to 3650d; DURAPAY_RECONCILE__RETENTION_DAYS, in days, is still read).",
    )
    max_records: int = Field(
        default=500, ge=2, le=500, description="maxRecords of each GET /operations (the gateway's limit is 500)."
    )
    span_days: float = Field(
        default=28.0,
        gt=0,
        le=31,
        description="Longest fromTime-toTime span of one GET /operations (the gateway's limit is one month).",
    )
    max_calls: int = Field(
        default=5000, ge=1, le=1_000_000, description="Gateway calls one run may make (pages and single reads)."
    )
    lease_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="A running report's lease, renewed by its run every third of it; a report whose lease ran out "
        "(its process died) reads as interrupted, and a new run may start.",
    )

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. UTC, Europe/Rome)") from None
        return value

    _older = _days_to_duration("retention", 10, 3650 * DAY)

    @property
    def retention_days(self) -> float:
        """:attr:`retention` in days (what the reconciliation read before it was a duration)."""
        return self.retention / DAY


class ApiSettings(_Group):
    """The control API (and receiver) process."""

    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=0, le=65535)
    key: SecretStr = Field(default=SecretStr(""), description="X-Api-Key required by the control API (an operator key).")
    keys: dict[str, Literal["read", "operator"]] = Field(
        default_factory=dict,
        description="More keys, each with its role: `read` may look (API GETs, the console), `operator` may act too.",
    )
    console_session_hours: float = Field(default=12.0, gt=0, le=24 * 30, description="How long a console sign-in lasts.")
    start_wait_seconds: float = Field(
        default=5.0, ge=0, le=60, description="How long POST /flows/{kind} waits for the customer-facing URL."
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Larger control API bodies are refused (413) before they are parsed; flow inputs are a few KB.",
    )
    auth_failures: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description="Failed authentications (a wrong key at the API or the console's sign-in) one client address, "
        "or one key prefix, may have within AUTH_WINDOW_SECONDS; past them every attempt is answered 429 with "
        "Retry-After until the window ends.",
    )
    auth_window_seconds: float = Field(
        default=300.0, ge=1, le=86400, description="How long the failures of an address or a key prefix are counted."
    )
    auth_prefix_chars: int = Field(
        default=8, ge=1, le=64, description="How many leading characters of a presented key make its prefix (counted as a hash)."
    )


class RetrySettings(_Group):
    """Technical retries of one step: exponential backoff with full jitter, bounded."""

    base_seconds: float = Field(default=1.0, gt=0)
    cap_seconds: float = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=8, ge=1)
    reconcile_attempts: int = Field(default=6, ge=1, description="Reads before an ambiguous step needs a person.")
    late_seconds: float = Field(
        default=120.0,
        ge=0,
        description="How long after a call whose answer was lost the gateway may still act on it: a cancel "
        "whose read-back finds nothing before then reads again at its end.",
    )
    read_pace_seconds: float = Field(
        default=300.0,
        ge=1,
        le=21600,
        description="The shortest pause between two reads of something still open after its deadline (a tenth "
        "of the flow's age, up to 6 hours); a link adopted after a lost answer is first read this soon.",
    )


class EngineSettings(_Group):
    """The durable engine: leases, the dispatcher's tick, how long finished flows are kept."""

    key_prefix: str = Field(default="durapay", min_length=1)
    partitions: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="Hash-tag partitions of the due set and indexes (a Redis Cluster spreads partitions, not flows).",
    )
    lease_seconds: float = Field(default=60.0, gt=0)
    dispatch_interval: float = Field(default=0.5, gt=0)
    dispatch_batch: int = Field(default=500, ge=1)
    retention: LongDuration = Field(
        default=30 * DAY,
        description="How long a finished flow keeps its record, log and lookups (10s to 3650d).",
    )
    wait_deadline_seconds: float = Field(default=1800.0, gt=0)
    max_card_delay_seconds: float = Field(
        default=86400.0,
        gt=0,
        le=30 * DAY,
        description="How far ahead (run_at) a flow carrying card data may be started: its card, CVV included, stays "
        "in the store until it runs (at most 30 days).",
    )
    sync_aof: Literal["auto", "yes", "no"] = Field(
        default="auto",
        description="Wait for the AOF fsync of starts, money-moving claims and signals (auto: unless appendfsync is always).",
    )
    sync_replicas: int = Field(default=0, ge=0, le=16, description="Replicas that must receive those writes (WAIT).")
    sync_timeout: float = Field(default=2.0, gt=0, le=60, description="Seconds to wait for them before refusing.")
    accept_early_waitaof: bool = Field(
        default=False,
        description="Run on a server that confirms WAITAOF before its fsync under appendfsync everysec (Redis "
        "7.4.0-7.4.2, Valkey from 8.0), accepting that a host crash can lose acknowledged starts, claims and "
        "signals; false: the processes and the commands that write flows refuse to start there.",
    )
    follow_steps: int = Field(
        default=8,
        ge=0,
        le=64,
        description="Steps due at once that a worker runs in a row for one flow before handing it back to the queue "
        "(0: each step is its own task, the remaining steps sent as a Celery chain).",
    )
    park_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds after which a parked flow (its definition held by no process that claimed it) is offered again.",
    )
    max_step_runs: int = Field(
        default=500,
        ge=10,
        description="Claims of one step without moving on before the flow stops for a person (the bound under every loop).",
    )

    _older = _days_to_duration("retention", 10, 3650 * DAY)


class EventsSettings(_Group):
    """Merchant events (``workflows/engine/events.py``): written with each transition, read by the feed and webhooks."""

    enabled: bool = Field(default=True, description="Write merchant events with each transition.")
    retention: EventsDuration = Field(
        default=7 * DAY,
        description="How long events stay readable and deliverable (10s to 90d): the scheduler trims older ones (it "
        "must outlast the webhooks' retries).",
    )

    _older = _days_to_duration("retention", 10, 90 * DAY)


#: A card key's id: short, no dot (it separates the sealed form's parts, ``workflows.engine.cards``).
CARD_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
CARD_KEY_BYTES = 32


def parse_card_key(text: str) -> tuple[str, bytes]:
    """A ``DURAPAY_CARD__KEYS`` entry, ``<id>:<base64 of 32 bytes>``, as (id, key); a ValueError that
    names the entry by its id and never quotes the key."""
    key_id, colon, encoded = text.strip().partition(":")
    if not colon or not CARD_KEY_ID.match(key_id):
        raise ValueError("each key is <id>:<base64 of 32 bytes>, its id of letters, digits, '-' or '_' (1-32)")
    try:
        secret = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"key {key_id!r}: not base64") from None
    if len(secret) != CARD_KEY_BYTES:
        raise ValueError(f"key {key_id!r}: {len(secret)} bytes, not {CARD_KEY_BYTES} (AES-256)")
    return key_id, secret


class CardSettings(_Group):
    """Card data at rest (``workflows.engine.cards``): the keys it is sealed with before it is written to Redis."""

    keys: list[SecretStr] = Field(
        default_factory=list,
        description="AES-256 keys, JSON list of `<id>:<base64 of 32 bytes>`: the first seals, any opens (rotation). "
        "Without one a flow carrying card data is refused. Never stored in Redis.",
    )

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: list[SecretStr]) -> list[SecretStr]:
        seen: set[str] = set()
        for entry in value:
            key_id, _ = parse_card_key(entry.get_secret_value())
            if key_id in seen:
                raise ValueError(f"key id {key_id!r} appears twice (each key needs an id of its own)")
            seen.add(key_id)
        return value


class ConfiguredEndpoint(_Group):
    """A webhook endpoint declared in the settings (``DURAPAY_WEBHOOKS__ENDPOINTS``, a JSON list)."""

    url: str = Field(min_length=1, max_length=2000, description="Where events are POSTed.")
    events: list[str] = Field(default_factory=list, description="Event types sent (empty: all).")
    secret: SecretStr = Field(description="whsec_ + base64 (at least 16 bytes): the signing secret.")
    description: str = Field(default="", max_length=500)


class WebhooksSettings(_Group):
    """Signed webhooks (``workflows/webhooks``): endpoints, delivery by the workers, retries."""

    allow_private: bool = Field(
        default=False,
        description="Allow http:// and loopback/private addresses as endpoint URLs (development and tests only).",
    )
    timeout: float = Field(default=10.0, gt=0, le=60, description="Seconds to wait for an endpoint's answer.")
    connect_timeout: float = Field(default=3.0, gt=0, le=30, description="Seconds to wait for a connection.")
    retry_delays: list[float] = Field(
        default=[0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0],
        min_length=1,
        description="Seconds before each attempt (the first: at once); past the end, the last again; +-20% jitter.",
    )
    retry_days: float = Field(default=3.0, gt=0, le=30, description="How long a delivery is retried before it is given up.")
    disable_after_days: float = Field(
        default=5.0, gt=0, le=60, description="An endpoint failing without a success for this long is disabled (and reported)."
    )
    rotation_hours: float = Field(
        default=24.0,
        ge=0,
        le=720,
        description="How long the previous secret stays valid after a rotation (both signed).",
    )
    lease_seconds: float = Field(default=60.0, gt=0, description="How long a taken delivery waits before it is taken again.")
    batch: int = Field(default=200, ge=1, le=10000, description="Events fanned out (and deliveries sent) per partition per tick.")
    attempts_kept: int = Field(default=200, ge=1, le=100000, description="Attempts kept per endpoint and partition (newest).")
    excerpt_bytes: int = Field(default=512, ge=0, le=8192, description="Bytes of an answer's body kept with its attempt.")
    endpoints: list[ConfiguredEndpoint] = Field(
        default_factory=list, description="Endpoints declared in the settings (JSON list)."
    )


class SchedulesSettings(_Group):
    """Recurring charges (``workflows/schedules``): caps on retrying declined charges of one schedule, from
    the card networks' published limits (docs/gateway.md, "Dunning caps", with the sources). A retry the
    caps forbid is not made: the schedule stops for a person instead."""

    retries_per_30_days: int = Field(
        default=15,
        ge=0,
        le=35,
        description="Most dunning retries started in any 30 days (Visa: at most 15 reattempts of a declined "
        "transaction in 30 days; Mastercard: 35). 0: never retry.",
    )
    declines_per_day: int = Field(
        default=10,
        ge=1,
        le=20,
        description="No retry after this many declines in the last 24 hours (Mastercard: 10 declines of one card in 24 hours).",
    )
    retention: LongDuration = Field(
        default=90 * DAY,
        description="How long a completed or cancelled schedule (nothing left in flight) keeps its record and history "
        "before they are removed (10s to 3650d).",
    )
    history_entries: int = Field(
        default=1000,
        ge=10,
        le=100_000,
        description="Most history entries kept per schedule: older ones are summed up in one entry (counts per event).",
    )
    check_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="The scheduler first looks at a charge's flow this long after starting it, then at doubling "
        "intervals (up to an hour) until the flow has ended.",
    )


class PauseSettings(_Group):
    """Pauses of a flow kind (``workflows.pauses``): a maintenance window in which its flows run no step."""

    recheck_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="How far a paused kind's due flow is moved each time it is met (a resume releases the flows "
        "it held at once; this bounds the wait of any it did not list).",
    )


class FlowsSettings(_Group):
    """Flow kinds of the merchant's own (``durapay.flows``, docs/deploys.md): modules every process loads."""

    modules: str = Field(
        default="",
        description="Python modules declaring flows of your own, comma separated (shop.flows,shop.refunds): each "
        "module's Flow objects (its FLOWS, or every Flow it defines) run beside durapay's kinds.",
    )

    @field_validator("modules")
    @classmethod
    def _names(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",") if part.strip()):
            if not all(piece.isidentifier() for piece in name.split(".")):
                raise ValueError(f"{name!r} is not a module name (dotted Python identifiers, e.g. shop.flows)")
        return value

    @property
    def names(self) -> list[str]:
        return [part.strip() for part in self.modules.split(",") if part.strip()]


#: A fairness key as the settings name it: a terminal, or ``terminal/tenant`` (``workflows.engine.fairness``).
FAIR_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$")
#: The most fairness queues: every step worker's BRPOP names each of them (four times: kombu's priority steps).
MAX_FAIR_QUEUES = 128


class FairnessSettings(_Group):
    """Fairness between terminals and tenants (``workflows.engine.fairness``, docs/operations.md): each key's steps
    on queues of their own, taken in turn by the workers."""

    enabled: bool = Field(
        default=False,
        description="Send each fairness key's steps (terminal, or terminal/tenant) to queues of their own, which the "
        "workers take from in turn; off: one queue, first in first out.",
    )
    weights: dict[str, int] = Field(
        default_factory=dict,
        description='Keys with queues of their own and their weight, JSON ({"default/acme": 3, "eu": 2}): a key of '
        "weight w gets w turns per round; any other key shares one of SHARED_QUEUES buckets.",
    )
    default_weight: int = Field(
        default=1, ge=1, le=8, description="Queues of each shared bucket (the weight of a key not named)."
    )
    shared_queues: int = Field(
        default=16,
        ge=1,
        le=64,
        description="Buckets the keys not named in WEIGHTS fold into (a stable hash of the key): keys in one bucket "
        "share its turns.",
    )

    caps: dict[str, int] = Field(
        default_factory=dict,
        description='Steps of a key that may run (or be sent) at once, JSON ({"default/bulk": 6}); a step over its key\'s '
        "cap is held back until one of that key's ends (1 to 10000; a key not named has no cap).",
    )
    max_held: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Flows a capped key may have held back in its list; beyond, a flow is left on the due set for HOLD_SECONDS.",
    )
    hold_seconds: float = Field(
        default=300.0,
        ge=1,
        le=3600,
        description="How far a held flow's due entry is moved: the bound on its wait should no release come (a lost worker).",
    )

    @field_validator("caps")
    @classmethod
    def _caps(cls, value: dict[str, int]) -> dict[str, int]:
        for key, cap in value.items():
            if not FAIR_KEY.match(key):
                raise ValueError(f"{key!r} is not a fairness key (a terminal, or terminal/tenant)")
            if not 1 <= cap <= 10_000:
                raise ValueError(f"{key!r}: a cap is 1 to 10000 (it is {cap})")
        return value

    @field_validator("weights")
    @classmethod
    def _keys(cls, value: dict[str, int]) -> dict[str, int]:
        for key, weight in value.items():
            if not FAIR_KEY.match(key):
                raise ValueError(
                    f"{key!r} is not a fairness key (a terminal, or terminal/tenant: letters, digits, '.', '_', '-')"
                )
            if not 1 <= weight <= 16:
                raise ValueError(f"{key!r}: a weight is 1 to 16 (it is {weight})")
        return value

    @model_validator(mode="after")
    def _bounded(self) -> FairnessSettings:
        total = sum(self.weights.values()) + self.shared_queues * self.default_weight
        if total > MAX_FAIR_QUEUES:
            raise ValueError(
                f"{total} fairness queues (the weights' sum plus SHARED_QUEUES x DEFAULT_WEIGHT): at most {MAX_FAIR_QUEUES}, "
                "as every worker polls each of them"
            )
        return self


class BulkSettings(_Group):
    """Bulk retries and cancels (``workflows.bulk``): how fast, how many, how long their records are kept."""

    rate: float = Field(
        default=50.0,
        gt=0,
        le=10_000,
        description="Flows acted on per second by one bulk action (its own pace, one runner at a time per action).",
    )
    max_flows: int = Field(
        default=10_000,
        ge=1,
        le=100_000,
        description="Most flows one bulk action may match: a dry run keeps each flow it lists (about 40 bytes) for its "
        "confirmation; a dry run matching more is refused (narrow the filter).",
    )
    retention: LongDuration = Field(
        default=7 * DAY,
        description="How long a bulk action's record (progress, skipped flows) is kept after it was posted (10s to 3650d).",
    )
    kept: int = Field(default=200, ge=1, le=10_000, description="Most bulk actions listed (the newest).")


class Settings(BaseSettings):
    """The whole tree. Build it with :func:`load_settings`; pass the parts to constructors."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="ignore",
        frozen=True,
    )

    redis_url: str = Field(
        default="",
        description="Redis for flow records (redis:// or redis+sentinel://host:port,.../<master>[/<db>]); empty = embedded.",
    )
    redis_cluster: bool = Field(
        default=False,
        description="DURAPAY_REDIS_URL names a Redis Cluster's startup nodes: one, or several "
        "(redis://host:port,host:port.../0), any reachable one will do.",
    )
    broker_url: str = Field(
        default="", description="Celery broker (redis://, redis+sentinel://, amqp://); empty = the Redis URL."
    )
    data_dir: Path = Field(default=Path(".durapay"), description="Embedded Valkey data and demo files.")
    gateway: GatewaySettings = GatewaySettings()
    gateway_health: GatewayHealthSettings = GatewayHealthSettings()
    receiver: ReceiverSettings = ReceiverSettings()
    api: ApiSettings = ApiSettings()
    retry: RetrySettings = RetrySettings()
    engine: EngineSettings = EngineSettings()
    events: EventsSettings = EventsSettings()
    webhooks: WebhooksSettings = WebhooksSettings()
    schedules: SchedulesSettings = SchedulesSettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    pause: PauseSettings = PauseSettings()
    bulk: BulkSettings = BulkSettings()
    card: CardSettings = CardSettings()
    flows: FlowsSettings = FlowsSettings()
    fairness: FairnessSettings = FairnessSettings()
    #: Gateway terminals besides ``default`` (docs/configuration.md, Terminals), JSON: ``{"it": {"api_key": ...}}``.
    terminals: Annotated[dict[str, TerminalSettings], BeforeValidator(_check_terminals)] = Field(
        default_factory=dict,
        description="Gateway terminals besides default, JSON: {name: {api_key, base_url, rate_per_second, burst, "
        "outage_seconds}}.",
    )

    @property
    def terminal_names(self) -> list[str]:
        """Every terminal flows may run on: ``default`` first, then the declared ones."""
        return [DEFAULT_TERMINAL, *self.terminals]

    @model_validator(mode="after")
    def _runs_above_tries(self) -> Settings:
        """A step retried ``retry.max_attempts`` times is claimed that many times without moving on: at or above
        ``engine.max_step_runs`` the loop bound would stop the flow for a person before its last try."""
        if self.retry.max_attempts >= self.engine.max_step_runs:
            raise ValueError(
                f"retry.max_attempts ({self.retry.max_attempts}) must be below engine.max_step_runs "
                f"({self.engine.max_step_runs}): each try is a claim of the step, and the flow stops for a person at "
                "max_step_runs claims (raise DURAPAY_ENGINE__MAX_STEP_RUNS or lower DURAPAY_RETRY__MAX_ATTEMPTS)"
            )
        return self

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _scheme(cls, value: str) -> str:
        allowed = ("redis://", "rediss://", "unix://", "valkey://", "redis+sentinel://", "amqp://", "amqps://", "pyamqp://")
        if value and not value.startswith(allowed):
            raise ValueError("must start with redis://, rediss://, unix://, redis+sentinel:// (or amqp:// for the broker)")
        if value.startswith("redis+sentinel://"):
            parse_sentinel_url(value)  # a ValueError names what is wrong
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_only(cls, value: str) -> str:
        if value.startswith(("amqp", "pyamqp")):
            raise ValueError("flow records live in Redis: use redis://, rediss:// or unix://")
        if several_addresses(value):
            split_addresses(value)  # a cluster's startup nodes: a ValueError names a bad address
        return value


def _variable(loc: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(str(part).upper() for part in loc)


#: ``DURAPAY_*`` variables that are not settings but knobs of durapay's own tests and tools, read where
#: they are used (docs/configuration.md, "The prefix is durapay's"). Every other ``DURAPAY_*``
#: variable that names no setting is refused (:func:`check_variables`).
TOOL_VARIABLES = frozenset(
    {
        "DURAPAY_MODEL_EXAMPLES",  # tests/workflows/test_flow_model.py: a longer hunt
        "DURAPAY_MODEL_STEPS",
        "DURAPAY_WAIT_MODEL_EXAMPLES",  # tests/workflows/test_wait_model.py
        "DURAPAY_WAIT_MODEL_STEPS",
        "DURAPAY_SHARED_MODEL_EXAMPLES",  # tests/workflows/test_flow_model_shared.py
        "DURAPAY_SHARED_MODEL_STEPS",
        "DURAPAY_PROPERTY_EXAMPLES",  # tests/workflows/engine/test_store_properties.py
        "DURAPAY_SPEC_FILE",  # tests/gateway/test_catalogue.py: the gateway's interface description
        "DURAPAY_CHAOS_FSYNC_LOG",  # durapay chaos: the fsync log its Valkey's preload writes (service/chaos/aof.py)
    }
)
#: Any variable with this prefix is a test's (``DURAPAY_TEST_AMQP_URL``: the RabbitMQ tests' broker).
TOOL_PREFIX = ENV_PREFIX + "TEST_"


def _setting_names() -> dict[str, str]:
    """Every variable a setting is read from, by the part after ``DURAPAY_``: each top-level setting
    (a group as JSON too) and each field of a group (``GATEWAY__TIMEOUT``)."""
    names: dict[str, str] = {}
    for name, field in Settings.model_fields.items():
        names[name.upper()] = ENV_PREFIX + name.upper()
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            for inner in group.model_fields:
                names[f"{name.upper()}{ENV_NESTED_DELIMITER}{inner.upper()}"] = _variable((name, inner))
    return names


def check_variables(environ: Mapping[str, str]) -> None:
    """Refuse a ``DURAPAY_*`` variable that names no setting (and is no test or tool knob,
    :data:`TOOL_VARIABLES`): ``DURAPAY_REDIS_URLL`` was ignored, and the embedded Valkey used unsaid.
    A group's own fields are checked by the group (``extra="forbid"``: the older names they still read
    stay theirs); here the part before ``__`` must name a setting, a group when ``__`` follows."""
    names = _setting_names()
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in TOOL_VARIABLES or upper.startswith(TOOL_PREFIX):
            continue
        rest = upper.removeprefix(ENV_PREFIX)
        top, nested, _ = rest.partition(ENV_NESTED_DELIMITER)
        if top == "TERMINALS" and nested:
            _check_terminal_variable(variable, rest)
            continue
        field = Settings.model_fields.get(top.lower())
        group = field is not None and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        if field is not None and (group or not nested):
            continue
        guess = difflib.get_close_matches(rest, list(names), n=1, cutoff=0.75)
        if not guess and field is not None:  # a setting with a nested part (DURAPAY_REDIS_URL__HOST)
            guess = [top]
        hint = (
            f"; did you mean {names[guess[0]]}?"
            if guess
            else f" (docs/configuration.md lists them; a variable of your own needs a prefix other than {ENV_PREFIX})"
        )
        raise SettingsError(f"{variable}: not a durapay setting{hint}")


def _check_terminal_variable(variable: str, rest: str) -> None:
    """``DURAPAY_TERMINALS__<NAME>__<FIELD>``: one field of one terminal (a key from a secret store, say),
    beside or instead of the JSON form; a field that is not one is refused naming the one meant."""
    parts = rest.split(ENV_NESTED_DELIMITER)
    fields = [name.upper() for name in TerminalSettings.model_fields]
    if len(parts) == 3 and parts[1] and parts[2] in fields:
        return
    given = parts[2] if len(parts) == 3 else ENV_NESTED_DELIMITER.join(parts[2:])
    guess = difflib.get_close_matches(given, fields, n=1, cutoff=0.6)
    name = parts[1] if len(parts) > 1 else "<NAME>"
    hint = f"; did you mean {ENV_PREFIX}TERMINALS__{name}__{guess[0]}?" if guess else ""
    raise SettingsError(
        f"{variable}: not a terminal setting (DURAPAY_TERMINALS__<NAME>__<FIELD>, the fields: {', '.join(fields)}){hint}"
    )


def load_settings(overrides: Mapping[str, Any] | None = None, *, env_file: Path | None = None) -> Settings:
    """Read the settings from the environment (and ``overrides``), or raise a one-line SettingsError.

    ``env_file``: ``DURAPAY_*`` variables in dotenv form read *under* the environment (a variable set in
    the environment wins): the settings ``durapay dev`` shares with the commands run in its folder
    (``service.dev.shared_settings``). The first problem is reported; that is the one the operator fixes
    next. A ``DURAPAY_*`` variable that names no setting is one (:func:`check_variables`).
    """
    check_variables(os.environ)
    try:
        settings = Settings(_env_file=env_file, **dict(overrides or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        loc = first["loc"]
        if tuple(loc[:2]) == ("api", "keys") and len(loc) > 2:
            # The location of a role entry is its key, a secret: name the entry by its place instead.
            raise _redacted(_role_entry(loc[2], first.get("input"), message, overrides), overrides) from None
        name = _variable(loc)
        if loc[:1] == ("terminals",) and len(loc) > 1:
            # One JSON variable: name it, then the terminal and the field within it.
            name = _variable(("terminals",))
            where = ".".join(str(part) for part in loc[2:])
            message = f"terminal {loc[1]!r}: {where + ': ' if where else ''}{message}"
        if message.startswith("__"):  # a group's check naming the variable of its own that was set (a _DAYS form)
            variable, _, message = message.partition(": ")
            name += variable
        raise _redacted(f"{name}: {message}", overrides) from None
    except _SourceError as exc:
        # A group variable (``DURAPAY_GATEWAY``) that is not JSON: pydantic-settings names the field.
        found = re.search(r'field "(\w+)"', str(exc))
        name = _variable((found.group(1),)) if found else ENV_PREFIX + "*"
        raise SettingsError(f"{name}: not valid JSON (set the nested variables, e.g. {name}__...)") from None
    if settings.redis_cluster and not settings.broker_url:
        raise SettingsError(
            f"{ENV_PREFIX}BROKER_URL: required with {ENV_PREFIX}REDIS_CLUSTER=true (the Celery broker cannot run on a "
            "cluster: give a plain Redis, a redis+sentinel:// URL or RabbitMQ)"
        )
    if not settings.redis_cluster and several_addresses(settings.redis_url):
        raise SettingsError(
            f"{ENV_PREFIX}REDIS_URL: several addresses are a Redis Cluster's startup nodes: set "
            f"{ENV_PREFIX}REDIS_CLUSTER=true (one server takes one address; Sentinel: redis+sentinel://)"
        )
    if settings.redis_cluster and settings.redis_url.startswith("redis+sentinel://"):
        raise SettingsError(f"{ENV_PREFIX}REDIS_URL: a Redis Cluster is reached through one of its nodes, not Sentinel")
    call = settings.gateway.timeout + settings.gateway.connect_timeout
    if settings.engine.lease_seconds <= call:
        # A lease shorter than one gateway call lets a second worker take a step still talking to the gateway.
        raise SettingsError(
            f"{_variable(('engine', 'lease_seconds'))}: must exceed one gateway call "
            f"(DURAPAY_GATEWAY__TIMEOUT + DURAPAY_GATEWAY__CONNECT_TIMEOUT = {call:g}s)"
        )
    _check_webhook_lease(settings)
    _check_webhook_retries(settings)
    _check_daily_window(settings)
    return settings


def _role_entry(key: Any, given: Any, message: str, overrides: Mapping[str, Any] | None) -> str:
    """The error of a ``DURAPAY_API__KEYS`` entry, named by its place in the map (never by its key)."""
    entries: list[str] = []
    raw = os.environ.get(f"{ENV_PREFIX}API{ENV_NESTED_DELIMITER}KEYS")
    try:
        parsed = json.loads(raw) if raw else ((overrides or {}).get("api") or {}).get("keys") or {}
    except ValueError:
        parsed = {}
    if isinstance(parsed, Mapping):
        entries = [str(name) for name in parsed]
    place = f"entry {entries.index(str(key)) + 1} of {len(entries)}" if str(key) in entries else "an entry"
    shown = f" has role {given!r}" if isinstance(given, str) and len(given) <= 40 else ""
    return f"{_variable(('api', 'keys'))}: {place} (its key is not shown){shown}: {message}"


def _redacted(text: str, overrides: Mapping[str, Any] | None) -> SettingsError:
    """A SettingsError whose text holds no secret the environment or ``overrides`` carry (``config.secrets``)."""
    return SettingsError(redact(text, [*secrets_in(os.environ), *secrets_given(dict(overrides or {}))]))


#: What a daily reconciliation may read back beyond its window, in hours: the day's run may start late or
#: be run again until that day ends (``reconciliation.daily``), and a daylight-saving day is an hour longer.
DAILY_SLACK_HOURS = 24 + 1


def _check_daily_window(settings: Settings) -> None:
    """With the daily reconciliation on, the finished flows must be kept longer than its window reaches
    back: a window starting before the engine's retention is refused (``Reconciler.begin``: the flows of
    older payments are gone, each would read as money without a flow), so every daily run would fail."""
    if not settings.reconcile.daily:
        return
    reach = (settings.reconcile.window_hours + DAILY_SLACK_HOURS) * 3600
    if settings.engine.retention < reach:
        window = _variable(("reconcile", "window_hours"))
        raise SettingsError(
            f"{_variable(('engine', 'retention'))}: {settings.engine.retention / 3600:g}h keeps finished flows for less than "
            f"the daily reconciliation reads back ({window}={settings.reconcile.window_hours:g}, plus up to "
            f"{DAILY_SLACK_HOURS}h for a late or repeated run and daylight saving: {reach / 3600:g}h): set it to at least "
            f"{reach / 3600:g}h, lower {window}, or set {_variable(('reconcile', 'daily'))}=false"
        )


def _check_webhook_lease(settings: Settings) -> None:
    """A taken delivery must not come due again while it is still being sent: a task of deliveries
    (``Webhooks.deliver_many``) starts no attempt past half its lease, and an attempt lasts at most its
    deadline (connect + timeout, ``gateway._deadline``), so the lease must exceed twice the deadline."""
    hooks = settings.webhooks
    deadline = hooks.connect_timeout + hooks.timeout
    if hooks.lease_seconds <= 2 * deadline:
        timeouts = f"{_variable(('webhooks', 'connect_timeout'))} + {_variable(('webhooks', 'timeout'))}"
        raise SettingsError(
            f"{_variable(('webhooks', 'lease_seconds'))}: must exceed twice an attempt's deadline ({timeouts} = "
            f"{deadline:g}s, so more than {2 * deadline:g}s): a batch of deliveries starts attempts until half its lease, "
            "and a shorter lease lets another worker take a delivery still being sent (raise it, or lower the timeouts)"
        )


def _check_webhook_retries(settings: Settings) -> None:
    """A delivery's retries must end before its event is trimmed (a delivery whose event is gone is
    dropped): its last attempt comes at most the longest delay, with its jitter, after ``retry_days`` (an
    endpoint's ``Retry-After`` never moves an attempt past the retry window, ``webhooks.delivery``)."""
    hooks = settings.webhooks
    last = max(hooks.retry_delays) * (1 + WEBHOOK_JITTER) / DAY
    retention = settings.events.retention / DAY
    if hooks.retry_days + last > retention:
        raise SettingsError(
            f"{_variable(('webhooks', 'retry_days'))}: a delivery is retried up to {hooks.retry_days + last:.4g} days after "
            f"its first attempt ({hooks.retry_days:g}, its last attempt up to {last:.3g} later), longer than "
            f"{_variable(('events', 'retention'))} ({retention:.4g} days) keeps its event: lower it (or "
            f"{_variable(('webhooks', 'retry_delays'))}), or keep events longer"
        )
