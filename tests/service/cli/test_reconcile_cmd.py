"""``durapay reconcile``: exit 1 and the report (text or JSON) when the gateway holds money no flow claims,
0 on a clean window, ``--latest`` without calling the gateway, 2 for a window it cannot read."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator

import pytest

from durapay.gateway import Catalogue
from durapay.service.runtime import Runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.reconciliation import Reconciler
from tests.service.cli.conftest import DURAPAY, invoke
from tests.waiting import wait_until
from tests.workflows.reconciliation.test_run import a_flow_without_its_money, moto_input


@pytest.fixture
def gateway(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=5)) as sim:
        monkeypatch.setenv("DURAPAY_GATEWAY__BASE_URL", sim.base_url)
        yield sim


def test_money_without_a_flow_exits_one(gateway: SimulatorServer, engine_side: Runtime) -> None:
    assert invoke("reconcile", "--since", "1h").exit_code == 0  # nothing at the gateway yet
    body = moto_input("stray-cli", 700)
    operation = engine_side.engine.gateway().call(Catalogue.create_moto_order, request=body).operation

    result = invoke("reconcile", "--since", "1h", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["counts"]["money_without_flow"] == 1 and report["ok"] is False
    assert report["findings"][0]["operation"]["operationId"] == operation.operationId

    text = invoke("reconcile", "--latest")
    assert text.exit_code == 1 and report["id"] in text.stdout
    assert "money without a flow: 1" in text.stdout and "stray-cli" in text.stdout


def test_a_window_it_cannot_read_is_a_usage_error(gateway: SimulatorServer, engine_side: Runtime) -> None:
    result = invoke("reconcile", "--since", "yesterday", "--json")
    assert result.exit_code == 2 and json.loads(result.stderr)["field"] == "--since"
    result = invoke("reconcile", "--since", "1h", "--until", "2h")
    assert result.exit_code == 2 and "before it starts" in result.stderr


def test_a_run_killed_mid_window_reads_interrupted_and_another_runs(gateway: SimulatorServer, engine_side: Runtime) -> None:
    """A ``durapay reconcile`` SIGKILLed while it reads the gateway leaves its report running only as
    long as its lease (1 s here): then the report says interrupted and why, and a new run goes."""
    reports = Reconciler(engine_side.engine).reports
    gateway.admin.set_faults(mode="latency", operation="list_operations", latency_ms=4000, count=1)
    env = {**os.environ, "DURAPAY_RECONCILE__LEASE_SECONDS": "1"}
    run = subprocess.Popen(
        [*DURAPAY, "reconcile", "--since", "1h"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        running = wait_until(lambda: reports.latest(), timeout=30, what="the run's report kept as running")
        assert running.running and running.interrupted is None
    finally:
        run.kill()
        run.wait(timeout=10)
    dead = wait_until(lambda: (found := reports.get(running.id)) and not found.running and found, timeout=10, what="interrupted")
    assert dead.interrupted and "lease" in dead.interrupted and not dead.ok and not dead.finished
    assert json.loads(invoke("reconcile", "--latest", "--json").stdout)["interrupted"] == dead.interrupted
    text = invoke("reconcile", "--latest")
    assert text.exit_code == 1 and "interrupted: its run stopped before it finished" in text.stdout, text.stdout

    again = invoke("reconcile", "--since", "1h", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["id"] != running.id and reports.get(running.id) == dead


def test_flows_show_has_the_flow_s_mark(gateway: SimulatorServer, engine_side: Runtime) -> None:
    engine = engine_side.engine
    flow_id, named = a_flow_without_its_money(engine, "mark-cli-")
    assert invoke("reconcile", "--since", "1h").exit_code == 1

    shown = invoke("flows", "show", flow_id)
    assert shown.exit_code == 0, shown.output
    assert re.search(rf"attention\s+flow_without_money: .*names operation {named}", shown.stdout), shown.stdout
    assert "reconciliation rec_" in shown.stdout  # its history line
    view = json.loads(invoke("flows", "show", flow_id, "--json").stdout)
    assert view["state"] == "succeeded" and [mark["named"] for mark in view["attention"]] == [named]
    assert view["history"][-1]["attention"]["named"] == named
