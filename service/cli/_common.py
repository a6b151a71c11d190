"""What the commands share: the runtime from the settings, one-line operator errors, output helpers.

An operator error (a bad setting, an unknown flow, a refused input, Redis unreachable) prints one line
``durapay: <what>`` on stderr and exits with status 2, never a traceback. Read commands print a rich
table, or JSON with ``--json`` (for scripts: stable keys, nothing else on stdout).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import redis
import typer
from rich.console import Console

from config.settings import Settings, SettingsError, load_settings
from service.runtime import Runtime, build_runtime
from workflows.engine import InputError, NotFound, OperatorError
from workflows.store import StartConflict

EXIT_OPERATOR = 2


def fail(message: str) -> NoReturn:
    """Print ``durapay: <message>`` on stderr and exit 2."""
    print(f"durapay: {message}", file=sys.stderr)
    raise typer.Exit(EXIT_OPERATOR)


@contextlib.contextmanager
def operator_errors() -> Iterator[None]:
    """Turn the errors an operator can act on into one line and exit status 2."""
    try:
        yield
    except SettingsError as exc:
        fail(f"configuration error: {exc}")
    except InputError as exc:
        fail(f"{exc.kind}: {exc.field}: {exc.reason}")
    except (NotFound, OperatorError, StartConflict) as exc:
        fail(str(exc))
    except redis.RedisError as exc:
        fail(f"Redis unavailable ({exc}); check DURAPAY_REDIS_URL")
    except (OSError, ValueError) as exc:
        fail(str(exc))


def settings_or_fail() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        fail(f"configuration error: {exc}")


@contextlib.contextmanager
def runtime(clock_key: str | None = None) -> Iterator[Runtime]:
    """The runtime built from the ``DURAPAY_*`` settings, closed afterwards.

    ``clock_key`` (the demo's hidden ``--clock-key``) makes the engine read the demo's shared clock.
    """
    with operator_errors():
        settings = settings_or_fail()
        clock = None
        if clock_key:
            if not settings.redis_url:
                fail("--clock-key needs DURAPAY_REDIS_URL (the clock lives in that Redis)")
            from service.demo.clock import SharedClock

            clock = SharedClock(settings.redis_url, clock_key)
        built = build_runtime(settings, clock=clock)
        try:
            yield built
        finally:
            built.close()


def safe_url(url: str) -> str:
    """``url`` with any password masked, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def console() -> Console:
    found = Console()
    return found if found.is_terminal else Console(width=200)


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return ""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


def read_json_input(source: str) -> Any:
    """JSON from a file path, or stdin for ``-``; ValueError with a one-line reason."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {source}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{'stdin' if source == '-' else source} is not JSON: {exc}") from None
