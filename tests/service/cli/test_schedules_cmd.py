"""``durapay schedules ls`` piped and on a terminal: schedule ids whole, one line per schedule."""

from __future__ import annotations

import json

from service.runtime import Runtime
from tests.service.cli.conftest import invoke
from tests.service.cli.test_flows_cmd import TERMINAL

ADD = ("schedules", "add", "--contract", "contract-with-a-long-name-01", "--amount", "1990", "--description", "Gym")


def test_schedule_ids_are_never_wrapped(engine_side: Runtime) -> None:
    """Piped, ``schedules ls`` wrapped its table at 80 columns and split ids over two lines."""
    created = [
        json.loads(invoke(*ADD, "--every", "month", "--day", str(day), "--timezone", "Europe/Rome", "--json").stdout)["id"]
        for day in (1, 15)
    ]
    piped = invoke("schedules", "ls")
    assert piped.exit_code == 0, piped.output
    assert sorted(line.split("\t")[0] for line in piped.stdout.splitlines()) == sorted(created)
    assert all(len(line.split("\t")) == 8 for line in piped.stdout.splitlines())
    for columns in ("80", "100"):
        table = invoke("schedules", "ls", env={**TERMINAL, "COLUMNS": columns})
        for schedule_id in created:
            [line] = [line for line in table.stdout.splitlines() if schedule_id in line]
            assert "contract-with-a-long-name-01" in line
