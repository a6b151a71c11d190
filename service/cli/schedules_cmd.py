"""``durapay schedules add|ls|show|pause|resume|cancel|amount|resolve``: recurring MIT charges from the
terminal (``resolve``: what the gateway shows for an occurrence whose flow is gone).

The commands talk to Redis through ``workflows.schedules.Schedules`` (the same calls as the Python API);
the ``durapay scheduler`` processes fire what they create. Read commands print a table on a terminal
(tab-separated lines when piped), or JSON with ``--json``. A refused input or action prints one error on
stderr (JSON with ``--json``) and exits with 2.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from durapay.gateway import GatewayClient, format_money
from durapay.service.cli._common import Output, runtime
from durapay.service.cli._output import echo_json, print_record, print_rows, when
from durapay.service.views import rule_text
from durapay.workflows.engine import gateway_settings
from durapay.workflows.moments import time_of_day
from durapay.workflows.schedules import ScheduleInput, ScheduleRecord, Schedules
from durapay.workflows.schedules.contracts import ContractUnchecked, check_contract

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")]
Id = Annotated[str, typer.Argument(help="Schedule id (s + 12 hex digits).")]

schedules_app = typer.Typer(
    help="Recurring merchant-initiated charges: add, list, show, pause, resume, cancel, change the amount, resolve.",
    no_args_is_help=True,
)


@contextlib.contextmanager
def _schedules(out: Output) -> Iterator[Schedules]:
    """Schedules on the runtime built from the ``DURAPAY_*`` settings; operator errors as one error."""
    with runtime(out) as rt, out.errors():
        try:
            yield Schedules(rt.engine)
        except ContractUnchecked as exc:
            out.fail("unavailable", str(exc))


def _print(record: ScheduleRecord, history: list[dict[str, Any]] | None = None) -> None:
    summary = record.summary()
    fields: list[tuple[str, str]] = [("id", record.id)]
    fields.append(("amount", format_money(summary["amount"], summary["currency"])))
    fields.append(("rule", rule_text(summary["rule"])))
    for name in (
        "state",
        "contractId",
        "description",
        "timezone",
        "start",
        "end",
        "count",
        "missed",
    ):
        if summary.get(name) is not None:
            fields.append((name, json.dumps(summary[name]) if isinstance(summary[name], dict) else str(summary[name])))
    fields.append(("dunning (days)", ", ".join(str(days) for days in summary["dunning"]) or "none"))
    fields.append(("next run", when(summary["nextRun"], summary["timezone"]) or "-"))
    if summary["nextRun"] and not summary["rule"].get("cron"):  # a cron expression says its own time
        fields.append(("charges at", f"{time_of_day(summary['nextRun'], summary['timezone'])}, each time"))
    fields.append(("counts", ", ".join(f"{name} {value}" for name, value in summary["counts"].items())))
    zone = summary["timezone"]
    fields.append(
        ("open", ", ".join(f"{a['occurrence']}#{a['attempt']} due {when(a['due'], zone)}" for a in summary["open"]) or "-")
    )
    if summary["last"]:
        fields.append(("last", json.dumps(summary["last"])))
    if summary["reason"]:
        fields.append(("reason", summary["reason"]))
    print_record(f"schedule {record.id}", fields)
    if history:
        rows = [
            [
                when(event["t"]),
                event["event"],
                json.dumps({k: v for k, v in event.items() if k not in ("t", "event")}),
            ]
            for event in history
        ]
        print_rows("history", ("time", "event", "details"), rows, ids=frozenset(), piped_prefix="history")


@schedules_app.command("add")
def add(
    contract: Annotated[str, typer.Option("--contract", help="contractId of an MIT contract.")],
    amount: Annotated[int, typer.Option("--amount", help="Minor units (1500 = 15.00 EUR).")],
    description: Annotated[str, typer.Option("--description", help="Order description.")],
    currency: Annotated[str, typer.Option("--currency")] = "EUR",
    every: Annotated[str | None, typer.Option("--every", help="days | month | week")] = None,
    interval: Annotated[int, typer.Option("--interval", help="With --every days: every N days.")] = 1,
    day: Annotated[int | None, typer.Option("--day", help="With --every month: day of month (clamps to month end).")] = None,
    weekday: Annotated[str | None, typer.Option("--weekday", help="With --every week: monday ... sunday.")] = None,
    cron: Annotated[str | None, typer.Option("--cron", help='A cron expression instead of --every, e.g. "0 9 * * 1-5".')] = None,
    timezone: Annotated[str, typer.Option("--timezone", help="IANA time zone.")] = "UTC",
    start: Annotated[str | None, typer.Option("--start", help="ISO date or datetime (default: now).")] = None,
    end: Annotated[str | None, typer.Option("--end", help="ISO date (inclusive) or datetime.")] = None,
    count: Annotated[int | None, typer.Option("--count", help="Number of occurrences.")] = None,
    missed: Annotated[str, typer.Option("--missed", help="After downtime: once | each | skip.")] = "once",
    dunning: Annotated[str, typer.Option("--dunning", help="Retry a soft decline after these days (comma separated).")] = "1,3,7",
    customer: Annotated[str | None, typer.Option("--customer", help="customerId.")] = None,
    capture_type: Annotated[str | None, typer.Option("--capture-type", help="IMPLICIT | EXPLICIT")] = None,
    terminal: Annotated[
        str | None, typer.Option("--terminal", help="The gateway terminal its charges run on (DURAPAY_TERMINALS).")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="Create key: the same key and input give the same schedule.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a schedule."""
    out = Output(as_json)
    rule: dict[str, Any]
    if cron is not None:
        rule = {"cron": cron}
    elif every == "days":
        rule = {"every": "days", "interval": interval}
    elif every == "month":
        rule = {"every": "month", "day": day}
    elif every == "week":
        rule = {"every": "week", "weekday": weekday}
    else:
        out.fail(
            "invalid_input",
            "give --every days|month|week (with --interval, --day or --weekday) or --cron",
            field="rule",
            human="schedule: rule: give --every days|month|week (with --interval, --day or --weekday) or --cron",
        )
    try:
        delays = [int(part) for part in dunning.split(",") if part.strip()]
    except ValueError:
        out.fail(
            "invalid_input",
            f"{dunning!r} is not a comma-separated list of days",
            field="dunning",
            human=f"schedule: dunning: {dunning!r} is not a comma-separated list of days",
        )
    data: dict[str, Any] = {
        "contractId": contract,
        "amount": amount,
        "currency": currency,
        "description": description,
        "rule": rule,
        "timezone": timezone,
        "start": start or datetime.now(UTC).isoformat(timespec="seconds"),
        "missed": missed,
        "dunning": delays,
    }
    extras = {"end": end, "count": count, "customerId": customer, "captureType": capture_type, "terminal": terminal}
    data |= {name: value for name, value in extras.items() if value is not None}
    notes: list[str] = []

    def contract_known(spec: ScheduleInput) -> None:
        """The contract looked up at the gateway before anything is written (schedules.contracts)."""
        # With the key of the schedule's terminal: the contract is that terminal's (another's key would not find it).
        with GatewayClient(gateway_settings(schedules.engine.settings, spec.terminal or "default")) as client:
            note = check_contract(client, spec)
        if note:
            notes.append(note)

    with _schedules(out) as schedules:
        record = schedules.create(data, key=key, check=contract_known)
    for note in notes if not as_json else []:
        typer.echo(f"note: {note}", err=True)
    if as_json:
        echo_json(record.summary())
        return
    _print(record)
    summary = record.summary()
    if start is None and cron is None and summary["nextRun"]:
        # The time of day comes from --start, now by default: say it, a schedule added at 14:23 charges at 14:23.
        typer.echo(
            f"no --start: it charges at {time_of_day(summary['nextRun'], timezone)}, the time of day it was added; "
            "for another, add it with --start (e.g. --start 2027-01-31T09:00)",
            err=True,
        )


@schedules_app.command("ls")
def list_schedules(
    state: Annotated[
        str | None, typer.Option("--state", help="active, dunning, paused, needs_attention, completed, cancelled")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
    as_json: JsonFlag = False,
) -> None:
    """List schedules, newest first (piped: one tab-separated line per schedule, no header)."""
    with _schedules(Output(as_json)) as schedules:
        records = schedules.list(state=state, limit=limit, offset=offset)
    if as_json:
        echo_json([record.summary() for record in records])
        return
    rows = []
    for record in records:
        summary = record.summary()
        rows.append(
            [
                record.id,
                summary["state"],
                summary["contractId"],
                format_money(summary["amount"], summary["currency"]),
                rule_text(summary["rule"]),
                when(summary["nextRun"], summary["timezone"]) or "-",
                str(summary["counts"]["charged"]),
                str(summary["counts"]["declined"]),
            ]
        )
    columns = ("id", "state", "contract", "amount", "rule", "next run", "charged", "declined")
    print_rows(f"schedules ({len(records)})", columns, rows, ids=frozenset({"id", "state", "contract"}))


@schedules_app.command("show")
def show(
    schedule_id: Id,
    history: Annotated[bool, typer.Option("--history", help="Also print every event.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """One schedule: rule, next run, counts, open attempts, last outcome (and its history)."""
    with _schedules(Output(as_json)) as schedules:
        record = schedules.get(schedule_id)
        events = schedules.history(schedule_id) if history else None
    if as_json:
        echo_json({**record.summary(), **({"history": events} if events is not None else {})})
    else:
        _print(record, events)


def _act(name: str, schedule_id: str, as_json: bool, **kwargs: Any) -> None:
    with _schedules(Output(as_json)) as schedules:
        record = getattr(schedules, name)(schedule_id, by="cli", **kwargs)
    if as_json:
        echo_json(record.summary())
    else:
        typer.echo(f"schedule {record.id}: {record.state.value}")


@schedules_app.command("pause")
def pause(schedule_id: Id, as_json: JsonFlag = False) -> None:
    """Fire nothing until resumed."""
    _act("pause", schedule_id, as_json)


@schedules_app.command("resume")
def resume(schedule_id: Id, as_json: JsonFlag = False) -> None:
    """Go on from now (a paused or needs_attention schedule); occurrences passed meanwhile are skipped.
    Refused while an occurrence's flow is gone: resolve it first."""
    _act("resume", schedule_id, as_json)


@schedules_app.command("resolve")
def resolve(
    schedule_id: Id,
    occurrence: Annotated[str, typer.Argument(help="The occurrence, as listed (open, history): 2026-01-31T08:00:00Z.")],
    outcome: Annotated[str, typer.Argument(help="What the gateway shows for it: charged | not_charged.")],
    operation_id: Annotated[
        str | None, typer.Option("--operation-id", help="The gateway operation found (with charged: the one that charged).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Say what the gateway shows for an occurrence whose flow is gone (needs_attention): charged counts
    it as a charge; not_charged closes it without one. Either way it is never fired again; then resume."""
    with _schedules(Output(as_json)) as schedules:
        record = schedules.resolve(schedule_id, occurrence, outcome, operation_id=operation_id, by="cli")
        left = [attempt.occurrence for attempt in schedules.gone(record.id)]
    if as_json:
        echo_json(record.summary())
        return
    closed = "counted as a charge" if outcome == "charged" else "closed without a charge"
    typer.echo(
        f"schedule {record.id}: {record.state.value}; occurrence {occurrence} {closed}, never fired again "
        "(an occurrence is never charged twice)"
    )
    if left:
        typer.echo(f"still to resolve before it can resume: {', '.join(left)}")
    else:
        typer.echo(f"resume it to go on: durapay schedules resume {record.id}")


@schedules_app.command("cancel")
def cancel(
    schedule_id: Id,
    reason: Annotated[str, typer.Option("--reason")] = "cancelled by operator",
    as_json: JsonFlag = False,
) -> None:
    """Stop for good (charges already in flight finish)."""
    _act("cancel", schedule_id, as_json, reason=reason)


@schedules_app.command("amount")
def change_amount(
    schedule_id: Id, amount: Annotated[int, typer.Argument(help="New amount in minor units.")], as_json: JsonFlag = False
) -> None:
    """Charge a new amount from the next occurrence on."""
    _act("change_amount", schedule_id, as_json, amount=amount)


def register(app: typer.Typer) -> None:
    app.add_typer(schedules_app, name="schedules")
