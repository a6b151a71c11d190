"""Reservations: pay-by-link, validations, no-show / incremental / delayed charges, earlier MIT, lists."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient, GatewayOperation
from durapay.simulator import SimulatorServer
from tests.simulator.scenario import Scenario


@pytest.fixture
def scenario(client: GatewayClient, sim: SimulatorServer) -> Scenario:
    return Scenario(client, sim)


def _validate(client: GatewayClient, reservation_id: str, amount: int, currency: str = "EUR") -> tuple[str, ...]:
    request = {"reservationId": reservation_id, "amount": str(amount), "currency": currency}
    try:
        client.call(Catalogue.validate_no_show, request=request)
        client.call(Catalogue.validate_incremental_earlier, request=request)
    except BadRequest as refused:
        return refused.codes
    return ()


def test_the_reservation_link_charges_the_deposit_and_becomes_the_original_operation(
    client: GatewayClient, scenario: Scenario
) -> None:
    reservation_id = scenario.reservation()
    looked_up = client.call(Catalogue.get_reservation, reservation_id)
    assert (looked_up.reservationStatus.authorizedAmount, looked_up.reservationStatus.capturedAmount) == (5000, 5000)
    assert [link.status for link in looked_up.paymentLinks] == ["PAID"]
    with pytest.raises(BadRequest) as paid:
        client.call(Catalogue.create_reservation_paybylink, reservation_id, request={})
    assert paid.value.codes == ("PS0042",)


def test_a_guaranteed_reservation_verifies_the_card_without_charging(client: GatewayClient, scenario: Scenario) -> None:
    reservation_id = scenario.reservation(reservation_type="GUARANTEED_NOSHOW")
    [op] = client.call(Catalogue.get_reservation, reservation_id).operations
    assert (op.operationType, op.operationResult, op.operationAmount) == ("CARD_VERIFICATION", "EXECUTED", 0)
    no_show = client.call(
        Catalogue.create_no_show,
        request={"originalOperationId": op.operationId, "amount": "20000", "currency": "EUR"},
        idempotency_key="ns-1",
    )
    assert (no_show.operation.operationType, no_show.operation.operationResult) == ("NOSHOW", "EXECUTED")
    assert _validate(client, reservation_id, 20000) == ()


def test_validations_need_a_paid_original_and_an_acceptable_amount(scenario: Scenario, client: GatewayClient) -> None:
    unpaid = scenario.reservation(paid=False)
    paid = scenario.reservation(amount=20000)
    assert _validate(client, unpaid, 100) == ("PS0026",)
    assert _validate(client, paid, 100) == ()
    assert _validate(client, paid, 20000) == ()
    assert _validate(client, paid, 20001) == ("PS0026",)
    assert _validate(client, paid, 100, "USD") == ("PS0009",)
    assert _validate(client, "no-such", 100) == ("PS0026",)


def test_charges_against_the_original_operation(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    original = scenario.original_operation(scenario.reservation())
    results = []
    for op, kind in ((Catalogue.create_incremental, "INCREMENTAL"), (Catalogue.create_delay_charge, "DELAY_CHARGE")):
        request = {"originalOperationId": original, "amount": "700", "currency": "EUR", "description": "minibar"}
        answer = client.call(op, request=request, idempotency_key=f"charge-{kind}")
        results.append((answer.operation.operationType, answer.operation.operationResult, answer.operation.operationAmount))
    assert results == [("INCREMENTAL", "EXECUTED", 700), ("DELAY_CHARGE", "EXECUTED", 700)]
    sim.admin.script_outcomes(["116"], pan="4349940199004549")
    declined = client.call(
        Catalogue.create_no_show,
        request={"originalOperationId": original, "amount": "100", "currency": "EUR"},
        idempotency_key="ns-1",
    )
    assert (declined.operation.operationType, declined.operation.operationResult) == ("NOSHOW", "DECLINED")
    with pytest.raises(BadRequest) as wrong_currency:
        client.call(
            Catalogue.create_delay_charge,
            request={"originalOperationId": original, "amount": "1", "currency": "GBP"},
            idempotency_key="dc-2",
        )
    assert wrong_currency.value.codes == ("PS0009",)


def test_the_earlier_mit_charges_the_reservation_card(client: GatewayClient, scenario: Scenario) -> None:
    reservation_id = scenario.reservation()
    client.call(Catalogue.create_reservation_mit_earlier, reservation_id, request={"amount": "3000"}, idempotency_key="rm-1")
    status = client.call(Catalogue.get_reservation, reservation_id).reservationStatus
    assert status.capturedAmount == 8000


def test_the_reservation_list_filters(client: GatewayClient, scenario: Scenario) -> None:
    first = scenario.reservation(paid=False)
    scenario.reservation(paid=False, reservation_type="BUNDLE")
    found = client.call(Catalogue.list_reservations, request={"reservationType": "PREPAID_REFUNDABLE"}).reservation
    assert [r.reservationId for r in found] == [first]
    by_structure = client.call(Catalogue.list_reservations, request={"structureName": "hotel str", "maxRecords": 1}).reservation
    assert len(by_structure) == 1
    with pytest.raises(BadRequest):
        client.call(Catalogue.list_reservations, request={"dateType": "SOMEDAY"})


def test_terms_in_use_by_a_paid_reservation_cannot_be_cancelled(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    terms_id = client.call(
        Catalogue.create_terms_and_conditions, request={"name": "T", "termsAndConditions": []}
    ).termsAndConditionsId
    body = {"reservation": {"reservationId": "r-tc", "amount": "100", "currency": "EUR", "termsAndConditionsIds": [terms_id]}}
    client.call(Catalogue.create_reservation, request=body)
    link = client.call(Catalogue.create_reservation_paybylink, "r-tc", request={})
    sim.admin.complete_link(link.paymentLink.linkId)
    with pytest.raises(BadRequest):
        client.call(Catalogue.cancel_terms_and_conditions, terms_id)
    other = client.call(
        Catalogue.create_terms_and_conditions, request={"name": "U", "termsAndConditions": []}
    ).termsAndConditionsId
    client.call(Catalogue.cancel_terms_and_conditions, other)
    client.call(Catalogue.cancel_terms_and_conditions, other)  # repeatable
    assert client.call(Catalogue.get_terms_and_conditions, other).status == "CANCELED"


def test_references_to_unknown_objects_are_refused(client: GatewayClient) -> None:
    cases: list[tuple[GatewayOperation[Any], dict[str, Any], str]] = [
        (
            Catalogue.create_reservation,
            {"reservation": {"reservationId": "r-x", "amount": "1", "currency": "EUR", "structureId": "nope"}},
            "reservation.structureId",
        ),
        (Catalogue.create_structure_condition, {"structureId": "nope", "name": "n"}, "structureId"),
        (Catalogue.create_agency_custom_field, {"agencyId": "nope", "customFieldTitle": "t"}, "agencyId"),
        (Catalogue.set_reservation_service, {"serviceName": "OTHER", "enabled": "Y"}, "serviceName"),
    ]
    for op, request, field in cases:
        with pytest.raises(BadRequest) as refused:
            client.call(op, request=request)
        assert refused.value.codes == ("PS0026",) and field in refused.value.errors[0].description
