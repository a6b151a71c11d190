"""How the commands print results: tables on a terminal, plain lines when piped, JSON with ``--json``.

Conventions of ``gh`` and ``kubectl``:

* On a terminal a list is aligned columns under a header; id columns are never cut nor wrapped, and
  neither is a money column (``amount``: its amount and its currency, what a person decides by); other
  columns are shortened with an ellipsis when the terminal is too narrow, descriptions first (``cut``),
  and a column that would say nothing once cut (a time) is left out, said in the title; piped, it is one
  line per row, fields separated by a tab, no header, nothing cut, so that
  ``durapay flows ls --state failed | cut -f1`` gives ids to paste.
* A record (``flows show``) is ``field  value`` lines on a terminal, ``field<TAB>value`` lines when piped.
* ``--json`` prints JSON on stdout and nothing else there; errors then go to stderr as JSON too
  (``service.cli._common.Output``).
* An error dict of a flow is shown as one readable line (:func:`describe_error`), never as a Python dict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import typer
from rich.console import Console

from durapay.workflows.moments import moment_text

#: The width of a console that is not a terminal: wide enough that a table or a line is never wrapped
#: (piped into a file or ``less``, Rich's default of 80 columns broke the demo's table and commands).
PIPED_WIDTH = 400


def console(*, stderr: bool = False) -> Console:
    """Rich's console on a terminal; piped, one that does not wrap what it prints."""
    screen = Console(stderr=stderr)
    return screen if screen.is_terminal else Console(stderr=stderr, width=PIPED_WIDTH, soft_wrap=True)


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def when(moment: Any, zone: str | None = None) -> str:
    """A moment as every surface writes it (``workflows.moments``: ISO 8601 with its offset, UTC unless
    ``zone``, then named); ``""`` for none."""
    return moment_text(moment, zone)


#: Columns never cut, in every table: the money at stake, amount and currency (``1,234…`` hid both).
MONEY = frozenset({"amount"})


def print_rows(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    ids: frozenset[str],
    piped_prefix: str = "",
    cut: Sequence[str] = (),
    drop: Sequence[str] = (),
) -> None:
    """A list: aligned columns under a header on a terminal, tab-separated lines when piped (each
    starting with ``piped_prefix`` and a tab when given: a list printed after a record).

    On a terminal too narrow for every column, the columns not named in ``ids`` (nor :data:`MONEY`) are
    shortened (an ellipsis marks it), those in ``cut`` first in its order, then the others widest first,
    never below their header; ``ids`` and money columns are never cut. If that is not enough, the
    columns in ``drop`` (a time: ``2026-1…`` says nothing) are left out, in that order, and the title
    says so; past that the lines are longer than the terminal: it wraps them, nothing is lost.
    """
    out = console()
    if not out.is_terminal:
        for row in rows:
            typer.echo("\t".join([piped_prefix] * bool(piped_prefix) + [_plain(cell) for cell in row]))
        return
    table = [list(columns), *([_plain(cell) for cell in row] for row in rows)]
    keep = ids | MONEY | frozenset(drop)
    shown = list(range(len(columns)))
    left_out: list[str] = []
    while True:
        names = [columns[i] for i in shown]
        natural = [max(len(line[i]) for line in table) for i in shown]
        widths = _fit(natural, names, keep, cut, out.width)
        dropped = next((name for name in drop if name in names), None)
        if _total(widths) <= out.width or dropped is None:
            break
        shown.remove(columns.index(dropped))
        left_out.append(dropped)
    note = f" ({', '.join(left_out)} not shown: narrow terminal)" if left_out else ""
    out.print(f"{title}{note}", style="italic", highlight=False)
    for number, line in enumerate(table):
        cells = [line[i] for i in shown]
        text = _GAP.join(_cut(cell, width).ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        out.print(text, style="bold" if number == 0 else None, highlight=False, markup=False, soft_wrap=True)


def print_record(title: str, fields: Sequence[tuple[str, str]]) -> None:
    """One record: ``field  value`` lines under a title on a terminal (values whole, never cut),
    ``field<TAB>value`` lines when piped."""
    out = console()
    if not out.is_terminal:
        for name, value in fields:
            typer.echo(f"{name}\t{_plain(value)}")
        return
    out.print(title, style="italic", highlight=False)
    width = max((len(name) for name, _ in fields), default=0)
    for name, value in fields:
        out.print(f"{name.ljust(width)}{_GAP}{_plain(value)}", highlight=False, markup=False, soft_wrap=True)


_GAP = "  "


def _total(widths: Sequence[int]) -> int:
    return sum(widths) + len(_GAP) * (len(widths) - 1)


def _fit(widths: list[int], columns: Sequence[str], keep: frozenset[str], first: Sequence[str], room: int) -> list[int]:
    """Column widths within ``room``: shorten the columns in ``first`` in that order, then the widest
    column not in ``keep``, one character at a time, none below its floor."""
    fitted = list(widths)
    floors = [len(name) if name in keep else max(len(name), 4) for name in columns]
    groups = [[columns.index(name)] for name in first if name in columns and name not in keep]
    groups.append([i for i, name in enumerate(columns) if name not in keep and name not in first])
    for group in groups:
        while _total(fitted) > room:
            shrinkable = [i for i in group if fitted[i] > floors[i]]
            if not shrinkable:
                break
            fitted[max(shrinkable, key=lambda i: fitted[i])] -= 1
    return fitted


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "…"


def _plain(value: str) -> str:
    """A cell on one line: tabs and newlines would break the columns of piped output."""
    return " ".join(value.split()) if any(ch in value for ch in "\t\n\r") else value


def describe_error(error: Mapping[str, Any] | None) -> str:
    """A flow's error as one line: ``PaymentDeclined: operation 8000 ended DECLINED; response code 116
    (insufficient funds, soft decline)``; ``BadRequest: ...; PS0026 Invalid orderId``."""
    if not error:
        return ""
    kind = str(error.get("type") or "error")
    message = str(error.get("message") or "")
    # Each fact once: a gateway error's message already says its operation, status and reason phrase
    # (``get_order: HTTP 401: Unauthorized``), so neither the type nor those fields are said again.
    parts = [message if kind in message.split(": ") else f"{kind}: {message}" if message else kind]
    gateway_errors = [item for item in error.get("errors") or [] if isinstance(item, Mapping)]
    if gateway_errors:
        parts.append(", ".join(f"{item.get('code') or ''} {item.get('description') or ''}".strip() for item in gateway_errors))
    if error.get("responseCode"):
        detail = ", ".join(str(text) for text in (error.get("responseText"), _decline(error.get("decline"))) if text)
        parts.append(f"response code {error['responseCode']}" + (f" ({detail})" if detail else ""))
    shown = {"type", "message", "errors", "responseCode", "responseText", "decline", "calls", "retryable", "ambiguous"}
    extras = [
        f"{name} {value}"
        for name, value in error.items()
        if name not in shown and _scalar(value) and not _said_in(value, message)
    ]
    if isinstance(error.get("operation"), Mapping):  # a late payment names the operation the gateway reported
        operation = error["operation"]
        extras.append(f"operation {operation.get('operationId')} {operation.get('operationResult') or ''}".strip())
    parts.extend(extras)
    return "; ".join(parts)


def _decline(kind: Any) -> str:
    return f"{kind} decline" if kind else ""


def _said_in(value: Any, message: str) -> bool:
    """``value`` stands in ``message`` as a word of its own (``401`` in ``HTTP 401:``, not in ``4010``)."""
    return re.search(rf"(?<![\w.-]){re.escape(str(value))}(?![\w.-])", message) is not None


def _scalar(value: Any) -> bool:
    return value not in (None, "", [], {}) and isinstance(value, (str, int, float, bool))
