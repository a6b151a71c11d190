"""``/reconciliation``: a run started over HTTP in the background, its report read back; what a run refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from durapay.gateway import Catalogue
from durapay.service.app import create_app
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.reconciliation import Reconciler
from tests.service.conftest import API_KEY, service_settings
from tests.waiting import wait_until
from tests.workflows.reconciliation.test_run import a_flow_without_its_money, moto_input

HEADERS = {"X-Api-Key": API_KEY}


@pytest.fixture
def gateway_runtime(redis_url: str, key_prefix: str) -> Iterator[tuple[Runtime, SimulatorServer]]:
    with SimulatorServer(SimulatorConfig(seed=9)) as sim:
        settings = service_settings(key_prefix, gateway={"base_url": sim.base_url})
        built = build_runtime(settings, redis_url=redis_url)
        built.engine.sender = None
        yield built, sim
        built.close()


def test_a_run_in_the_background_and_its_report(gateway_runtime: tuple[Runtime, SimulatorServer]) -> None:
    runtime, _ = gateway_runtime
    client = TestClient(create_app(runtime))
    assert client.get("/reconciliation/reports/latest", headers=HEADERS).status_code == 404
    body = moto_input("stray-api", 700)
    runtime.engine.gateway().call(Catalogue.create_moto_order, request=body)

    started = client.post("/reconciliation/reports", json={"since": "1h"}, headers=HEADERS)
    assert started.status_code == 202, started.text
    report_id = started.json()["id"]
    assert started.headers["Location"] == f"/reconciliation/reports/{report_id}"

    def finished() -> dict[str, object] | None:
        answer = client.get(f"/reconciliation/reports/{report_id}", headers=HEADERS).json()
        return None if answer["running"] else answer

    report = wait_until(finished, timeout=20)
    assert report["ok"] is False and report["counts"]["money_without_flow"] == 1  # type: ignore[index]
    assert client.get("/reconciliation/reports/latest", headers=HEADERS).json()["id"] == report_id
    assert [item["id"] for item in client.get("/reconciliation/reports", headers=HEADERS).json()["reports"]] == [report_id]


def test_a_window_it_cannot_read_is_refused(gateway_runtime: tuple[Runtime, SimulatorServer]) -> None:
    client = TestClient(create_app(gateway_runtime[0]))
    answer = client.post("/reconciliation/reports", json={"since": "1h", "until": "2h"}, headers=HEADERS)
    assert answer.status_code == 422 and answer.json()["field"] == "until"
    answer = client.post("/reconciliation/reports", json={"since": "yesterday"}, headers=HEADERS)
    assert answer.status_code == 422 and answer.json()["field"] == "since"
    assert client.get("/reconciliation/reports/rec_1_x", headers=HEADERS).status_code == 404


def test_a_window_past_the_flows_retention_is_refused(gateway_runtime: tuple[Runtime, SimulatorServer]) -> None:
    """Past the finished flows' retention every payment would read as money without a flow (and 1970 is
    hundreds of calls): refused, as is a start out of any calendar, before anything is kept."""
    client = TestClient(create_app(gateway_runtime[0]))
    for since in ("999999999d", "0", "31d"):
        answer = client.post("/reconciliation/reports", json={"since": since}, headers=HEADERS)
        assert answer.status_code == 422 and answer.json()["field"] == "since", answer.text
        assert "retention" in answer.json()["reason"]
    assert client.get("/reconciliation/reports", headers=HEADERS).json()["reports"] == []


def test_a_second_run_while_one_goes_is_refused(gateway_runtime: tuple[Runtime, SimulatorServer]) -> None:
    runtime, sim = gateway_runtime
    client = TestClient(create_app(runtime))
    sim.admin.set_faults(mode="latency", operation="list_operations", latency_ms=1500, count=1)
    first = client.post("/reconciliation/reports", json={"since": "1h"}, headers=HEADERS)
    assert first.status_code == 202, first.text
    second = client.post("/reconciliation/reports", json={"since": "2h"}, headers=HEADERS)
    assert second.status_code == 409 and first.json()["id"] in second.json()["reason"], second.text


def test_a_run_of_a_dead_process_refuses_a_new_one_only_while_its_lease_lasts(
    gateway_runtime: tuple[Runtime, SimulatorServer],
) -> None:
    """Another process's run refuses one here (409 naming it) while it renews its lease; once the process
    is gone (the lease lapses: 3 s here), its report reads interrupted and a new run starts."""
    runtime, _ = gateway_runtime
    client = TestClient(create_app(runtime))
    elsewhere = Reconciler(runtime.engine)
    report = elsewhere.begin(runtime.engine.clock.now() - 600)
    elsewhere.reports.save(report, now=report.started)  # kept as running by a process that dies now:
    runtime.engine.redis.set(elsewhere.reports.lease_key(report.id), "1", px=3000)  # its last lease, 3 s

    refused = client.post("/reconciliation/reports", json={"since": "1h"}, headers=HEADERS)
    assert refused.status_code == 409 and report.id in refused.json()["reason"], refused.text
    assert client.get(f"/reconciliation/reports/{report.id}", headers=HEADERS).json()["running"] is True

    started = wait_until(
        lambda: (
            (answer := client.post("/reconciliation/reports", json={"since": "1h"}, headers=HEADERS)).status_code == 202
            and answer
        ),
        timeout=10,
        what="a new run once the dead one's lease ran out",
    )
    assert started.json()["id"] != report.id
    dead = client.get(f"/reconciliation/reports/{report.id}", headers=HEADERS).json()
    assert dead["running"] is False and dead["ok"] is False and "lease" in dead["interrupted"], dead


def test_a_flow_without_its_money_shows_the_mark_on_the_flow(gateway_runtime: tuple[Runtime, SimulatorServer]) -> None:
    """The mark is on the flow itself (its view and its history), for a person: the flow keeps its
    state and version (no money state moves but on the gateway's word), and a second run marks it once."""
    runtime, _ = gateway_runtime
    engine = runtime.engine
    client = TestClient(create_app(runtime))
    since = engine.clock.now() - 60
    flow_id, named = a_flow_without_its_money(engine, "mark-api-")
    before = client.get(f"/flows/{flow_id}", headers=HEADERS).json()
    logged = client.get(f"/flows/{flow_id}/history", headers=HEADERS).json()["history"]
    assert before["attention"] == []

    for _ in range(2):
        report = Reconciler(engine).run(since)
    view = client.get(f"/flows/{flow_id}", headers=HEADERS).json()
    assert (view["state"], view["version"], view["outcome"]) == ("succeeded", before["version"], before["outcome"])
    [mark] = view["attention"]
    assert (mark["category"], mark["named"], mark["report"]) == ("flow_without_money", named, report.id)
    assert f"names operation {named}, which the gateway does not have" in mark["what"]

    history = client.get(f"/flows/{flow_id}/history", headers=HEADERS).json()["history"]
    assert history[: len(logged)] == logged  # no transition added
    [entry] = history[len(logged) :]
    assert entry["by"] == "reconcile" and "to" not in entry and entry["attention"]["category"] == "flow_without_money"
    assert entry["what"].startswith(f"reconciliation {report.id}: a flow without its money:"), entry
