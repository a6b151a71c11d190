"""Hosted page, contracts and MIT (with scripted dunning outcomes), card verification, MOTO and wallet."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient, NotFound
from durapay.simulator import SimulatorAdminError, SimulatorServer
from durapay.simulator._direct import HOSTED_PAGE_LIFETIME
from tests.simulator.scenario import Scenario
from tests.simulator.support import DECLINE, card, order, session


def _mit(client: GatewayClient, contract_id: str, order_id: str) -> tuple[str, str | None]:
    answer = client.call(
        Catalogue.create_mit_order,
        request={"order": order(order_id, 990), "contractId": contract_id},
        idempotency_key=f"k-{order_id}",
    )
    data = answer.operation.additionalData or {}
    return str(answer.operation.operationResult), str(data.get("responseCode"))


def test_the_hosted_page_shows_the_amount_as_the_customer_reads_it(client: GatewayClient, sim: SimulatorServer) -> None:
    """Issue 41: the customer's page read "2500 EUR (minor units)"."""
    client.call(Catalogue.create_hpp_order, request={"order": order("h-amount", 2500), "paymentSession": session(2500)})
    page = httpx.get(f"{sim.root_url}/_sim/hpp/h-amount").text
    assert "25.00 EUR" in page and "minor units" not in page, page


def test_the_hosted_page_redirects_to_the_merchant_after_paying_or_cancelling(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    urls: dict[str, Any] = {"resultUrl": "https://shop.example/ok", "cancelUrl": "https://shop.example/ko"}
    for order_id, action, target in (("h-1", "pay", "/ok"), ("h-2", "cancel", "/ko")):
        client.call(Catalogue.create_hpp_order, request={"order": order(order_id), "paymentSession": session(**urls)})
        answer = httpx.post(
            f"{sim.root_url}/_sim/hpp/{order_id}", data={"action": action, "pan": "4349940199004549", "expiryDate": "0526"}
        )
        assert answer.status_code == 303 and answer.headers["location"].endswith(target)
    results = {o: [op.operationResult for op in client.call(Catalogue.get_order, o).operations] for o in ("h-1", "h-2")}
    assert results == {"h-1": ["EXECUTED"], "h-2": ["CANCELED"]}


def test_the_hosted_page_is_a_form_a_person_can_use(client: GatewayClient, sim: SimulatorServer) -> None:
    hosted = client.call(Catalogue.create_hpp_order, request={"order": order("h#1"), "paymentSession": session()}).hostedPage
    page = httpx.get(hosted)
    assert page.status_code == 200 and '<input name="pan"' in page.text
    assert sim.admin.complete_hpp("h#1")["operationResult"] == "EXECUTED"


def test_a_hosted_page_unpaid_for_a_day_expires_and_can_no_longer_be_paid(client: GatewayClient, sim: SimulatorServer) -> None:
    client.call(Catalogue.create_hpp_order, request={"order": order("day-1"), "paymentSession": session()})
    sim.admin.advance_clock(HOSTED_PAGE_LIFETIME.total_seconds() - 60)
    assert client.call(Catalogue.get_order, "day-1").operations == [], "still open just before its day is up"
    sim.admin.advance_clock(120)
    [op] = client.call(Catalogue.get_order, "day-1").operations
    assert (op.operationType, op.operationResult) == ("AUTHORIZATION", "EXPIRED")
    with pytest.raises(SimulatorAdminError, match="already completed"):
        sim.admin.complete_hpp("day-1")


def test_a_verify_session_verifies_the_card_without_charging(client: GatewayClient, sim: SimulatorServer) -> None:
    client.call(Catalogue.create_hpp_order, request={"order": order("v-1"), "paymentSession": session(actionType="VERIFY")})
    sim.admin.complete_hpp("v-1")
    [op] = client.call(Catalogue.get_order, "v-1").operations
    assert (op.operationType, op.operationResult, op.operationAmount) == ("CARD_VERIFICATION", "EXECUTED", 0)


def test_contract_creation_then_mit_then_deactivation(client: GatewayClient, sim: SimulatorServer) -> None:
    recurrence = {"action": "CONTRACT_CREATION", "contractId": "c-77", "contractType": "MIT_SCHEDULED", "contractFrequency": "30"}
    request = {"order": order("first-1", customerId="cust-7"), "paymentSession": session(recurrence=recurrence)}
    client.call(Catalogue.create_hpp_order, request=request)
    with pytest.raises(NotFound):
        client.call(Catalogue.get_customer_contracts, "cust-7")  # not paid yet: no contract
    sim.admin.complete_hpp("first-1")
    contracts = client.call(Catalogue.get_customer_contracts, "cust-7").contracts
    assert [(c.contractId, c.contractType, c.contractFrequency, c.paymentInstrumentInfo) for c in contracts] == [
        ("c-77", "MIT_SCHEDULED", "30", "***4549")
    ]
    sim.admin.advance_clock(30 * 86_400)  # its contractFrequency: 30 days after the first payment
    assert _mit(client, "c-77", "mit-1") == ("EXECUTED", "000")
    with pytest.raises(BadRequest) as again:
        client.call(Catalogue.create_hpp_order, request={**request, "order": order("first-2")})
    assert again.value.codes == ("PS0017",)
    client.call(Catalogue.deactivate_contract, "c-77")
    with pytest.raises(BadRequest) as deactivated:
        _mit(client, "c-77", "mit-2")
    assert deactivated.value.codes == ("PS0017",)


def test_a_failed_first_payment_creates_no_contract(client: GatewayClient, sim: SimulatorServer) -> None:
    recurrence = {"action": "CONTRACT_CREATION", "contractId": "c-1"}
    link = client.call(
        Catalogue.create_paybylink_v1,
        request={
            "order": order("first-1"),
            "paymentSession": session(recurrence=recurrence),
            "expirationDate": Scenario(client, sim).today_plus(1),
        },
    )
    sim.admin.complete_link(link.paymentLink.linkId, pan=DECLINE)
    with pytest.raises(BadRequest) as refused:
        _mit(client, "c-1", "mit-1")
    assert refused.value.codes == ("PS0017",)


def test_scripted_outcomes_give_a_soft_decline_then_an_approval(client: GatewayClient, sim: SimulatorServer) -> None:
    contract_id = Scenario(client, sim).contract()
    sim.admin.script_outcomes(["116", "000"], contract_id=contract_id)
    assert [_mit(client, contract_id, f"m-{n}") for n in range(3)] == [
        ("DECLINED", "116"),
        ("EXECUTED", "000"),
        ("EXECUTED", "000"),
    ]


def test_card_scripts_apply_after_contract_scripts(client: GatewayClient, sim: SimulatorServer) -> None:
    contract_id = Scenario(client, sim).contract()
    sim.admin.script_outcomes(["208"], pan="4349940199004549")
    sim.admin.script_outcomes(["DENIED_BY_RISK"], contract_id=contract_id)
    assert [_mit(client, contract_id, f"m-{n}")[0] for n in range(3)] == ["DENIED_BY_RISK", "DECLINED", "EXECUTED"]


def test_scripts_refuse_unknown_outcomes(sim: SimulatorServer) -> None:
    with pytest.raises(SimulatorAdminError, match="unknown outcome"):
        sim.admin.script_outcomes(["maybe"], pan="4349940199004549")


@pytest.mark.parametrize(
    ("pan", "result", "code"), [("4349940199004549", "EXECUTED", "000"), ("4000000000000004", "DECLINED", "208")]
)
def test_card_verification(client: GatewayClient, pan: str, result: str, code: str) -> None:
    op = client.call(Catalogue.card_verification, request={"order": order("cv-1", 0), "card": card(pan)}).operation
    assert (op.operationType, op.operationResult, op.operationAmount) == ("CARD_VERIFICATION", result, 0)
    assert op.additionalData is not None and op.additionalData["responseCode"] == code


def test_moto_runs_no_3ds(client: GatewayClient) -> None:
    op = client.call(
        Catalogue.create_moto_order, request={"order": order("m-1"), "card": card("5533893874304465"), "captureType": "EXPLICIT"}
    ).operation
    assert (op.operationType, op.operationResult, op.channel) == ("AUTHORIZATION", "AUTHORIZED", "BACKOFFICE")


@pytest.mark.parametrize(
    ("data", "result", "code"),
    [
        ({}, "EXECUTED", "000"),
        ({"outcome": "116"}, "DECLINED", "116"),
        ({"pan": "4000000000000005"}, "DECLINED", "209"),
        ({"outcome": "DENIED_BY_RISK"}, "DENIED_BY_RISK", "102"),
    ],
)
def test_wallet_payment_data_picks_the_outcome(client: GatewayClient, data: dict[str, str], result: str, code: str) -> None:
    op = client.call(Catalogue.wallet_pay, request={"order": order("w-1"), "walletPaymentData": data}).operation
    assert (op.operationResult, (op.additionalData or {}).get("responseCode"), op.paymentCircuit) == (result, code, "GOOGLE_PAY")


def test_a_session_amount_above_the_order_amount_is_ps0007(client: GatewayClient) -> None:
    with pytest.raises(BadRequest) as refused:
        client.call(Catalogue.create_hpp_order, request={"order": order("o-1", 100), "paymentSession": session(101)})
    assert refused.value.codes == ("PS0007",)
    with pytest.raises(NotFound):
        client.call(Catalogue.get_order, "o-1")
