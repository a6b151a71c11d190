"""The embedded form: states of versions 1, 2 and 3, the 3DS (GDI) step, cancel, and expiry after 5 minutes."""

from __future__ import annotations

import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient, NotFound
from durapay.simulator import SimulatorServer
from tests.simulator.scenario import Scenario
from tests.simulator.support import CHALLENGE, THREEDS_FAIL, order, session


@pytest.fixture
def scenario(client: GatewayClient, sim: SimulatorServer) -> Scenario:
    return Scenario(client, sim)


def _state(client: GatewayClient, session_id: str) -> str:
    return str(client.call(Catalogue.build_state, request={"sessionId": session_id}).state)


def _refused(client: GatewayClient, op_name: str, session_id: str) -> str:
    op = getattr(Catalogue, op_name)
    with pytest.raises(BadRequest) as refused:
        client.call(op, request={"sessionId": session_id})
    assert refused.value.codes == ("PS0026",)
    return refused.value.errors[0].description


@pytest.mark.parametrize("version", ["1", "3"])
def test_frictionless_form_then_finalize(client: GatewayClient, sim: SimulatorServer, scenario: Scenario, version: str) -> None:
    session_id = scenario.build(version)
    assert _state(client, session_id) == "CARD_DATA_COLLECTION"
    assert "READY_FOR_PAYMENT" in _refused(client, "build_finalize_payment", session_id)
    assert sim.admin.fill_build_form(session_id) == "READY_FOR_PAYMENT"
    done = client.call(Catalogue.build_finalize_payment, request={"sessionId": session_id})
    assert done.state == "PAYMENT_COMPLETE" and done.operation is not None
    assert (done.operation.operationType, done.operation.operationResult) == ("CAPTURE", "EXECUTED")
    assert "paid with finalize_payment" in _refused(client, "build_confirm_payment", session_id)


def test_version_3_challenge_goes_through_gdi_before_finalize(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    session_id = scenario.build("3")
    assert sim.admin.fill_build_form(session_id, pan=CHALLENGE, complete_gdi=False) == "GDI_VERIFICATION"
    assert sim.admin.complete_build_gdi(session_id) == "READY_FOR_PAYMENT"
    done = client.call(Catalogue.build_finalize_payment, request={"sessionId": session_id})
    assert done.operation is not None and done.operation.operationResult == "EXECUTED"


def test_version_2_confirm_returns_the_gdi_field_then_the_customer_completes_it(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    session_id = scenario.build("2", filled=True, pan=CHALLENGE)
    assert "confirm_payment" in _refused(client, "build_finalize_payment", session_id)
    confirmed = client.call(Catalogue.build_confirm_payment, request={"sessionId": session_id, "amount": "1200"})
    assert confirmed.state == "GDI_VERIFICATION" and confirmed.fieldSet is not None
    [gdi] = confirmed.fieldSet.fields
    assert gdi.type == "GDI" and gdi.src and gdi.src.endswith(f"/_sim/build/{session_id}/gdi")
    assert sim.admin.complete_build_gdi(session_id) == "PAYMENT_COMPLETE"
    state = client.call(Catalogue.build_state, request={"sessionId": session_id})
    assert state.operation is not None and (state.operation.operationResult, state.operation.operationAmount) == (
        "EXECUTED",
        1200,
    )


def test_a_3ds_failing_card_ends_threeds_failed(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    session_id = scenario.build("1", filled=True, pan=THREEDS_FAIL)
    done = client.call(Catalogue.build_finalize_payment, request={"sessionId": session_id})
    assert done.operation is not None and done.operation.operationResult == "THREEDS_FAILED"


def test_card_data_and_integrity(client: GatewayClient, scenario: Scenario) -> None:
    session_id = scenario.build("3")
    assert "no card data" in _refused(client, "build_card_data", session_id)
    card_data = client.call(Catalogue.build_card_data, request={"sessionId": scenario.build("3", filled=True, pan=CHALLENGE)})
    assert (card_data.bin, card_data.lastFourDigits, card_data.expiringDate, card_data.circuit) == (
        "518615",
        "5008",
        "1230",
        "MC",
    )
    assert client.call(Catalogue.build_integrity, request={"sessionId": session_id}).integrityCheck == "OK"
    with pytest.raises(NotFound):
        client.call(Catalogue.build_state, request={"sessionId": "S-unknown"})


def test_cancel_completes_the_session_with_a_cancel_operation(client: GatewayClient, scenario: Scenario) -> None:
    session_id = scenario.build("3")
    cancelled = client.call(Catalogue.build_cancel, request={"sessionId": session_id})
    assert cancelled.state == "PAYMENT_COMPLETE" and cancelled.operation is not None
    assert (cancelled.operation.operationType, cancelled.operation.operationResult) == ("CANCEL", "CANCELED")
    assert "already complete" in _refused(client, "build_cancel", session_id)


def test_a_session_expires_after_five_minutes_of_simulator_time(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    session_id = scenario.build("3")
    sim.admin.advance_clock(299)
    assert _state(client, session_id) == "CARD_DATA_COLLECTION"
    sim.admin.advance_clock(2)
    expired = client.call(Catalogue.build_state, request={"sessionId": session_id})
    assert expired.state == "PAYMENT_COMPLETE" and expired.operation is not None
    assert expired.operation.operationResult == "EXPIRED"
    assert "expired" in _refused(client, "build_finalize_payment", session_id)
    assert client.call(Catalogue.build_integrity, request={"sessionId": session_id}).integrityCheck == "KO"


def test_an_apm_session_redirects_to_an_external_page_that_pays(client: GatewayClient, sim: SimulatorServer) -> None:
    request = {"merchantUrl": "https://shop.example", "order": order("apm-1"), "paymentSession": session(paymentService="PAYPAL")}
    created = client.call(Catalogue.create_build_order, request=request)
    assert created.state == "REDIRECTED_TO_EXTERNAL_DOMAIN" and created.url and "/_sim/build/" in created.url
    assert sim.admin.fill_build_form(created.sessionId) == "PAYMENT_COMPLETE"
    state = client.call(Catalogue.build_state, request={"sessionId": created.sessionId})
    assert state.operation is not None and (state.operation.paymentMethod, state.operation.paymentCircuit) == ("APM", "PAYPAL")
