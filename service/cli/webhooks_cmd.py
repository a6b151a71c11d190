"""``durapay webhooks add|ls|rm|rotate|enable|test|attempts`` and ``durapay events ls|replay``.

The commands talk to Redis through ``workflows.webhooks`` (the same calls as ``/webhooks`` and
``/events``); the ``durapay scheduler`` and ``durapay worker`` processes deliver. ``add --json`` (and
``rotate --json``) print the endpoint *with its secret*: the only time it is shown. Errors as every
command's: one line on stderr (JSON with ``--json``), exit 2; ``test`` exits 1 when the endpoint did
not answer 2xx.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

import typer

from durapay.service.cli._common import BadOption, ExitCode, Output, interrupt_on_sigterm, runtime
from durapay.service.cli._output import echo_json, print_record, print_rows, when
from durapay.workflows.engine import EVENT_TYPES, Cursor, NotFound
from durapay.workflows.webhooks import Endpoint, EndpointError, Webhooks, check_types

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")]
Id = Annotated[str, typer.Argument(help="Endpoint id (we_...).")]
Types = Annotated[str | None, typer.Option("--events", help=f"Comma-separated types (default: all): {', '.join(EVENT_TYPES)}.")]

#: How long ``events ls --follow`` leaves the feed between two reads while nothing comes (seconds).
FOLLOW_POLL_SECONDS = 0.25

webhooks_app = typer.Typer(help="Webhook endpoints: add, list, remove, rotate the secret, test, attempts.", no_args_is_help=True)
events_app = typer.Typer(help="Merchant events: read the feed, replay a range to the endpoints.", no_args_is_help=True)


@contextlib.contextmanager
def _webhooks(out: Output) -> Iterator[Webhooks]:
    with runtime(out) as rt, out.errors():
        try:
            yield rt.webhooks
        except EndpointError as exc:
            out.fail("invalid_input", exc.reason, field=exc.field)


def parse_types(text: str | None, option: str = "--events") -> list[str]:
    try:
        return check_types([part.strip() for part in (text or "").split(",") if part.strip()])
    except EndpointError as exc:
        raise BadOption(option, exc.reason) from None


def _found(endpoint: Endpoint | None, endpoint_id: str) -> Endpoint:
    if endpoint is None:
        raise NotFound(f"no webhook endpoint {endpoint_id!r}")
    return endpoint


def _print(endpoint: Endpoint, *, with_secret: bool = False) -> None:
    view = endpoint.view(with_secret=with_secret)
    fields = [("id", endpoint.id), ("url", endpoint.url), ("events", ", ".join(endpoint.events) or "all")]
    fields += [("enabled", "yes" if endpoint.enabled else f"no: {endpoint.disabled_reason}"), ("created", when(endpoint.created))]
    if endpoint.description:
        fields.append(("description", endpoint.description))
    if view["rotating"]:
        fields.append(("previous secret valid until", when(endpoint.previous_until)))
    if with_secret:
        fields.append(("secret", endpoint.secret))
    print_record(f"webhook endpoint {endpoint.id}", fields)


@webhooks_app.command("add")
def add(
    url: Annotated[str, typer.Argument(help="https:// URL the events are POSTed to.")],
    events: Types = None,
    description: Annotated[str, typer.Option("--description", help="A note for people.")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Add an endpoint; prints it with its secret (whsec_...), shown this once."""
    out = Output(as_json)
    with _webhooks(out) as webhooks:
        endpoint = webhooks.endpoints.add(url, parse_types(events), description=description, source="cli")
    if as_json:
        echo_json(endpoint.view(with_secret=True))
    else:
        _print(endpoint, with_secret=True)


@webhooks_app.command("ls")
def list_endpoints(as_json: JsonFlag = False) -> None:
    """List the endpoints (piped: one tab-separated line each)."""
    with _webhooks(Output(as_json)) as webhooks:
        endpoints = webhooks.endpoints.all()
        pending = webhooks.pending()
    if as_json:
        echo_json({"endpoints": [endpoint.view() for endpoint in endpoints], "pending": pending})
        return
    rows = [
        [e.id, e.url, ", ".join(e.events) or "all", "yes" if e.enabled else f"no: {e.disabled_reason}", e.source]
        for e in endpoints
    ]
    print_rows(
        f"webhook endpoints ({len(endpoints)}; {pending} deliveries pending)",
        ("id", "url", "events", "enabled", "source"),
        rows,
        ids=frozenset({"id", "url"}),
    )


@webhooks_app.command("rm")
def remove(endpoint_id: Id, as_json: JsonFlag = False) -> None:
    """Remove an endpoint (its pending deliveries are dropped)."""
    with _webhooks(Output(as_json)) as webhooks:
        endpoint = _found(webhooks.endpoints.get(endpoint_id), endpoint_id)
        webhooks.endpoints.remove(endpoint_id)
    if as_json:
        echo_json({**endpoint.view(), "removed": True})
    else:
        typer.echo(f"removed {endpoint_id}")


@webhooks_app.command("rotate")
def rotate(endpoint_id: Id, as_json: JsonFlag = False) -> None:
    """A new secret (printed); the old one stays valid for DURAPAY_WEBHOOKS__ROTATION_HOURS."""
    with _webhooks(Output(as_json)) as webhooks:
        endpoint = _found(webhooks.endpoints.rotate(endpoint_id), endpoint_id)
    if as_json:
        echo_json(endpoint.view(with_secret=True))
    else:
        _print(endpoint, with_secret=True)


@webhooks_app.command("enable")
def enable(endpoint_id: Id, as_json: JsonFlag = False) -> None:
    """Enable a disabled endpoint again (after a 410 or days of failures)."""
    with _webhooks(Output(as_json)) as webhooks:
        endpoint = _found(webhooks.endpoints.enable(endpoint_id), endpoint_id)
    if as_json:
        echo_json(endpoint.view())
    else:
        _print(endpoint)


@webhooks_app.command("test")
def test(endpoint_id: Id, as_json: JsonFlag = False) -> None:
    """Send a webhook.test event now; exits 1 when the endpoint does not answer 2xx."""
    with _webhooks(Output(as_json)) as webhooks:
        attempt = webhooks.test(endpoint_id)
        if attempt is None:
            raise NotFound(f"no webhook endpoint {endpoint_id!r}")
    if as_json:
        echo_json(attempt)
    else:
        print_record(f"test of {endpoint_id}", [(name, str(value)) for name, value in attempt.items()])
    if not attempt["ok"]:
        raise typer.Exit(ExitCode.FAILED)


@webhooks_app.command("deliver")
def deliver_now(
    endpoint_id: Annotated[str | None, typer.Argument(help="Only this endpoint's deliveries (default: every endpoint).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Deliver what is pending now, instead of at its next retry (after a receiver's outage, say);
    the scheduler sends it within its next tick."""
    with _webhooks(Output(as_json)) as webhooks:
        if endpoint_id is not None:
            _found(webhooks.endpoints.get(endpoint_id), endpoint_id)
        moved = webhooks.deliver_now(endpoint_id)
    if as_json:
        echo_json({"due_now": moved})
    else:
        typer.echo(f"{moved} pending deliveries due now")


@webhooks_app.command("attempts")
def attempts(
    endpoint_id: Id, limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50, as_json: JsonFlag = False
) -> None:
    """The endpoint's latest delivery attempts, newest first."""
    with _webhooks(Output(as_json)) as webhooks:
        _found(webhooks.endpoints.get(endpoint_id), endpoint_id)
        found = webhooks.attempts(endpoint_id, limit=limit)
    if as_json:
        echo_json(found)
        return
    rows = [
        [
            when(a["at"]),
            a["event"],
            str(a.get("status") or "-"),
            str(a.get("latencyMs", "-")),
            a.get("outcome", ""),
            when(a.get("nextAttempt")) or "-",
            a.get("error") or (a.get("response") or "")[:80],
        ]
        for a in found
    ]
    columns = ("at", "event", "status", "ms", "outcome", "next attempt", "answer")
    print_rows(
        f"attempts ({len(found)}; durapay webhooks deliver: the pending ones now)", columns, rows, ids=frozenset({"event"})
    )


def _cursor(after: str | None) -> Cursor:
    """``--after`` as a cursor, or the option's error naming what is wrong."""
    try:
        return Cursor.parse(after)
    except ValueError as exc:
        raise BadOption("--after", str(exc)) from None


@events_app.command("ls")
def list_events(
    after: Annotated[str | None, typer.Option("--after", help="A cursor (a page's next): the events after it.")] = None,
    types: Annotated[str | None, typer.Option("--types", help="Comma-separated event types.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 100,
    follow: Annotated[
        bool, typer.Option("--follow", help="Then print each new event as it comes (from now, or --after), until Ctrl-C.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Events after a cursor, in order per partition; prints the cursor to resume from. With --follow,
    every event from now on (or after --after) as it comes, one line each (a JSON line with --json)."""
    out = Output(as_json)
    if follow:
        _follow(out, after, types)
        return
    with _webhooks(out) as webhooks:
        cursor = _cursor(after)
        page, following = webhooks.feed.read(cursor, types=parse_types(types, "--types") or None, limit=limit)
    if as_json:
        echo_json({"events": [event.wire() for event in page], "next": following.text() or None})
        return
    rows = [[when(e.wire()["timestamp"]), e.id, e.type, str(e.body.get("flow") or e.body.get("schedule") or "")] for e in page]
    print_rows(
        f"events ({len(page)}); next: {following.text() or '-'}",
        ("time", "id", "type", "flow/schedule"),
        rows,
        ids=frozenset({"id"}),
    )


def _follow(out: Output, after: str | None, types: str | None) -> None:
    """``events ls --follow``: each event as it comes (``tail -f`` of the feed), bounded by Ctrl-C only;
    the cursor after the last one printed is said on stderr when it stops, to resume from."""
    interrupt_on_sigterm()
    with _webhooks(out) as webhooks:
        wanted = parse_types(types, "--types") or None
        start = _cursor(after) if after else webhooks.feed.end()
        cursor = start
        typer.echo(f"following events after {start.text() or 'the start'} (Ctrl-C stops)", err=True)
        try:
            for event, cursor in webhooks.feed.follow(start, types=wanted, poll=FOLLOW_POLL_SECONDS):
                wire = event.wire()
                if out.json:
                    typer.echo(json.dumps({**wire, "next": cursor.text()}))
                else:
                    subject = str(event.body.get("flow") or event.body.get("schedule") or "")
                    typer.echo("\t".join([when(wire["timestamp"]), event.id, event.type, subject]))
        except KeyboardInterrupt:
            pass
    typer.echo(f"next: {cursor.text()}", err=True)


@events_app.command("replay")
def replay(
    after: Annotated[
        str | None, typer.Option("--after", help="A cursor: replay the events after it (default: all kept).")
    ] = None,
    until: Annotated[str | None, typer.Option("--until", help="ISO 8601 time: replay up to it (default: now).")] = None,
    endpoint: Annotated[str | None, typer.Option("--endpoint", help="Only to this endpoint (we_...).")] = None,
    types: Annotated[str | None, typer.Option("--types", help="Comma-separated event types.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Send a range of events again to the endpoints that want them (same event ids: receivers dedupe)."""
    out = Output(as_json)
    with _webhooks(out) as webhooks:
        cursor = _cursor(after)
        moment: float | None = None
        if until is not None:
            try:
                moment = datetime.fromisoformat(until.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise BadOption("--until", f"{until!r} is not an ISO 8601 time (like 2026-11-23T05:00:00Z)") from None
        if endpoint is not None:
            _found(webhooks.endpoints.get(endpoint), endpoint)
        count = webhooks.replay(cursor, until=moment, endpoint_id=endpoint, types=parse_types(types, "--types") or None)
    result: dict[str, Any] = {"scheduled": count}
    if as_json:
        echo_json(result)
    else:
        typer.echo(f"{count} deliveries scheduled")


def register(app: typer.Typer) -> None:
    app.add_typer(webhooks_app, name="webhooks")
    app.add_typer(events_app, name="events")
