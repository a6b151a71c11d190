"""The ``durapay`` command line: one typer app, one module per group of commands.

Each module under ``service.cli`` exposes ``register(app)``; :data:`COMMAND_MODULES` lists them with
the root commands each registers, so adding a command touches its own module and one line here.

Conventions (docs/cli.md), those of ``gh`` and ``kubectl``: every command takes ``--json``; an error
is one line ``durapay: ...`` on stderr, or with ``--json`` one JSON object ``{"error", "reason",
"field"}`` on stderr, never a traceback; exit statuses are those of ``service.cli._common.ExitCode``
(0 succeeded, 1 failed, 2 usage or configuration, 3 needs attention, 4 timed out while waiting),
a mistyped option or argument included (2). Shell completion installs with ``durapay
--install-completion`` (or prints with ``--show-completion``).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

import typer
import typer.main
from typer import _click as click  # typer carries its own click: its commands and contexts are these
from typer._click.shell_completion import CompletionItem
from typer.core import TyperGroup, TyperOption

from durapay.service.cli._common import ExitCode

#: Each module under ``service.cli`` and the root commands it registers: a command's module is imported
#: only when the command is used (or helped, or completed), so that a Tab in the shell loads the one
#: command it completes, not the engine, the API and the demo. ``tests/service/cli/test_completion.py``
#: checks that each module registers exactly the names listed here.
#: Their order is the help's: what a newcomer runs first (dev, demo), then the daily commands, then the
#: processes of a deployment and the tools.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "durapay.service.cli.dev_cmd": ("dev",),
    "durapay.service.cli.demo_cmd": ("demo",),
    "durapay.service.cli.flows_cmd": ("start", "flows"),
    "durapay.service.cli.schedules_cmd": ("schedules",),
    "durapay.service.cli.webhooks_cmd": ("webhooks", "events"),
    "durapay.service.cli.listen_cmd": ("listen",),
    "durapay.service.cli.kinds_cmd": ("kinds",),
    "durapay.service.cli.bulk_cmd": ("bulk",),
    "durapay.service.cli.reconcile_cmd": ("reconcile",),
    "durapay.service.cli.deploy_cmd": ("deploy",),
    "durapay.service.cli.serve_cmd": ("alive", "worker", "scheduler", "api"),
    "durapay.service.cli.chaos_cmd": ("chaos",),
    "durapay.service.cli.config_cmd": ("config",),
    "durapay.service.cli.cards_cmd": ("cards",),
    "durapay.service.cli.endpoints": ("endpoints",),
    "durapay.service.cli.simulator_cmd": ("simulator",),
}
_MODULE_OF = {name: module for module, names in COMMAND_MODULES.items() for name in names}


@functools.cache
def module_commands(module_name: str) -> dict[str, click.Command]:
    """The root commands ``module_name`` registers, built as click commands (imported once)."""
    holder = typer.Typer()
    importlib.import_module(module_name).register(holder)
    commands = dict(typer.main.get_group(holder).commands)
    for command in commands.values():
        quiet_flags(command)
    return commands


def quiet_flags(command: click.Command) -> None:
    """No ``<bool>`` after a plain flag (``--json``, ``--help``) in the help: typer writes each option's
    type there, which says nothing of a flag taking no value. Its subcommands too."""
    for param in [*command.params, command.get_help_option(click.Context(command))]:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        quiet_flags(sub)


def global_json(argv: list[str]) -> list[str]:
    """``durapay --json flows ls`` as ``durapay flows ls --json``: every command takes ``--json``, and the
    root has none of its own, so one given before the command is moved after it (before any ``--``)."""
    leading = 0
    while leading < len(argv) and argv[leading].startswith("-") and argv[leading] != "--":
        leading += 1
    if "--json" not in argv[:leading] or leading == len(argv):
        return argv
    rest = [arg for number, arg in enumerate(argv) if not (number < leading and arg == "--json")]
    end = rest.index("--") if "--" in rest else len(rest)
    return [*rest[:end], "--json", *rest[end:]]


class DurapayGroup(TyperGroup):
    """The root command: a usage error (unknown option, bad value, missing argument) is reported like
    every other error, as JSON on stderr when ``--json`` was given, and exits 2. Its commands are
    loaded by name (:data:`COMMAND_MODULES`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *(name for name in _MODULE_OF if name not in self.commands)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in _MODULE_OF:
            found = module_commands(_MODULE_OF[cmd_name])[cmd_name]
        return found

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """A mistyped command gets "did you mean" from every name (typer's own looks at the loaded ones)."""
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.UsageError as exc:
            close = difflib.get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if close and "Did you mean" not in exc.message:
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {', '.join(repr(name) for name in close)}?"
            raise

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """A command's name is completed from :data:`COMMAND_MODULES` without importing its module."""
        if incomplete.startswith("-"):
            return super().shell_complete(ctx, incomplete)
        return [CompletionItem(name) for name in self.list_commands(ctx) if name.startswith(incomplete)]

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv = global_json(list(sys.argv[1:] if args is None else args))
        quiet_flags(self)
        try:
            code = super().main(argv, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.TyperException as exc:  # click's usage errors, as typer carries them
            _usage_error(exc, as_json="--json" in argv, rich=self.rich_markup_mode is not None)
            code = exc.exit_code
        except typer.Abort:
            print("durapay: aborted", file=sys.stderr)
            code = ExitCode.FAILED
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else ExitCode.OK)


def _usage_error(exc: typer.TyperException, *, as_json: bool, rich: bool) -> None:
    if not as_json:
        if rich:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)  # type: ignore[arg-type]
        elif hasattr(exc, "show"):
            exc.show()
        else:
            print(f"Error: {exc.format_message()}", file=sys.stderr)
        return
    body: dict[str, Any] = {"error": "usage", "reason": exc.format_message()}
    param, option = getattr(exc, "param", None), getattr(exc, "option_name", None)
    if param is not None:
        body["field"] = (getattr(param, "opts", None) or [param.name])[0]
    elif option:
        body["field"] = option
    print(json.dumps(body), file=sys.stderr)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="durapay",
        cls=DurapayGroup,
        help="Durable payment flows against the payment gateway.",
        epilog=(
            "Exit status: 0 succeeded, 1 failed, 2 usage or configuration error, 3 needs attention, "
            "4 timed out while waiting. Every command takes --json (errors too, as JSON on stderr). "
            "Shell completion: durapay --install-completion."
        ),
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def root() -> None:
        """Durable payment flows against the payment gateway: nothing lost, nothing charged twice."""

    return app


def main() -> None:
    """Console-script entry point."""
    build_app()(prog_name="durapay")
