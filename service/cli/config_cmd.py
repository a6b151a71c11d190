"""``durapay config``: the effective settings (secrets masked), and a check that they load."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from pydantic import SecretStr

from durapay.config import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings
from durapay.config.secrets import masked_url, redact, secrets_of
from durapay.service.cli._common import Output
from durapay.service.cli._output import print_rows


def _shown(value: Any) -> Any:
    """A value inside a list or map setting (the configured webhook endpoints), its secrets masked."""
    if isinstance(value, SecretStr):
        return "(set)" if value.get_secret_value() else "(empty)"
    if isinstance(value, dict):
        return {key: _shown(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(item) for item in value]
    return masked_url(value) if isinstance(value, str) else value


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if prefix.endswith(f"API{ENV_NESTED_DELIMITER}KEYS") and isinstance(value, dict):
        roles = sorted(value.values())
        out[prefix] = f"({len(value)} set: {', '.join(roles)})" if value else "(empty)"  # the keys are secrets
    elif isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}{ENV_NESTED_DELIMITER if prefix != ENV_PREFIX else ''}{key.upper()}", item, out)
    elif isinstance(value, SecretStr):
        out[prefix] = "(set)" if value.get_secret_value() else "(empty)"
    elif isinstance(value, list | tuple):
        out[prefix] = json.dumps(_shown(value), default=str)
    else:
        out[prefix] = masked_url(str(value))  # a URL's password (DURAPAY_REDIS_URL, DURAPAY_BROKER_URL)


def effective(settings: Settings) -> dict[str, str]:
    """``{"DURAPAY_GATEWAY__TIMEOUT": "10.0", ...}``: every variable and its value, secrets masked (and,
    whatever a value's form, no secret of the settings in it: ``config.secrets``)."""
    out: dict[str, str] = {}
    _flatten(ENV_PREFIX, settings.model_dump(), out)
    secrets = secrets_of(settings)
    return {name: redact(value, secrets) for name, value in out.items()}


def show_config(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object (errors too, on stderr).")] = False,
) -> None:
    """Print the settings durapay would run with (from DURAPAY_* variables), secrets masked."""
    values = effective(Output(as_json).settings())
    if as_json:
        typer.echo(json.dumps(values, indent=2))
        return
    print_rows("durapay settings", ("variable", "value"), list(values.items()), ids=frozenset({"variable"}))


def register(app: typer.Typer) -> None:
    app.command("config")(show_config)
