"""``durapay listen --forward-to URL``: every merchant event of the store, signed, to a receiver on this
machine, as ``stripe listen --forward-to`` does; each delivery shown as it happens.

Why not a webhook endpoint: an endpoint is kept (and retried for days) after the developer's receiver has
gone, and a loopback URL needs ``DURAPAY_WEBHOOKS__ALLOW_PRIVATE`` where the workers run. ``listen`` reads
the event feed itself from now on (``EventFeed.end``, then ``follow``), signs each event as a delivery is
signed (``webhooks.delivery.payload`` and ``signed_headers``: the same body and Standard Webhooks headers)
with a secret of its own, and POSTs it once: no retries (a failed delivery is shown; ``durapay events
replay`` or the feed gives it again). The secret is made once per data folder and kept in
``<data dir>/dev/listen-secret`` (its owner only), so a receiver configured with it keeps working across
runs. It needs no API key, no worker of its own and no setting: the store is found as every command finds
it (with ``durapay dev`` running in the folder, nothing to configure). Ctrl-C stops it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
import typer

from durapay.service.cli._common import BadOption, ExitCode, Output, interrupt_on_sigterm, runtime
from durapay.service.cli._output import when

#: The secret's file under the data folder's dev folder.
SECRET_FILE = "listen-secret"  # noqa: S105 - a file name, not a secret
#: How long the feed is left between two reads while nothing comes (seconds).
POLL_SECONDS = 0.25


def listen_secret(folder: Path) -> str:
    """The data folder's forwarding secret (``whsec_...``), made the first time (its owner only)."""
    from durapay.workflows.webhooks.signing import new_secret

    path = folder / SECRET_FILE
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept.startswith("whsec_"):
        return kept
    secret = new_secret()
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secret + "\n")
    return secret


def _target(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadOption("--forward-to", f"{url!r} is not an http:// or https:// URL (like http://127.0.0.1:8000/hooks)")
    return url


def listen(
    forward_to: Annotated[str, typer.Option("--forward-to", help="Where to POST each event: http://127.0.0.1:8000/hooks.")],
    events: Annotated[
        str | None, typer.Option("--events", help="Comma-separated event types (default: all; durapay events ls shows them).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Stop after forwarding this many events.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line per delivery (the secret first).")] = False,
) -> None:
    """Forward every new event, signed, to a local receiver, showing each delivery (like `stripe listen
    --forward-to`); prints the signing secret to verify them with (durapay.verify_webhook)."""
    from durapay.service.cli.webhooks_cmd import parse_types
    from durapay.service.dev import DEV_FOLDER
    from durapay.workflows.engine import EventFeed
    from durapay.workflows.webhooks.delivery import payload, signed_headers

    out = Output(as_json)
    with out.errors():
        url = _target(forward_to)
        wanted = parse_types(events, "--events") or None
    interrupt_on_sigterm()
    with runtime(out) as rt, out.errors():
        secret = listen_secret(Path(rt.settings.data_dir) / DEV_FOLDER)
        feed = EventFeed(rt.redis, rt.engine.keys)
        start = feed.end()
        cursor = start
        _say(as_json, {"ready": True, "forwardTo": url, "secret": secret}, _banner(url, secret))
        sent = 0
        try:
            with httpx.Client(timeout=rt.settings.webhooks.timeout) as http:
                for event, cursor in feed.follow(start, types=wanted, poll=POLL_SECONDS):  # noqa: B007 - the last one is said
                    _forward(http, url, secret, event, as_json, payload, signed_headers)
                    sent += 1
                    if limit is not None and sent >= limit:
                        break
        except KeyboardInterrupt:
            pass
    _say(as_json, {"stopped": True, "forwarded": sent, "after": cursor.text()}, f"stopped after {sent} event(s)")
    raise typer.Exit(ExitCode.OK)


def _banner(url: str, secret: str) -> str:
    return (
        f"Ready: forwarding every new event to {url}, signed (Standard Webhooks).\n"
        f"Your signing secret is {secret}\n"
        "(kept for this data folder; verify with durapay.verify_webhook(headers, body, secret)). Ctrl-C stops."
    )


def _forward(http: httpx.Client, url: str, secret: str, event: Any, as_json: bool, payload: Any, signed_headers: Any) -> None:
    """POST one event, once, and say how it went: the event on one line, the answer on the next."""
    body = payload(event)
    started = time.time()
    line: dict[str, Any] = {"event": event.id, "type": event.type, "at": when(started), "url": url}
    try:
        answer = http.post(url, content=body, headers=signed_headers(event.id, body, [secret], started))
        line["status"] = answer.status_code
    except httpx.HTTPError as exc:
        line["status"] = None
        line["error"] = f"{type(exc).__name__}: {exc}"[:200]
    line["ms"] = round((time.time() - started) * 1000, 1)
    answer_text = f"[{line['status']}]" if line["status"] is not None else f"[no answer: {line['error']}]"
    text = f"{when(event.time)}   --> {event.type} [{event.id}]\n{line['at']}  <--  {answer_text} POST {url} ({line['ms']} ms)"
    _say(as_json, line, text)


def _say(as_json: bool, line: dict[str, Any], text: str) -> None:
    typer.echo(json.dumps(line) if as_json else text)


def register(app: typer.Typer) -> None:
    app.command("listen")(listen)
