"""How the demo runs one flow and reports it: the base of the demo's scenarios.

:class:`Runner` starts a flow through the control API (as a merchant's backend would), lets a callback
act while it runs (answer a 3DS challenge, kill a worker, move the clock), waits for its end, checks
what it should have done and adds a :class:`~service.demo.report.Row`. A step of the demo that goes
wrong becomes a failing row, never an exception that ends the demo.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from durapay.service.demo.merchant import DemoError, Merchant
from durapay.service.demo.report import Row, print_row
from durapay.service.demo.stack import DemoStack

APPROVE = "4349940199004549"  # published approving VISA, frictionless
CHALLENGE = "5186151650005008"  # published approving MC, 3DS challenge
DAY = 86400.0

Check = Callable[[dict[str, Any]], str]


def card(pan: str = APPROVE) -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def session(amount: int) -> dict[str, Any]:
    return {"actionType": "PAY", "amount": str(amount), "language": "eng", "resultUrl": "https://shop.example/done"}


def operation_id(view: dict[str, Any] | None) -> str | None:
    if not view or view["state"] != "succeeded":
        return None
    value = ((view.get("outcome") or {}).get("operation") or {}).get("operationId")
    return str(value) if value else None


class Runner:
    def __init__(self, stack: DemoStack, merchant: Merchant, console: Console, run_id: str) -> None:
        self.stack = stack
        self.merchant = merchant
        self.console = console
        self.run_id = run_id
        self.rows: list[Row] = []
        self._ids = itertools.count(1)

    @property
    def admin(self) -> Any:
        assert self.stack.simulator is not None
        return self.stack.simulator.admin

    def order(self, amount: int = 1500) -> dict[str, Any]:
        return {"orderId": f"{self.run_id}-{next(self._ids):02d}", "amount": str(amount), "currency": "EUR"}

    # -- running one flow -------------------------------------------------------------------------------

    def flow(
        self,
        name: str,
        kind: str,
        body: dict[str, Any],
        *,
        expect: str = "succeeded",
        note: str = "",
        during: Callable[[dict[str, Any]], None] | None = None,
        check: Check | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any] | None:
        """Start ``kind``, let ``during`` act while it runs, wait for its end; add and print its row."""
        began = time.monotonic()
        flow_id = "-"
        try:
            with self.console.status(f"{name} ({kind})"):
                started = self.merchant.start(kind, body)
                flow_id = started["id"]
                if during is not None:
                    during(started)
                final = self.merchant.wait(flow_id, timeout=timeout)
                problem = check(final) if check is not None and final["state"] == expect else ""
        except DemoError as exc:
            self.add(Row(name, kind, flow_id, [], "error", expect, time.monotonic() - began, problem=str(exc)))
            return None
        steps = list(final.get("steps_done") or [])
        self.add(Row(name, kind, flow_id, steps, final["state"], expect, time.monotonic() - began, note, problem))
        return final

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print_row(self.console, row)

    def skip(self, name: str, kind: str, why: str) -> None:
        self.add(Row(name, kind, "-", [], "skipped", "succeeded", 0.0, problem=why))

    def phase(self, title: str) -> None:
        self.console.print(f"\n[bold]{title}[/bold]")

    def _by_notification(self, final: dict[str, Any]) -> str:
        if any(entry.get("by") == "notification" for entry in self.merchant.history(final["id"])):
            return ""
        return "not resumed by a notification"

    def _cancel_row(self, name: str, started: dict[str, Any], reason: str) -> None:
        began = time.monotonic()
        try:
            final = self.merchant.cancel(started["id"], reason)
            if final.get("cancel_requested"):  # 202: it first closes what the customer could pay on, then reads
                final = self.merchant.wait(started["id"], timeout=15)
        except DemoError as exc:
            self.add(Row(name, started["kind"], started["id"], [], "error", "cancelled", 0.0, problem=str(exc)))
            return
        steps = list(final.get("steps_done") or [])
        self.add(
            Row(
                name,
                started["kind"],
                started["id"],
                steps,
                final["state"],
                "cancelled",
                time.monotonic() - began,
                "cancelled over the API (its page or form closed at the gateway first)",
            )
        )

    def advance(self, seconds: float) -> None:
        """Move the engine's shared clock and the simulator's clock forward together."""
        assert self.stack.clock is not None
        self.stack.clock.advance(seconds)
        self.admin.advance_clock(seconds)
        time.sleep(0.2)  # every process re-reads the shared offset within 50 ms
