"""``durapay dev``: Valkey, the simulator, the API with the console, a worker and a scheduler, from one
command, with consistent settings (``service.dev``); prints the console's URL and the operator key,
streams the processes' log lines (each named by its process), and stops everything on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from durapay.service.cli._common import ApiPortOption, DataDirOption, ExitCode, Output, interrupt_on_sigterm
from durapay.service.cli.simulator_cmd import DEFAULT_PORT, SimulatorPortOption
from durapay.service.demo.report import cli_command
from durapay.service.dev import DevStack, Places

#: A process's name is padded to this width in the log, so that the lines align.
NAME_WIDTH = 9


def dev(
    data_dir: DataDirOption = None,
    api_port: ApiPortOption = None,
    simulator_port: SimulatorPortOption = DEFAULT_PORT,
    as_json: Annotated[
        bool, typer.Option("--json", help="The places (URLs, key) as one JSON line on stdout; the log on stderr.")
    ] = False,
) -> None:
    """Run Valkey, the simulator, the API with the console, a worker and a scheduler until Ctrl-C.

    Valkey belongs to none of the services: dev starts it again (same port, same data) if it dies, and
    the services reconnect. Exit status 0 when stopped by Ctrl-C or SIGTERM, 1 when a process kept
    dying, 2 when it could not start.
    """
    out = Output(as_json)
    settings = out.settings(data_dir=data_dir, shared=False)
    lock = threading.Lock()
    stream = sys.stderr if as_json else sys.stdout

    def sink(name: str, line: str) -> None:
        with lock:
            print(f"{name:<{NAME_WIDTH}}| {line}", file=stream, flush=True)

    stack = DevStack(settings, sink, api_port=settings.api.port if api_port is None else api_port, simulator_port=simulator_port)
    interrupt_on_sigterm()
    code = ExitCode.OK
    try:
        places = stack.start()
        with lock:
            _banner(places, as_json=as_json)
        stack.watch()
        if stack.failure:
            sink("dev", f"stopping: {stack.failure}")
            code = ExitCode.FAILED
    except KeyboardInterrupt:
        sink("dev", "stopping")
    except (OSError, RuntimeError, TimeoutError) as exc:
        _stop(stack)
        out.fail("unavailable", f"durapay dev could not start: {exc}")
    _stop(stack)
    sink("dev", "stopped")
    raise typer.Exit(code)


def _stop(stack: DevStack) -> None:
    """Stop everything, a second Ctrl-C or SIGTERM notwithstanding (each stop is bounded)."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    stack.stop()


def _banner(places: Places, *, as_json: bool) -> None:
    if as_json:
        fields = {
            "console": places.console_url,
            "api": places.api_url,
            "key": places.key,
            "simulator": places.simulator_url,
            "redis": places.redis_url,
            "data_dir": str(places.data_dir),
            "logs": str(places.log_dir),
        }
        print(json.dumps(fields), flush=True)
        return
    cli = cli_command()
    if places.data_dir != Path(".durapay").resolve():  # not the default: the CLI must be told
        cli = f"DURAPAY_DATA_DIR={places.data_dir} {cli}"
    lines = [
        "",
        "durapay dev: everything runs",
        f"  Console    {places.console_url}   (sign in with the operator key)",
        f"  Key        export KEY={places.key}",
        f"  API        {places.api_url}   (X-Api-Key: $KEY; docs {places.api_url}/docs)",
        f"  Simulator  {places.simulator_url}/_sim/   (the gateway: its pages, operations, faults)",
        f"  Valkey     {places.redis_url}   (restarted on this port with its data if it dies)",
        f"  CLI        {cli} flows ls   (nothing else to configure: dev shares its settings with this folder)",
        f"  Webhooks   {cli} listen --forward-to http://127.0.0.1:8000/hooks   (every event, signed, to your receiver)",
        f"  Data       {places.data_dir}   (logs in {places.log_dir})",
        "Press Ctrl-C to stop everything.",
        "",
    ]
    print("\n".join(lines), flush=True)


def register(app: typer.Typer) -> None:
    app.command("dev")(dev)
