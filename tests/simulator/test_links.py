"""Pay-by-link: the page, expiry by the simulator's clock, cancel, renew, modify, lists, exports, auto-completion."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest

from durapay.config import GatewaySettings
from durapay.gateway import BadRequest, Catalogue, GatewayClient
from durapay.simulator import SimulatorAdminError, SimulatorConfig, SimulatorServer
from tests.simulator.scenario import Scenario
from tests.simulator.support import DECLINE, order, session
from tests.waiting import wait_until


@pytest.fixture
def scenario(client: GatewayClient, sim: SimulatorServer) -> Scenario:
    sim.admin.set_clock(sim.admin.now().strftime("%Y-%m-%dT12:00:00Z"))
    return Scenario(client, sim)


def _status(client: GatewayClient, link_id: str) -> str:
    return str(client.call(Catalogue.get_paybylink, link_id).paymentLink.status)


def test_paying_the_link_page_pays_the_order_once(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    link_id = scenario.link()
    paid = sim.admin.complete_link(link_id)
    details = client.call(Catalogue.get_paybylink_v3, link_id)
    assert (details.paymentLink.status, details.paymentLink.paidByOperationId) == ("PAID", paid["operationId"])
    assert [op.operationId for op in details.operations] == [paid["operationId"]]
    with pytest.raises(SimulatorAdminError) as again:
        sim.admin.complete_link(link_id)
    assert again.value.status == 409


def test_a_declined_link_fails_and_can_be_renewed(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    link_id = scenario.link()
    assert sim.admin.complete_link(link_id, pan=DECLINE)["operationResult"] == "DECLINED"
    assert _status(client, link_id) == "FAILED"
    renewed = client.call(Catalogue.renew_paybylink, link_id, request={})
    assert renewed.paymentLink.status == "ACTIVE"
    assert sim.admin.complete_link(link_id)["operationResult"] == "EXECUTED"


def test_a_link_expires_when_the_clock_passes_its_date(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    link_id = scenario.link(days=2)
    order_id = client.call(Catalogue.get_paybylink, link_id).orderId or ""
    sim.admin.advance_clock(timedelta(days=2).total_seconds())
    assert _status(client, link_id) == "ACTIVE"  # valid through its expiration date
    sim.admin.advance_clock(timedelta(days=1).total_seconds())
    assert _status(client, link_id) == "EXPIRED"
    assert [op.operationResult for op in client.call(Catalogue.get_order, order_id).operations] == ["EXPIRED"]
    with pytest.raises(SimulatorAdminError) as late:
        sim.admin.complete_link(link_id)
    assert late.value.status == 409
    renewed = client.call(Catalogue.renew_paybylink, link_id, request={})
    assert renewed.paymentLink.expirationDate == (sim.admin.now() + timedelta(days=2)).date().isoformat()  # same life span
    assert sim.admin.complete_link(link_id)["operationResult"] == "EXECUTED"


def test_expiration_date_is_at_most_90_days_ahead(client: GatewayClient, scenario: Scenario) -> None:
    for days, ok in ((90, True), (91, False), (-1, False)):
        request = {"order": order(scenario.new_id("o")), "paymentSession": session(), "expirationDate": scenario.today_plus(days)}
        if ok:
            client.call(Catalogue.create_paybylink_v2, request=request)
            continue
        with pytest.raises(BadRequest) as refused:
            client.call(Catalogue.create_paybylink_v2, request=request)
        assert refused.value.codes == ("PS0026",) and "expirationDate" in refused.value.errors[0].description


def test_cancel_rules(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    link_id = scenario.link()
    client.call(Catalogue.cancel_paybylink, link_id)
    assert _status(client, link_id) == "CANCELLED"
    with pytest.raises(BadRequest) as twice:
        client.call(Catalogue.cancel_paybylink, link_id)
    assert twice.value.codes == ("PS0044",)
    paid = scenario.link()
    sim.admin.complete_link(paid)
    with pytest.raises(BadRequest) as used:
        client.call(Catalogue.cancel_paybylink, paid)
    assert used.value.codes == ("PS0045",)


def test_modify_changes_an_unused_link(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    link_id = scenario.link()
    modified = client.call(
        Catalogue.modify_paybylink_v3, link_id, request={"amount": "2500", "expirationDate": scenario.today_plus(30)}
    )
    assert (modified.paymentLink.amount, modified.paymentLink.expirationDate) == (2500, scenario.today_plus(30))
    paid = sim.admin.complete_link(link_id)
    assert client.call(Catalogue.get_operation, paid["operationId"]).operationAmount == 2500
    with pytest.raises(BadRequest) as used:
        client.call(Catalogue.modify_paybylink_v3, link_id, request={"amount": "10"})
    assert used.value.codes == ("PS0045",)


def test_lists_filter_and_limit(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    links = [scenario.link() for _ in range(4)]
    sim.admin.complete_link(links[0])
    assert len(client.call(Catalogue.list_paybylinks_v3, request={}).paymentLinks) == 4
    assert [x.linkId for x in client.call(Catalogue.list_paybylinks, request={"status": "PAID"}).paymentLinks] == [links[0]]
    newest = client.call(Catalogue.list_paybylinks_v3, request={"maxRecords": 2}).paymentLinks
    assert [x.linkId for x in newest] == [links[3], links[2]]
    response = httpx.get(
        sim.base_url + "/v3/orders/paybylink", params={"maxRecords": "501"}, headers={"X-Api-Key": sim.config.api_key}
    )
    assert response.json()["errors"][0]["code"] == "PS0026"


def test_exports_in_csv_and_json(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    link_id = scenario.link()
    csv_export = client.call(Catalogue.export_paybylinks_v3, "csv", request={})
    header, row = csv_export.content.decode().strip().split("\n")
    assert header.split(",")[:5] == ["linkId", "orderId", "amount", "currency", "status"]
    assert row.startswith(f"{link_id},") and ",1500,EUR,ACTIVE," in row
    json_export = client.call(Catalogue.export_paybylinks_v3, "json", request={})
    assert json_export.mediaType == "application/json"
    assert [x["linkId"] for x in json.loads(json_export.content)["paymentLinks"]] == [link_id]
    with pytest.raises(BadRequest):
        client.call(Catalogue.export_paybylinks_v3, "xlsx", request={})


def test_the_qr_code_is_a_png(client: GatewayClient, scenario: Scenario) -> None:
    small = client.call(Catalogue.paybylink_qrcode_v3, scenario.link(), request={"size": 2})
    large = client.call(Catalogue.paybylink_qrcode_v3, scenario.link(), request={"size": 8})
    assert small.mediaType == "image/png" and small.content.startswith(b"\x89PNG")
    assert len(large.content) > len(small.content)


def test_links_complete_by_themselves_with_auto_complete() -> None:
    with (
        SimulatorServer(SimulatorConfig(auto_complete_ms=50)) as sim,
        GatewayClient(GatewaySettings(base_url=sim.base_url)) as client,
    ):
        expiry = (sim.admin.now() + timedelta(days=3)).date().isoformat()
        link = client.call(
            Catalogue.create_paybylink, request={"order": order("auto-1"), "paymentSession": session(), "expirationDate": expiry}
        )
        wait_until(lambda: _status(client, link.paymentLink.linkId) == "PAID", what="the link to pay itself")
        hpp = client.call(Catalogue.create_hpp_order, request={"order": order("auto-2"), "paymentSession": session()})
        assert hpp.hostedPage
        wait_until(lambda: client.call(Catalogue.get_order, "auto-2").operations, what="the hosted page to pay itself")
        assert [op["operation"] for op in sim.admin.operations(order_id="auto-2")] == ["auto_complete"]
