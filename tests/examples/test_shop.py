"""examples/shop on real processes: its fraud check, a MOTO charge at the simulator over HTTP, its ledger
posting; the flow loaded by a ``durapay worker`` process from ``DURAPAY_FLOWS__MODULES``."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from tests.examples.conftest import worker_of
from tests.service.cli.conftest import invoke
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings

CARD = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}


def order(key_prefix: str, n: int, amount: str = "2500") -> dict[str, Any]:
    return {
        "order": {"orderId": f"{key_prefix}-{n}", "amount": amount, "currency": "EUR", "description": "a chair"},
        "card": dict(CARD),
        "customer": f"c-{n}",
    }


@pytest.fixture
def shop(
    shop_path: Path, redis_url: str, key_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Runtime, Path, Path]]:
    ledger, down = tmp_path / "ledger", tmp_path / "risk-down"
    monkeypatch.setenv("SHOP_LEDGER", str(ledger))
    monkeypatch.setenv("SHOP_RISK_DOWN", str(down))
    with SimulatorServer(SimulatorConfig(seed=5)) as sim:
        settings = stack_settings(key_prefix, sim.base_url, flows={"modules": "shop.flows"})
        runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(5))
        dispatcher = Dispatcher(runtime.engine, interval=0.05)
        worker = worker_of(settings, redis_url, "shop", tmp_path, shop_path)
        worker.env |= {"SHOP_LEDGER": str(ledger), "SHOP_RISK_DOWN": str(down)}
        worker.start()
        dispatcher.start()
        try:
            yield runtime, ledger, down
        finally:
            dispatcher.stop()
            worker.stop()
            runtime.close()


def test_the_shops_flow_charges_once_and_posts_once(shop: tuple[Runtime, Path, Path], key_prefix: str) -> None:
    runtime, ledger, _ = shop
    engine = runtime.engine
    assert "shop_order" in engine.registry and engine.registry["shop_order"].label == "shop 1"
    record = engine.wait(engine.start("shop_order", order(key_prefix, 1)).id, 60)
    assert record.state is FlowState.SUCCEEDED, record.summary()
    assert set(record.outputs) == {"fraud_check", "charge", "post_ledger"}, "settle skipped: the charge was final"
    postings = [json.loads(path.read_text()) for path in ledger.glob("*.json")]
    assert postings == [
        {"key": f"{record.id}.post_ledger", "operationId": record.outputs["charge"]["operation"]["operationId"], "amount": "2500"}
    ]
    assert record.outputs["post_ledger"] == {"posting": f"{record.id}.post_ledger", "operationId": postings[0]["operationId"]}
    assert record.fields["definition"] == f"shop_order@{engine.registry['shop_order'].version}"


def test_a_final_fraud_refusal_ends_the_flow_before_any_charge(shop: tuple[Runtime, Path, Path], key_prefix: str) -> None:
    runtime, ledger, _ = shop
    record = runtime.engine.wait(runtime.engine.start("shop_order", order(key_prefix, 2, amount="60000")).id, 60)
    assert record.state is FlowState.FAILED
    assert record.error is not None and "above the shop's limit" in record.error["message"]
    assert "charge" not in record.outputs and not list(ledger.glob("*.json"))


def test_a_risk_service_down_is_retried_then_the_flow_goes_on(shop: tuple[Runtime, Path, Path], key_prefix: str) -> None:
    runtime, _, down = shop
    down.touch()
    flow_id = runtime.engine.start("shop_order", order(key_prefix, 3)).id
    wait_until(lambda: runtime.engine.get(flow_id).attempt >= 2, timeout=60, what="two tries of the fraud check")
    retrying = runtime.engine.get(flow_id)
    assert retrying.step == "fraud_check" and retrying.error is not None and retrying.error["retryable"]
    assert retrying.error["message"] == "the risk service is down"
    down.unlink()
    record = runtime.engine.wait(flow_id, 60)
    assert record.state is FlowState.SUCCEEDED, record.summary()
    assert "charge" in record.outputs, "the fraud check passed on a later try"


def test_the_shops_kind_has_the_apis_route_and_the_clis_kinds(
    shop: tuple[Runtime, Path, Path], key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind of DURAPAY_FLOWS__MODULES is served as a built-in one: its POST /flows route over HTTP (a flow
    started there runs on the worker) and ``durapay flows kinds``."""
    from fastapi.testclient import TestClient

    from durapay.service.app import create_app

    runtime, _, _ = shop
    with TestClient(create_app(runtime, insecure=True)) as client:
        assert "/flows/shop_order" in client.get("/openapi.json").json()["paths"]
        started = client.post("/flows/shop_order", json=order(key_prefix, 4))
        assert started.status_code in (200, 201, 202), started.text
    record = runtime.engine.wait(started.json()["id"], 60)
    assert record.state is FlowState.SUCCEEDED, record.summary()
    monkeypatch.setenv("DURAPAY_FLOWS__MODULES", "shop.flows")
    listed = invoke("flows", "kinds", "shop_order", "--json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)[0]["steps"] == ["fraud_check", "charge", "settle", "post_ledger"]
