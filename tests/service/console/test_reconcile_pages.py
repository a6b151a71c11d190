"""The console's reconciliation page and the home page's line: the newest report with its findings by
category, each linked to its flow; nothing kept yet says how to run one."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from durapay.gateway import Catalogue
from durapay.service.app import create_app
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.reconciliation import Reconciler
from tests.service.conftest import API_KEY, service_settings
from tests.workflows.reconciliation.test_run import a_flow_without_its_money, moto_input


@pytest.fixture
def runtime(redis_url: str, key_prefix: str) -> Iterator[Runtime]:
    with SimulatorServer(SimulatorConfig(seed=13)) as sim:
        built = build_runtime(service_settings(key_prefix, gateway={"base_url": sim.base_url}), redis_url=redis_url)
        built.engine.sender = None
        yield built
        built.close()


def signed_in(runtime: Runtime) -> TestClient:
    client = TestClient(create_app(runtime), base_url="https://testserver")
    login = client.get("/console/login")
    found = re.search(r'name="csrf" value="([^"]+)"', login.text)
    assert found, login.text[:300]
    answer = client.post(
        "/console/login", data={"name": "Ada", "key": API_KEY, "csrf": found.group(1), "next": "/console"}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    return client


def text(page: httpx.Response) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.text))


def test_the_newest_report_and_the_home_line(runtime: Runtime) -> None:
    client = signed_in(runtime)
    assert "No reconciliation report is kept" in text(client.get("/console/reconciliation"))
    assert "No reconciliation yet" in text(client.get("/console"))

    engine = runtime.engine
    operation = engine.gateway().call(Catalogue.create_moto_order, request=moto_input("stray-console", 800)).operation
    report = Reconciler(engine).run(engine.clock.now() - 3600)

    page = client.get("/console/reconciliation")
    assert page.status_code == 200 and f"Report {report.id}" in text(page)
    assert "Money without a flow (1)" in text(page) and operation.operationId in page.text
    assert 'data-verdict="wrong"' in page.text
    home = client.get("/console")
    assert 'data-reconciliation="wrong"' in home.text and "1 mismatch(es)" in text(home)
    assert client.get("/console/reconciliation?id=rec_0_none").status_code == 404


def test_the_flow_s_page_shows_its_mark(runtime: Runtime) -> None:
    client = signed_in(runtime)
    engine = runtime.engine
    flow_id, named = a_flow_without_its_money(engine, "mark-console-")
    assert 'id="attention"' not in client.get(f"/console/flows/{flow_id}").text
    report = Reconciler(engine).run(engine.clock.now() - 3600)

    page = client.get(f"/console/flows/{flow_id}")
    assert page.status_code == 200 and 'id="attention"' in page.text
    shown = text(page)
    assert f"A flow without its money (report {report.id}" in shown and f"names operation {named}" in shown, shown
    assert f'href="/console/reconciliation?id={report.id}"' in page.text
    assert "state-succeeded" in page.text  # its state is the flow's own
