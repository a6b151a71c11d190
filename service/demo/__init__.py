"""``durapay demo``: the whole system on one machine, every flow kind, and a table of what happened.

Modules: ``stack`` (the running parts), ``clock`` (the clock shared with the worker processes),
``merchant`` (an API client playing the merchant's backend), ``runner`` (one flow: start, act, wait,
check, report), ``payments`` and ``scenarios`` (what runs, phase by phase), ``report`` (progress
lines, the closing table, where to look next).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console

from durapay.config import Settings
from durapay.service.demo.merchant import Merchant
from durapay.service.demo.report import Places, Row, cli_command, next_steps, summary_table
from durapay.service.demo.scenarios import Scenarios
from durapay.service.demo.stack import API_PORT, SIMULATOR_PORT, DemoStack
from durapay.workflows.flows import REGISTRY

__all__ = ["run_demo"]


def _run_id() -> str:
    """Short and unique per run: order ids must stay within the gateway's 18 characters
    (``DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH``), derived ones (``-2``) included."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    value, text = int(time.time() * 10), ""
    while value:
        value, rest = divmod(value, 36)
        text = digits[rest] + text
    return "d" + text[-7:]


def _coverage(rows: list[Row]) -> list[Row]:
    """A failing row for every flow kind the demo did not run (a new kind must join the demo)."""
    ran = {row.kind for row in rows}
    return [Row(f"{kind} (not in the demo)", kind, "-", [], "missing", "succeeded", 0.0) for kind in sorted(set(REGISTRY) - ran)]


def run_demo(
    settings: Settings,
    console: Console,
    *,
    keep: bool = False,
    stop: threading.Event | None = None,
    api_port: int = API_PORT,
    simulator_port: int = SIMULATOR_PORT,
    report: Callable[[list[Row]], None] | None = None,
) -> int:
    """Run everything; 0 when every flow ended as expected. With ``keep``, serve until ``stop`` is set
    (or Ctrl-C) before stopping the parts. ``report`` also gets the rows (``durapay demo --json``)."""
    run_id = _run_id()
    stack = DemoStack(settings, run_id, api_port=api_port, simulator_port=simulator_port)
    began = time.monotonic()
    console.print(f"[bold]durapay demo[/bold] (run {run_id})")
    try:
        stack.start(lambda text: console.print(f"  {text}", highlight=False))
        assert stack.api is not None and stack.simulator is not None and stack.runtime is not None
        merchant = Merchant(stack.api.url, stack.api_key)
        try:
            plan = Scenarios(stack, merchant, console, run_id)
            contract = plan.cards()
            plan.pages()
            plan.reservations()
            plan.crash()
            plan.schedule(contract)
            rows = plan.rows + _coverage(plan.rows)
        finally:
            merchant.close()
        console.print()
        console.print(summary_table(rows))
        failed = [row for row in rows if not row.ok]
        console.print(f"{len(rows) - len(failed)} of {len(rows)} flows as expected in {time.monotonic() - began:.1f}s")
        if report is not None:
            report(rows)
        places = Places(
            api_url=stack.api.url,
            api_key=stack.api_key,
            simulator_url=stack.simulator.root_url,
            redis_url=stack.runtime.redis_url,
            data_dir=str(stack.data_dir),
            log_dir=str(stack.log_dir),
            cli=cli_command(),
        )
        console.print(next_steps(places, keep=keep), highlight=False)
        if keep:
            _serve(stop)
        return 0 if not failed else 1
    finally:
        with console.status("stopping"):
            stack.stop()


def _serve(stop: threading.Event | None) -> None:
    waiting = stop or threading.Event()
    try:
        while not waiting.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
