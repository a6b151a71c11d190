"""Issue 38's acceptance: a rolling deploy with flows of every waiting shape in flight, on real processes.

Build 1 (examples/shop) and build 2 (tests/examples/build2: shop_order with a step renamed and one added,
build 1's version kept) each run as ``durapay worker`` processes loading ``shop.flows`` from their own
folder; the test process is each build's API (an engine of its registry) and the dispatcher. In flight
on build 1: a 3DS challenge wait, a hosted page, an open link, sleeping delayed charges (a MOTO and two
shop orders with ``run_at``, at the step build 2 renamed), and a schedule. Then:

* ``deploy check`` with build 2's manifest (printed by build 2's code) passes; with that manifest less
  build 1's version of shop_order it exits 1 naming exactly the shop orders of build 1;
* build 2's API starts a shop order while only build 1's worker runs: that worker holds no code for it,
  so it waits ``parked`` (never failed), and goes on once build 2's worker is up;
* build 1's worker stops, build 2's runs the old flows on build 1's version and the new on its own;
* every flow succeeds, each payment is charged once at the gateway, none is lost.
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from durapay.gateway import Catalogue, GatewayClient
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition
from durapay.workflows.schedules import Schedules
from tests.examples.conftest import EXAMPLES, worker_of
from tests.service.cli.conftest import invoke
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.processes import ROOT

BUILD1, BUILD2 = EXAMPLES / "shop", ROOT / "tests" / "examples" / "build2"
APPROVE, CHALLENGE = "4349940199004549", "5186151650005008"
#: The sleeping flows wake this long after they start: after build 1's worker stopped.
SLEEP = 45.0


def load(folder: Path, name: str) -> dict[str, FlowDefinition]:
    """A build's flows, loaded in this process under a name of its own (both builds name theirs shop)."""
    spec = importlib.util.spec_from_file_location(name, folder / "shop" / "flows.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return {flow.kind: flow for flow in module.FLOWS}


def card(pan: str = APPROVE) -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def order(tag: str, n: int) -> dict[str, Any]:
    return {"orderId": f"{tag}x{n}", "amount": "1500", "currency": "EUR", "description": "chair"}


def session() -> dict[str, Any]:
    return {"actionType": "PAY", "amount": "1500", "language": "eng", "resultUrl": "https://shop.example/ok"}


def manifest_of(folder: Path, env: dict[str, str], out: Path) -> dict[str, Any]:
    """What ``durapay flows manifest --json`` prints in a build (its own folder on the path)."""
    shown = subprocess.run(
        [sys.executable, "-c", "from durapay.service.cli import main; main()", "flows", "manifest", "--json"],
        env=env | {"PYTHONPATH": f"{folder}:{ROOT}", "DURAPAY_FLOWS__MODULES": "shop.flows"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out.write_text(shown.stdout)
    manifest: dict[str, Any] = json.loads(shown.stdout)
    return manifest


def make_contract(client: GatewayClient, tag: str) -> str:
    contract = f"{tag}ct"
    first = {"orderId": f"{tag}first", "amount": "100", "currency": "EUR"}
    recurrence = {"action": "CONTRACT_CREATION", "contractId": contract, "contractType": "MIT_SCHEDULED"}
    init = client.call(Catalogue.three_steps_init, request={"order": first, "card": card(), "recurrence": recurrence})
    client.call(
        Catalogue.three_steps_payment,
        request={"operationId": init.operation.operationId, "order": first, "card": card(), "recurrence": recurrence},
    )
    return contract


@pytest.mark.integration
def test_a_rolling_deploy_with_flows_in_flight(
    redis_url: str, key_prefix: str, tmp_path: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger"
    monkeypatch.setenv("SHOP_LEDGER", str(ledger))
    build1, build2 = load(BUILD1, "build1_shop_flows"), load(BUILD2, "build2_shop_flows")
    v1, v2 = build1["shop_order"].version, build2["shop_order"].version
    assert build2["shop_order"].versions().keys() == {v2, v1}
    with SimulatorServer(SimulatorConfig(seed=38)) as sim:
        overrides = {"engine": {"partitions": 2, "park_seconds": 1.0}, "flows": {"modules": "shop.flows"}}
        settings = stack_settings(key_prefix, sim.base_url, **overrides)
        local = stack_settings(key_prefix, sim.base_url, engine={"partitions": 2, "park_seconds": 1.0})
        api1 = build_runtime(local, redis_url=redis_url, rng=random.Random(1), flows=build1)
        api2 = build_runtime(local, redis_url=redis_url, rng=random.Random(2), flows=build2)
        env = {"SHOP_LEDGER": str(ledger)}
        worker1 = worker_of(settings, redis_url, "build1", tmp_path, BUILD1)
        worker2 = worker_of(settings, redis_url, "build2", tmp_path, BUILD2)
        worker1.env |= env
        worker2.env |= env
        dispatcher = Dispatcher(api1.engine, interval=0.05)
        engine = api1.engine
        try:
            worker1.start()
            dispatcher.start()
            tag = key_prefix
            later = engine.clock.now() + SLEEP
            flows: dict[str, str] = {}
            flows["shop_sleeping"] = engine.start(
                "shop_order", {"order": order(tag, 1), "card": card(), "customer": "c1"}, run_at=later
            ).id
            flows["moto_sleeping"] = engine.start("moto", {"order": order(tag, 2), "card": card()}, run_at=later).id
            shop3 = {"order": order(tag, 3), "card": card(), "customer": "c3"}
            flows["shop_sleeping_2"] = engine.start("shop_order", shop3, run_at=later + 2).id
            flows["three_ds"] = engine.start("three_steps", {"order": order(tag, 4), "card": card(CHALLENGE)}).id
            flows["hpp"] = engine.start("hpp", {"order": order(tag, 5), "paymentSession": session()}).id
            expires = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
            flows["link"] = engine.start(
                "paybylink", {"order": order(tag, 6), "paymentSession": session(), "expirationDate": expires}
            ).id
            with GatewayClient(local.gateway) as client:
                contract = make_contract(client, tag)
            schedules = Schedules(engine)
            plan = schedules.create(
                {
                    "contractId": contract,
                    "amount": 990,
                    "currency": "EUR",
                    "description": "monthly",
                    "rule": {"every": "days", "interval": 1},
                    "timezone": "UTC",
                    "start": datetime.fromtimestamp(later, UTC).isoformat(),
                    "count": 1,
                },
                key=f"{tag}-plan",
            )
            for name in ("three_ds", "hpp", "link"):
                wait_until(lambda n=name: engine.get(flows[n]).state is FlowState.WAITING, 60, f"{name} waiting")
            shop_v1 = {flows["shop_sleeping"], flows["shop_sleeping_2"]}

            # The pipeline's check, from a process that reaches the store (the CLI, built-in kinds only).
            manifest = manifest_of(BUILD2, cli_env, tmp_path / "build2.json")
            assert [entry["version"] for entry in manifest["kinds"]["shop_order"]] == [v2, v1]
            passed = invoke("deploy", "check", "--manifest", str(tmp_path / "build2.json"), "--json")
            assert passed.exit_code == 0, passed.output
            groups = {(g["kind"], g["version"]): g for g in json.loads(passed.stdout)["groups"]}
            assert groups[("shop_order", v1)]["count"] == 2 and groups[("shop_order", v1)]["steps"] == {"fraud_check": 2}
            assert groups[("mit", "*")]["schedules"] == 1
            assert {kind for kind, _ in groups} >= {"shop_order", "moto", "three_steps", "hpp", "paybylink", "mit"}
            manifest["kinds"]["shop_order"] = manifest["kinds"]["shop_order"][:1]  # a build 2 that dropped version 1
            (tmp_path / "dropped.json").write_text(json.dumps(manifest))
            refused = invoke("deploy", "check", "--manifest", str(tmp_path / "dropped.json"), "--json")
            assert refused.exit_code == 1, refused.output
            assert set(json.loads(refused.stdout)["stranded"]) == shop_v1, "exactly build 1's shop orders"

            # Build 2's API starts a flow while only build 1's worker runs: parked, not failed.
            flows["shop_parked"] = api2.engine.start("shop_order", {"order": order(tag, 7), "card": card(), "customer": "c7"}).id
            wait_until(lambda: engine.get(flows["shop_parked"]).state is FlowState.PARKED, 60, "the new flow parked")
            assert engine.get(flows["shop_parked"]).fields["definition"] == f"shop_order@{v2}"

            worker1.stop()  # build 1's workers stop; build 2's take over
            stopped_at = engine.clock.now()
            assert stopped_at < later, f"build 1's worker stopped {stopped_at - later:.0f}s after the sleeping flows woke"
            worker2.start()
            dispatcher.stop()
            dispatcher = Dispatcher(api2.engine, interval=0.05)
            dispatcher.start()
            engine = api2.engine
            flows["shop_new"] = engine.start("shop_order", {"order": order(tag, 8), "card": card(), "customer": "c8"}).id

            waiting = engine.get(flows["three_ds"])
            init = waiting.outputs["init"]
            pares = sim.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"])
            assert engine.signal(flows["three_ds"], "3ds_result", {"PaRes": pares}) == "resumed"
            for name, paid in (
                ("hpp", sim.admin.complete_hpp(engine.get(flows["hpp"]).order_id)),
                ("link", sim.admin.complete_link(engine.get(flows["link"]).outputs["create"]["paymentLink"]["linkId"])),
            ):
                record = engine.get(flows[name])
                operation = {
                    "orderId": record.order_id,
                    "operationId": paid["operationId"],
                    "operationResult": paid["operationResult"],
                }
                engine.signal(flows[name], "notification", {"operation": operation}, by="notification")

            ended = {name: engine.wait(flow_id, 120) for name, flow_id in flows.items()}
            for name, record in ended.items():
                assert record.state is FlowState.SUCCEEDED, (name, record.summary())
            assert set(ended["shop_sleeping"].outputs) == {"fraud_check", "charge", "post_ledger"}, "build 1's steps"
            assert set(ended["shop_sleeping_2"].outputs) == {"fraud_check", "charge", "post_ledger"}
            for name in ("shop_parked", "shop_new"):
                assert set(ended[name].outputs) == {"risk_check", "charge", "post_ledger", "notify"}, "build 2's steps"
            woke = [entry for entry in engine.history(flows["moto_sleeping"]) if entry.get("from") == "sleeping"]
            assert woke and all("build2" in str(entry.get("by")) for entry in woke), "woken on build 2's worker"

            wait_until(
                lambda: schedules.tick() >= 0 and schedules.get(plan.id).state.value == "completed", 120, "the schedule fired"
            )
            charges = [engine.wait(listed.id, 120) for listed in engine.list(kind="mit")]
            assert [charge.state for charge in charges] == [FlowState.SUCCEEDED], "the schedule's charge, on build 2"
            ended["schedule_charge"] = charges[0]
            # 0 charged twice: each order holds one successful payment at the gateway; every shop order one posting.
            for name, record in ended.items():
                paid = [
                    op
                    for op in sim.admin.operations(order_id=record.order_id)
                    if op.get("operationResult") in ("AUTHORIZED", "EXECUTED")
                ]
                assert len(paid) == 1, (name, paid)
            assert len(list(ledger.glob("*.json"))) == 4
        finally:
            dispatcher.stop()
            worker1.stop()
            worker2.stop()
            api1.close()
            api2.close()
