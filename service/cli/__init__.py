"""The ``durapay`` command line: one typer app, one module per group of commands.

Each module under ``service.cli`` exposes ``register(app)``; :data:`COMMAND_MODULES` lists them, so
adding a command touches its own module and one line here. Errors the operator can fix (a bad
setting, a refused input) print one line on stderr and exit with status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer

from config.settings import SettingsError

COMMAND_MODULES = (
    "service.cli.config_cmd",
    "service.cli.endpoints",
    "service.cli.simulator_cmd",
    "service.cli.serve_cmd",
    "service.cli.flows_cmd",
    "service.cli.schedules_cmd",
    "service.cli.demo_cmd",
)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="durapay",
        help="Durable payment flows against the payment gateway.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def root() -> None:
        """Durable payment flows against the payment gateway: nothing lost, nothing charged twice."""

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    return app


def main() -> None:
    """Console-script entry point."""
    try:
        build_app()(standalone_mode=True)
    except SettingsError as exc:
        print(f"durapay: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
