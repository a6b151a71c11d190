"""``durapay simulator``: serve the gateway simulator in the foreground (one uvicorn worker).

The defaults match durapay's own defaults, so ``durapay simulator`` and a client with nothing
configured find each other: port 8781, the gateway's path prefix, API key ``durapay-simulator-key``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from durapay.config.settings import SIMULATOR_API_KEY
from durapay.service.cli._common import Output

DEFAULT_PORT = 8781
#: The simulator's port as the commands that start one take it.
SimulatorPortOption = Annotated[int, typer.Option(min=0, max=65535, help="Simulator port if free, else any (0: any).")]


def simulator(
    port: Annotated[int, typer.Option(help="Port to listen on (0 = a free port).")] = DEFAULT_PORT,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    api_key: Annotated[str, typer.Option(help="The X-Api-Key the simulator accepts.")] = SIMULATOR_API_KEY,
    latency_ms: Annotated[int, typer.Option(help="Latency added to every gateway request.")] = 0,
    latency_jitter_ms: Annotated[int, typer.Option(help="Random extra latency, 0 to N ms (seeded).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of every random choice (ids, tokens, faults, jitter).")] = 0,
    auto_complete_ms: Annotated[
        int | None, typer.Option(help="Hosted pages, links and build forms complete by themselves after N ms.")
    ] = None,
    order_id_max_length: Annotated[
        int, typer.Option(help="The longest orderId an order may be created with (18 or 27: docs/gateway.md).")
    ] = 18,
    state_file: Annotated[
        Path | None, typer.Option(help="Load the state from this JSON file at start; save it there while running.")
    ] = None,
    terminal_key: Annotated[
        list[str] | None,
        typer.Option(
            help="A terminal besides default and its key, NAME=KEY (repeatable): that key sees its terminal's orders "
            "only, and each order is recorded with the terminal whose key made it (docs/simulator.md, Terminals)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Errors (and the start line) as JSON.")] = False,
) -> None:
    """Serve the gateway simulator: every gateway operation over HTTP, test cards, faults, /_sim/ admin."""
    from durapay.simulator import SimulatorConfig, serve_forever

    try:
        terminal_keys = {}
        for entry in terminal_key or []:
            name, sep, key = entry.partition("=")
            if not sep or not name or not key:
                raise ValueError(f"--terminal-key {entry.split('=')[0]!r}...: give NAME=KEY")
            terminal_keys[key] = name
        config = SimulatorConfig(
            api_key=api_key,
            seed=seed,
            latency_ms=latency_ms,
            latency_jitter_ms=latency_jitter_ms,
            auto_complete_ms=auto_complete_ms,
            host=host,
            port=port,
            state_file=state_file,
            order_id_max_length=order_id_max_length,
            terminal_keys=terminal_keys,
        )
    except ValueError as exc:
        Output(as_json).fail("invalid_input", str(exc), human=f"simulator: {exc}")
    base = f"http://{host}:{port}"
    if as_json:
        typer.echo(
            json.dumps({"process": "simulator", "event": "started", "url": base + config.path_prefix, "admin": base + "/_sim/"})
        )
    else:
        typer.echo(f"durapay simulator on {base}{config.path_prefix} (X-Api-Key: {api_key}); admin and pages under {base}/_sim/")
    serve_forever(config)


def register(app: typer.Typer) -> None:
    app.command("simulator")(simulator)
