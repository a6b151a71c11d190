"""durapay's settings: one pydantic-settings tree read from ``DURAPAY_*`` variables.

Why one tree: every process (worker, scheduler, api, simulator, demo) reads the same names, and every
component receives the part it needs through its constructor. Nothing reads the environment elsewhere.
Nested groups use ``__``: ``DURAPAY_GATEWAY__BASE_URL`` sets ``settings.gateway.base_url``.

A missing or malformed value fails at start with :class:`SettingsError`, whose message is one line
naming the variable and the problem, e.g.
``DURAPAY_GATEWAY__TIMEOUT: Input should be a valid number, unable to parse string as a number``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as _SourceError

ENV_PREFIX = "DURAPAY_"
ENV_NESTED_DELIMITER = "__"

#: The simulator's default API key (also its documented default); the gateway client uses it when no
#: key is configured so that the demo and tests run with nothing set.
SIMULATOR_API_KEY = "durapay-simulator-key"
#: The real gateway's published path prefix; the simulator serves the same prefix.
GATEWAY_PATH_PREFIX = "/api/phoenix-0.0/psp/api/v1"


class SettingsError(Exception):
    """A setting is missing or malformed; the message is one line naming the variable."""


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

    _url = field_validator("base_url")(_check_url)


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
    event_ttl_seconds: int = Field(
        default=7 * 86400, ge=60, description="How long a received eventId is remembered to ignore repeats."
    )

    _url = field_validator("public_url")(_check_url)


class ApiSettings(_Group):
    """The control API (and receiver) process."""

    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=0, le=65535)
    key: SecretStr = Field(default=SecretStr(""), description="X-Api-Key required by the control API.")
    start_wait_seconds: float = Field(
        default=5.0, ge=0, le=60, description="How long POST /flows/{kind} waits for the customer-facing URL."
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Larger control API bodies are refused (413) before they are parsed; flow inputs are a few KB.",
    )


class RetrySettings(_Group):
    """Technical retries of one step: exponential backoff with full jitter, bounded."""

    base_seconds: float = Field(default=1.0, gt=0)
    cap_seconds: float = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=8, ge=1)
    reconcile_attempts: int = Field(default=6, ge=1, description="Reads before an ambiguous step needs a person.")


class EngineSettings(_Group):
    """The durable engine: leases, the dispatcher's tick, how long finished flows are kept."""

    key_prefix: str = Field(default="durapay", min_length=1)
    partitions: int = Field(default=4, ge=1, le=1024, description="Hash-tag partitions of the due set and indexes.")
    lease_seconds: float = Field(default=60.0, gt=0)
    dispatch_interval: float = Field(default=0.5, gt=0)
    dispatch_batch: int = Field(default=500, ge=1)
    retention_days: float = Field(default=30.0, gt=0)
    wait_deadline_seconds: float = Field(default=1800.0, gt=0)
    sync_aof: Literal["auto", "yes", "no"] = Field(
        default="auto",
        description="Wait for the AOF fsync of starts, money-moving claims and signals (auto: unless appendfsync is always).",
    )
    sync_replicas: int = Field(default=0, ge=0, le=16, description="Replicas that must receive those writes (WAIT).")
    sync_timeout: float = Field(default=2.0, gt=0, le=60, description="Seconds to wait for them before refusing.")
    max_step_runs: int = Field(
        default=500,
        ge=10,
        description="Claims of one step without moving on before the flow stops for a person (the bound under every loop).",
    )


class EventsSettings(_Group):
    """Merchant events (``workflows/events.py``): written with each transition, read by the feed and webhooks."""

    enabled: bool = Field(default=True, description="Write merchant events with each transition.")
    retention_days: float = Field(default=7.0, gt=0, le=90, description="How long events stay readable and deliverable.")


class Settings(BaseSettings):
    """The whole tree. Build it with :func:`load_settings`; pass the parts to constructors."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="ignore",
        frozen=True,
    )

    redis_url: str = Field(default="", description="Redis for flow records; empty = embedded Valkey.")
    broker_url: str = Field(default="", description="Celery broker; empty = the Redis URL.")
    data_dir: Path = Field(default=Path(".durapay"), description="Embedded Valkey data and demo files.")
    gateway: GatewaySettings = GatewaySettings()
    receiver: ReceiverSettings = ReceiverSettings()
    api: ApiSettings = ApiSettings()
    retry: RetrySettings = RetrySettings()
    engine: EngineSettings = EngineSettings()
    events: EventsSettings = EventsSettings()

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _scheme(cls, value: str) -> str:
        allowed = ("redis://", "rediss://", "unix://", "valkey://", "amqp://", "amqps://", "pyamqp://")
        if value and not value.startswith(allowed):
            raise ValueError("must start with redis://, rediss://, unix:// (or amqp:// for the broker)")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_only(cls, value: str) -> str:
        if value.startswith(("amqp", "pyamqp")):
            raise ValueError("flow records live in Redis: use redis://, rediss:// or unix://")
        return value


def _variable(loc: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(str(part).upper() for part in loc)


def load_settings(overrides: Mapping[str, Any] | None = None) -> Settings:
    """Read the settings from the environment (and ``overrides``), or raise a one-line SettingsError.

    The first problem is reported; that is the one the operator fixes next.
    """
    try:
        settings = Settings(**dict(overrides or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        raise SettingsError(f"{_variable(first['loc'])}: {message}") from None
    except _SourceError as exc:
        # A group variable (``DURAPAY_GATEWAY``) that is not JSON: pydantic-settings names the field.
        found = re.search(r'field "(\w+)"', str(exc))
        name = _variable((found.group(1),)) if found else ENV_PREFIX + "*"
        raise SettingsError(f"{name}: not valid JSON (set the nested variables, e.g. {name}__...)") from None
    call = settings.gateway.timeout + settings.gateway.connect_timeout
    if settings.engine.lease_seconds <= call:
        # A lease shorter than one gateway call lets a second worker take a step still talking to the gateway.
        raise SettingsError(
            f"{_variable(('engine', 'lease_seconds'))}: must exceed one gateway call "
            f"(DURAPAY_GATEWAY__TIMEOUT + DURAPAY_GATEWAY__CONNECT_TIMEOUT = {call:g}s)"
        )
    return settings
