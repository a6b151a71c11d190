"""What the commands share: exit statuses, errors (one line, or JSON with ``--json``), the runtime.

Exit statuses, the same for every command (docs/cli.md):

=====  ==========================================================================================
0      done; with ``start --wait``: the flow succeeded
1      the flow failed or was cancelled (``start --wait``); a health check's "no" (``alive``)
2      usage, input or configuration error, Redis unreachable, no flow store
3      the flow needs attention (``start --wait``)
4      timed out while waiting (``start --wait``): the flow goes on
=====  ==========================================================================================

An error prints one line ``durapay: <what>`` on stderr; with ``--json`` one JSON object on stderr
instead, the API's shape: ``{"error": <code>, "reason": <one line>, "field": <which>}`` (``field``
when one input is to blame). Never a traceback, never a Python repr.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from durapay.workflows.engine import FlowState

if TYPE_CHECKING:
    from durapay.config.settings import Settings, SettingsError
    from durapay.service.runtime import Runtime

# The settings, the runtime and the engine's errors are imported where a command runs, not here: every
# command module imports this one, and the shell's completion of a command must not load the engine.

#: The options the commands that run a stack of their own (demo, dev, chaos) share.
DataDirOption = Annotated[Path | None, typer.Option(help="Data folder (DURAPAY_DATA_DIR, default .durapay).")]
ApiPortOption = Annotated[
    int | None, typer.Option(min=0, max=65535, help="API port if free, else any (0: any; default DURAPAY_API__PORT).")
]

#: What an embedded Valkey keeps under ``<data dir>/valkey``: its presence means a store exists there.
AOF_FOLDER = "appendonlydir"


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    NEEDS_ATTENTION = 3
    TIMED_OUT = 4


def exit_code_for(state: FlowState) -> ExitCode:
    """The exit status of ``start --wait`` once the flow stopped in ``state``."""
    if state is FlowState.SUCCEEDED:
        return ExitCode.OK
    if state is FlowState.NEEDS_ATTENTION:
        return ExitCode.NEEDS_ATTENTION
    return ExitCode.FAILED


class BadOption(ValueError):
    """A command-line value that cannot be used: ``field`` names the option, ``error`` the JSON code."""

    def __init__(self, field: str, reason: str, *, error: str = "invalid_input") -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.error = error


@dataclass(frozen=True)
class Output:
    """Where a command's errors go: one human line, or (``--json``) the JSON error shape."""

    json: bool = False

    def fail(
        self, error: str, reason: str, *, field: str | None = None, human: str | None = None, code: int = ExitCode.USAGE
    ) -> NoReturn:
        """Print the error on stderr and exit with ``code``. ``human`` overrides the line without ``--json``.

        The one printer of a command's errors: no secret the ``DURAPAY_*`` variables carry (a key, a
        webhook secret, a URL's password) is ever printed, whatever the error quotes (``config.secrets``)."""
        from durapay.config.secrets import redact, secrets_in

        given = secrets_in(os.environ)
        reason = redact(reason, given)
        if self.json:
            body: dict[str, Any] = {"error": error, "reason": reason}
            if field is not None:
                body["field"] = redact(field, given)
            print(json.dumps(body), file=sys.stderr)
        else:
            line = human or (f"{field}: {reason}" if field else reason)
            print(f"durapay: {redact(line, given)}", file=sys.stderr)
        raise typer.Exit(code)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Turn the errors an operator can act on into one error and exit status 2."""
        import redis

        from durapay.config.settings import SettingsError
        from durapay.workflows.engine import SETTING as CARD_SETTING
        from durapay.workflows.engine import (
            CardKeyMissing,
            CardUnreadable,
            EarlyWaitaof,
            InputError,
            NotFound,
            OperatorError,
            SignalRefused,
            StartConflict,
        )

        try:
            yield
        except SettingsError as exc:
            self.configuration_error(exc)
        except InputError as exc:
            self.fail("invalid_input", exc.reason, field=exc.field, human=f"{exc.kind}: {exc.field}: {exc.reason}")
        except NotFound as exc:
            self.fail("not_found", str(exc))
        except (OperatorError, StartConflict) as exc:
            self.fail("conflict", str(exc))
        except EarlyWaitaof as exc:
            self.fail("configuration", str(exc), field=exc.setting, human=str(exc))
        except (CardKeyMissing, CardUnreadable) as exc:
            self.fail("configuration", str(exc), field=CARD_SETTING, human=f"configuration error: {exc}")
        except redis.RedisError as exc:
            self.fail("unavailable", f"Redis unavailable ({exc}); check DURAPAY_REDIS_URL")
        except BadOption as exc:
            self.fail(exc.error, exc.reason, field=exc.field)
        except SignalRefused as exc:
            self.fail("invalid_input", exc.reason, field=exc.field, human=f"signal {exc.name}: {exc.field}: {exc.reason}")
        except (OSError, ValueError) as exc:
            self.fail("invalid_input", str(exc))

    def configuration_error(self, exc: SettingsError) -> NoReturn:
        text = str(exc)
        variable, _, reason = text.partition(": ")
        field = variable if variable.startswith("DURAPAY_") and reason else None
        self.fail("configuration", reason if field else text, field=field, human=f"configuration error: {text}")

    def settings(self, *, data_dir: Path | None = None, shared: bool = True) -> Settings:
        """The ``DURAPAY_*`` settings; ``data_dir``: a command's ``--data-dir`` over them. ``shared``: with
        no ``DURAPAY_REDIS_URL``, the settings of the ``durapay dev`` running in the data folder are read
        under the environment (``service.dev.shared_settings``); the commands running stacks of their own
        (dev, demo, chaos) pass False."""
        from durapay.config.settings import SettingsError, load_settings

        try:
            settings = load_settings()
            if shared and not settings.redis_url:
                from durapay.service.dev import shared_settings

                found = shared_settings(Path(data_dir or settings.data_dir))
                settings = load_settings(env_file=found) if found is not None else settings
        except SettingsError as exc:
            self.configuration_error(exc)
        return settings if data_dir is None else settings.model_copy(update={"data_dir": data_dir})


def one_of(value: str, known: Iterable[str], option: str, what: str = "value") -> str:
    """``value`` when it is one of ``known``; else :class:`BadOption` naming the closest (``--state faild``:
    did you mean `failed`?) and the known ones, as the API's strict input does (``gateway.did_you_mean``)."""
    from durapay.gateway import did_you_mean

    names = sorted(known)
    if value in names:
        return value
    raise BadOption(option, f"unknown {what} {value!r}{did_you_mean(value, names)} (known: {', '.join(names)})")


def interrupt_on_sigterm() -> None:
    """SIGTERM as Ctrl-C (KeyboardInterrupt): a command that started processes stops them either way.

    SIGINT is taken too, whatever the process was started with: a shell starts a background job (`cmd &`
    in a script, CI) with SIGINT ignored, and Python then installs no KeyboardInterrupt for it, so
    `durapay dev` ignored the Ctrl-C (SIGINT) its contract says stops everything."""

    def _interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def runtime(
    out: Output, clock_key: str | None = None, *, may_start_store: bool = False, writes: bool = False
) -> Iterator[Runtime]:
    """The runtime built from the ``DURAPAY_*`` settings, closed afterwards.

    With no ``DURAPAY_REDIS_URL`` the embedded Valkey already serving ``DURAPAY_DATA_DIR`` is used, or
    one is started on the store the folder holds (say after ``durapay demo``). Only the commands that
    run a store of their own (``may_start_store``: worker, scheduler, api) create a new, empty one;
    the others refuse (exit 2) rather than create a store nothing serves and list nothing from it.
    ``clock_key`` (the demo's hidden ``--clock-key``) makes the engine read the demo's shared clock.
    ``writes``: the command writes flows; it refuses (exit 2) a server whose ``WAITAOF`` answers before
    its fsync unless the settings accept it (``service.runtime.admit_durability``), before writing.
    """
    from durapay.config.embedded import running_embedded
    from durapay.service.runtime import admit_durability, build_runtime, no_store_text

    with out.errors():
        settings = out.settings()
        redis_url = None
        if not settings.redis_url and not may_start_store:
            folder = (Path(settings.data_dir) / "valkey").resolve()
            redis_url = running_embedded(folder)
            if redis_url is None and not (folder / AOF_FOLDER).is_dir():
                out.fail("configuration", no_store_text(folder), field="DURAPAY_REDIS_URL", human=no_store_text(folder))
        clock = None
        if clock_key:
            if not settings.redis_url:
                out.fail("configuration", "--clock-key needs DURAPAY_REDIS_URL (the clock lives in that Redis)")
            from durapay.service.demo.clock import SharedClock

            clock = SharedClock(settings.redis_url, clock_key)
        built = build_runtime(settings, redis_url=redis_url, clock=clock)
        try:
            if writes:
                admit_durability(built, where=safe_url(built.redis_url))
            yield built
        finally:
            built.close()


def safe_url(url: str) -> str:
    """``url`` with any password masked, for printing (``config.secrets.masked_url``: the one rule)."""
    from durapay.config.secrets import masked_url

    return masked_url(url)


def read_json_input(source: str, *, option: str, expected: str) -> Any:
    """JSON from a file path, or stdin for ``-``; :class:`BadOption` with a one-line reason.

    Stdin that is a terminal is refused at once (``expected`` says what to give): reading it would
    wait, without a word, for a JSON document nobody is typing.
    """
    if source == "-" and sys.stdin.isatty():
        raise BadOption(
            option,
            f"expected {expected} on stdin, but stdin is a terminal: give a file ({option} FILE) or pipe it ({option} - < FILE)",
            error="usage",
        )
    from durapay.service.inbound import Refusal, decode_json

    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise BadOption(option, f"cannot read {source}: {exc.strerror}") from None
    try:
        return decode_json(raw)  # the API's input boundary: UTF-8 JSON, bounded, its text and numbers checked
    except Refusal as refused:
        where = "stdin" if source == "-" else source
        if refused.field in (None, "(body)"):
            reason = refused.reason.removeprefix("the ").replace("body is", f"{where} is", 1)
        else:
            reason = f"{where}: {refused.field}: {refused.reason}"
        raise BadOption(option, reason) from None
