"""``durapay demo``: run the whole system on this machine and every flow kind through it.

Nothing needs to be configured: with no ``DURAPAY_REDIS_URL`` an embedded Valkey is started under
``DURAPAY_DATA_DIR`` (``.durapay``), AOF on. Exit status 0 only if every flow ended as expected.
"""

from __future__ import annotations

from typing import Annotated

import typer

from durapay.service.cli._common import ApiPortOption, DataDirOption, ExitCode, Output, interrupt_on_sigterm
from durapay.service.cli._output import console, echo_json
from durapay.service.cli.simulator_cmd import DEFAULT_PORT, SimulatorPortOption
from durapay.service.demo.report import Row


def demo(
    keep: Annotated[bool, typer.Option("--keep", help="Leave everything running afterwards (Ctrl-C stops it).")] = False,
    data_dir: DataDirOption = None,
    api_port: ApiPortOption = None,
    simulator_port: SimulatorPortOption = DEFAULT_PORT,
    as_json: Annotated[
        bool, typer.Option("--json", help="Progress on stderr; the flows and their outcomes as JSON on stdout.")
    ] = False,
) -> None:
    """Start Valkey, the simulator, workers, a scheduler and the API; run every flow kind; show the results.

    Exit status 0 when every flow ended as expected, 1 otherwise.
    """
    from durapay.service.demo import run_demo

    out = Output(as_json)
    settings = out.settings(data_dir=data_dir, shared=False)
    interrupt_on_sigterm()
    try:
        port = settings.api.port if api_port is None else api_port
        screen = console(stderr=as_json)
        report = _print_rows if as_json else None
        code = run_demo(settings, screen, keep=keep, api_port=port, simulator_port=simulator_port, report=report)
    except KeyboardInterrupt:
        out.fail("interrupted", "interrupted; everything started was stopped", code=ExitCode.FAILED)
    except (OSError, RuntimeError, TimeoutError) as exc:
        out.fail("unavailable", f"the demo could not start: {exc}")
    raise typer.Exit(code)


def _print_rows(rows: list[Row]) -> None:
    echo_json(
        [
            {
                "name": row.name,
                "kind": row.kind,
                "id": row.flow_id,
                "steps": row.steps,
                "state": row.state,
                "expected": row.expected,
                "ok": row.ok,
                "seconds": round(row.seconds, 3),
                "problem": row.problem or None,
            }
            for row in rows
        ]
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
