"""Every time the CLI prints follows one rule (``workflows.moments``, issue 41 finding 5): ISO 8601 to the
second with its offset, UTC written ``Z``, a schedule's own time zone named after the offset. Before,
``flows ls|show`` wrote times without a zone, ``webhooks attempts`` and ``events ls`` in ISO ``Z`` with
milliseconds, a schedule's next run with an unnamed ``+01:00``, and the gateway's ``operationTime`` was
not shown at all (the record kept it as the gateway wrote it, in UTC+01:00 unlabelled)."""

from __future__ import annotations

import json
import re

import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.service.runtime import Runtime
from durapay.tasks.outcomes import Advance
from durapay.workflows.engine import Claim
from tests.service.cli.conftest import invoke
from tests.service.cli.test_flows_cmd import moto
from tests.times import off_rule


def test_every_time_the_cli_prints_is_written_one_way(engine_side: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPAY_WEBHOOKS__ALLOW_PRIVATE", "true")
    engine = engine_side.engine
    record = engine.start("moto", moto("cli-times-1"))
    claim = engine.claim(record.id, record.step)
    assert isinstance(claim, Claim)
    operation = {
        "operationId": "op-times-1",
        "orderId": "cli-times-1",
        "operationType": "CAPTURE",
        "operationResult": "EXECUTED",
        "operationAmount": "1500",
        "operationCurrency": "EUR",
        "operationTime": "2026-11-23 06:00:43.974",  # the gateway's form: UTC+01:00, not said
    }
    engine.complete(claim, Advance({"operation": operation}))

    shown = invoke("flows", "show", record.id)
    assert shown.exit_code == 0, shown.output
    assert "operation\top-times-1 CAPTURE at 2026-11-23T05:00:43Z" in shown.stdout.splitlines()
    listed = invoke("flows", "ls")

    added = invoke(
        "schedules", "add", "--contract", "ctr-times", "--amount", "1990", "--description", "Gym",
        "--every", "month", "--day", "1", "--timezone", "Europe/Rome",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    said = re.search(r"no --start: it charges at (\d\d:\d\d:\d\d) Europe/Rome, the time of day it was added", added.stderr)
    assert said, added.stderr
    [schedule_id] = [line.split("\t")[1] for line in added.stdout.splitlines() if line.startswith("id\t")]
    schedule = invoke("schedules", "show", schedule_id).stdout
    [next_run] = [line.split("\t")[1] for line in schedule.splitlines() if line.startswith("next run\t")]
    assert next_run.endswith("+01:00 (Europe/Rome)") or next_run.endswith("+02:00 (Europe/Rome)"), next_run
    assert f"charges at\t{said.group(1)} Europe/Rome, each time" in schedule.splitlines()

    with WebhookReceiver() as receiver:
        endpoint = json.loads(invoke("webhooks", "add", receiver.url, "--json").stdout)
        receiver.secrets = [endpoint["secret"]]
        assert invoke("webhooks", "test", endpoint["id"]).exit_code == 0
        attempts = invoke("webhooks", "attempts", endpoint["id"])
    events = invoke("events", "ls")

    for text in (shown.stdout, listed.stdout, added.stdout, schedule, attempts.stdout, events.stdout):
        assert off_rule(text) == [], text
