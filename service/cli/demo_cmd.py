"""``durapay demo``: run the whole system on this machine and every flow kind through it.

Nothing needs to be configured: with no ``DURAPAY_REDIS_URL`` an embedded Valkey is started under
``DURAPAY_DATA_DIR`` (``.durapay``), AOF on. Exit status 0 only if every flow ended as expected.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from service.cli._common import console, fail, settings_or_fail
from service.cli.simulator_cmd import DEFAULT_PORT


def demo(
    keep: Annotated[bool, typer.Option("--keep", help="Leave everything running afterwards (Ctrl-C stops it).")] = False,
    data_dir: Annotated[Path | None, typer.Option(help="Data folder (DURAPAY_DATA_DIR, default .durapay).")] = None,
    api_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="API port if free, else any (0: any; default DURAPAY_API__PORT).")
    ] = None,
    simulator_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Simulator port if free, else any (0: any).")
    ] = DEFAULT_PORT,
) -> None:
    """Start Valkey, the simulator, workers, a scheduler and the API; run every flow kind; show the results."""
    from service.demo import run_demo

    settings = settings_or_fail()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})

    def _terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        port = settings.api.port if api_port is None else api_port
        code = run_demo(settings, console(), keep=keep, api_port=port, simulator_port=simulator_port)
    except KeyboardInterrupt:
        fail("interrupted; everything started was stopped")
    except (OSError, RuntimeError, TimeoutError) as exc:
        fail(f"the demo could not start: {exc}")
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
