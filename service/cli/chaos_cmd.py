"""``durapay chaos``: run many flows while workers, the scheduler, Redis and the gateway fail; reconcile.

Exit status 0 only when nothing went wrong: no acknowledged flow lost, nothing charged twice, no money
at the gateway that its flow does not show, nothing stuck, every flow finished in time. 1 otherwise;
2 when it cannot run (a usage error, no C compiler for ``--lose-last-writes``, a part that does not
start).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console

from durapay.service.cli._common import DataDirOption, ExitCode, Output, interrupt_on_sigterm
from durapay.service.cli._output import console, echo_json


class AppendFsync(StrEnum):
    """The AOF fsync policies the run's own Valkey can take (``no`` never fsyncs: nothing to prove)."""

    ALWAYS = "always"
    EVERYSEC = "everysec"


def chaos(
    seed: Annotated[int, typer.Option(min=0, help="Every random choice derives from it: the same seed, the same run.")] = 1,
    flows: Annotated[int, typer.Option(min=2, max=100_000, help="Flows to start (follow-ups included).")] = 100,
    duration: Annotated[
        float, typer.Option(min=10, max=86_400, help="Seconds of chaos: flows start and things break meanwhile.")
    ] = 120.0,
    lose_last_writes: Annotated[
        bool,
        typer.Option(
            "--lose-last-writes",
            help="At each Redis restart, a host crash: cut the AOF's tail back to (no earlier than) its last fsync.",
        ),
    ] = False,
    appendfsync: Annotated[
        AppendFsync,
        typer.Option(
            help="AOF fsync of the Valkey it runs: always (durapay's default: on disk when acknowledged) or everysec "
            "(the engine waits with WAITAOF; a server answering it before its fsync shows as lost flows).",
        ),
    ] = AppendFsync.ALWAYS,
    redis_url: Annotated[
        str | None,
        typer.Option(help="Use this Redis (nobody else's: the run writes to it) instead of starting one; no Redis restarts."),
    ] = None,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Progress on stderr; the report as JSON on stdout.")] = False,
) -> None:
    """Run FLOWS mixed flows for DURATION seconds while SIGKILLing workers and the scheduler, restarting
    Redis and turning on gateway faults; then reconcile every flow against the gateway's ledger.

    Exit status 0 when nothing went wrong, 1 otherwise.
    """
    from durapay.service.chaos import ChaosOptions, print_report, run_chaos
    from durapay.service.chaos.aof import CrashModelUnavailable

    out = Output(as_json)
    if lose_last_writes and redis_url:
        out.fail(
            "usage", "--lose-last-writes cuts the AOF of a Redis it runs itself: drop --redis-url", field="--lose-last-writes"
        )
    if appendfsync is not AppendFsync.ALWAYS and redis_url:
        out.fail("usage", "--appendfsync sets the Valkey the run starts itself: drop --redis-url", field="--appendfsync")
    settings = out.settings(data_dir=data_dir, shared=False)
    interrupt_on_sigterm()
    screen = Console(stderr=True) if as_json else console()
    options = ChaosOptions(seed, flows, duration, lose_last_writes, redis_url, appendfsync.value)
    try:
        report = run_chaos(settings, options, lambda line: screen.print(line, highlight=False, markup=False))
    except KeyboardInterrupt:
        out.fail("interrupted", "interrupted; everything started was stopped", code=ExitCode.FAILED)
    except CrashModelUnavailable as exc:
        out.fail("unavailable", str(exc), field="--lose-last-writes")
    except (OSError, RuntimeError, TimeoutError) as exc:
        out.fail("unavailable", f"the chaos run could not start: {exc}")
    except Exception as exc:  # noqa: BLE001 - a defect of the run itself: one line, never a traceback
        out.fail("failed", f"the chaos run stopped: {type(exc).__name__}: {exc}", code=ExitCode.FAILED)
    if as_json:
        echo_json(report.to_json())
    else:
        print_report(screen, report)
    raise typer.Exit(ExitCode.OK if report.ok else ExitCode.FAILED)


def register(app: typer.Typer) -> None:
    app.command("chaos")(chaos)
