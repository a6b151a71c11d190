"""``durapay cards new-key|keys|reseal``: the card key that seals card data at rest (``workflows.engine.cards``).

Card fields (PAN, expiry date, CVV, a wallet's payment data) are written to Redis only sealed with the
first key of ``DURAPAY_CARD__KEYS``; any key of the list opens what it sealed. Rotating (docs/operations.md,
Rotating the card key): ``new-key`` makes an entry, put it first in the list of every process and
restart them; ``keys`` counts the flows in flight by the key that sealed their card; ``reseal`` seals them
again under the first key; an old key that seals no flow in flight any more may then be removed.
"""

from __future__ import annotations

from typing import Annotated

import typer

from durapay.service.cli._common import Output, runtime
from durapay.service.cli._output import echo_json

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")]

cards_app = typer.Typer(help="The card key: card data is written to Redis only sealed with it.", no_args_is_help=True)


@cards_app.command("new-key")
def new_key_command(
    key_id: Annotated[str, typer.Option("--id", help="The key's id (letters, digits, - or _; default: random).")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Print a new key entry for DURAPAY_CARD__KEYS (<id>:<base64 of 32 bytes>); it is kept nowhere."""
    from durapay.workflows.engine import new_key

    out = Output(as_json)
    with out.errors():
        entry = new_key(key_id)
    if as_json:
        echo_json({"key": entry})
    else:
        typer.echo(entry)


def _report(reseal: bool, as_json: bool) -> None:
    from durapay.workflows.engine import in_flight

    out = Output(as_json)
    with runtime(out, writes=reseal) as rt, out.errors():
        seen = in_flight(rt.engine, reseal=reseal)
        configured = [key.id for key in rt.engine.cards.keys]
    if as_json:
        echo_json({"keys": configured, "in_flight": seen.by_key, "flows": seen.flows, "resealed": seen.resealed})
        return
    for key_id in configured or ["(none configured)"]:
        role = "seals new cards" if configured and key_id == configured[0] else "opens only"
        typer.echo(f"{key_id}: {seen.by_key.get(key_id, 0)} flows in flight ({role})")
    for key_id in sorted(set(seen.by_key) - set(configured)):
        typer.echo(f"{key_id}: {seen.by_key[key_id]} flows in flight, NOT CONFIGURED: put it back in DURAPAY_CARD__KEYS")
    if reseal:
        typer.echo(f"resealed under {configured[0] if configured else '-'}: {seen.resealed} of {seen.flows} flows")


@cards_app.command("keys")
def keys_command(as_json: JsonFlag = False) -> None:
    """Count the flows in flight by the key that sealed their card data (an old key at 0 may go)."""
    _report(False, as_json)


@cards_app.command("reseal")
def reseal_command(as_json: JsonFlag = False) -> None:
    """Seal again, under the first key, the card data of every flow in flight sealed by another."""
    _report(True, as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(cards_app, name="cards")
