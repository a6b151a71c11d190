"""Acceptance: the real gateway client drives every catalogue operation against the running simulator.

Each operation has one case: it builds the prerequisites through the API, calls the operation with a
valid request and checks the typed answer says what the simulator promised. A catalogue entry without
a case fails the test, so the simulator cannot silently fall behind the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from durapay.gateway import CATALOGUE, BinaryResponse, Catalogue, GatewayClient
from durapay.simulator import SimulatorServer
from tests.simulator.scenario import Scenario
from tests.simulator.support import APPROVE, CHALLENGE, card, order, session


@dataclass
class Case:
    args: tuple[str, ...] = ()
    request: dict[str, Any] | None = None
    key: str | None = None
    check: Callable[[Any], bool] = field(default=lambda answer: True)


def _pbl(s: Scenario) -> Case:
    request = {"order": order(s.new_id("o")), "paymentSession": session(), "expirationDate": s.today_plus(5)}
    return Case(request=request, check=lambda a: a.paymentLink.status == "ACTIVE" and "/_sim/link/" in a.paymentLink.link)


def _three_steps_validation(s: Scenario) -> Case:
    init = s.client.call(Catalogue.three_steps_init, request={"order": order(s.new_id("o")), "card": card(CHALLENGE)})
    pares = s.sim.admin.acs_challenge(init.operation.operationId, init.threeDSAuthRequest or "")
    request = {"operationId": init.operation.operationId, "threeDSAuthResponse": pares}
    return Case(request=request, check=lambda a: a.operation.operationResult == "THREEDS_VALIDATED")


def _three_steps_payment(s: Scenario) -> Case:
    order_id = s.new_id("o")
    init = s.client.call(Catalogue.three_steps_init, request={"order": order(order_id), "card": card()})
    request = {"operationId": init.operation.operationId, "order": order(order_id), "card": card()}
    return Case(request=request, check=lambda a: a.operation.operationResult == "EXECUTED")


def _svs_pay(s: Scenario) -> Case:
    init = s.client.call(Catalogue.svs_init_order, request={"order": order(s.new_id("o")), "card": card()})
    return Case(args=(init.operation.operationId,), request={}, check=lambda a: a.operation.operationResult == "EXECUTED")


def _build_case(version: str, *, filled: bool, check: Callable[[Any], bool]) -> Callable[[Scenario], Case]:
    def make(s: Scenario) -> Case:
        return Case(request={"sessionId": s.build(version, filled=filled)}, check=check)

    return make


def _charge(kind: str) -> Callable[[Scenario], Case]:
    def make(s: Scenario) -> Case:
        original = s.original_operation(s.reservation())
        request = {"originalOperationId": original, "amount": "1200", "currency": "EUR", "description": kind}
        return Case(request=request, key=s.new_id("key"), check=lambda a: a.operation.operationType == kind)

    return make


def _validation(s: Scenario) -> Case:
    return Case(request={"reservationId": s.reservation(), "amount": "3000", "currency": "EUR"})


def _custom_field(owner: str) -> Callable[[Scenario], Case]:
    def make(s: Scenario) -> Case:
        owner_id = s.structure() if owner == "structureId" else s.agency()
        request = {owner: owner_id, "customFieldTitle": "Room", "customFieldOrd": 1, "customFieldEnabled": True}
        return Case(request=request, check=lambda a: bool(a.customFieldId))

    return make


def _get_custom_field(create: str, owner: str) -> Callable[[Scenario], Case]:
    def make(s: Scenario) -> Case:
        owner_id = s.structure() if owner == "structureId" else s.agency()
        created = s.client.call(getattr(Catalogue, create), request={owner: owner_id, "customFieldTitle": "Room"})
        return Case(args=(created.customFieldId,), check=lambda a: a.customFieldTitle == "Room")

    return make


def _structure_condition(s: Scenario) -> tuple[str, str]:
    """(structure id, condition id)"""
    structure_id = s.structure()
    body = {"structureId": structure_id, "name": "Flexible", "termsAndConditions": s.condition_texts()}
    return structure_id, s.client.call(Catalogue.create_structure_condition, request=body).structureConditionId


def _agency_condition(s: Scenario) -> tuple[str, str]:
    """(agency id, condition id)"""
    agency_id = s.agency()
    body = {"agencyId": agency_id, "name": "Agency terms", "termsAndConditions": s.condition_texts()}
    return agency_id, s.client.call(Catalogue.create_agency_condition, request=body).agencyConditionId


def _list_conditions(make: Callable[[Scenario], tuple[str, str]], id_field: str) -> Callable[[Scenario], Case]:
    def case(s: Scenario) -> Case:
        owner_id, condition_id = make(s)
        return Case(args=(owner_id,), check=lambda a: [getattr(c, id_field) for c in a.conditions] == [condition_id])

    return case


def _terms(s: Scenario) -> str:
    body = {"name": "General", "termsAndConditions": [{"language": "eng", "text": "PHA+VGVybXM8L3A+"}]}
    return s.client.call(Catalogue.create_terms_and_conditions, request=body).termsAndConditionsId


CASES: dict[str, Callable[[Scenario], Case]] = {
    "create_hpp_order": lambda s: Case(
        request={"order": order(s.new_id("o")), "paymentSession": session()},
        check=lambda a: "/_sim/hpp/" in a.hostedPage and len(a.securityToken) == 32,
    ),
    "create_paybylink_v3": _pbl,
    "create_paybylink_v2": _pbl,
    "create_paybylink_v1": _pbl,
    "create_paybylink": _pbl,
    "cancel_paybylink": lambda s: Case(args=(s.link(),)),
    "list_paybylinks_v3": lambda s: (s.link(), Case(request={"maxRecords": 10}, check=lambda a: len(a.paymentLinks) == 1))[1],
    "get_paybylink_v3": lambda s: (lid := s.link(), Case(args=(lid,), check=lambda a: a.paymentLink.linkId == lid))[1],
    "list_paybylinks": lambda s: (s.link(), Case(request={"status": "ACTIVE"}, check=lambda a: len(a.paymentLinks) == 1))[1],
    "get_paybylink": lambda s: (lid := s.link(), Case(args=(lid,), check=lambda a: a.paymentLink.status == "ACTIVE"))[1],
    "renew_paybylink": lambda s: Case(
        args=(s.link(),),
        request={"expirationDate": s.today_plus(20)},
        check=lambda a: a.paymentLink.expirationDate == s.today_plus(20),
    ),
    "modify_paybylink_v3": lambda s: Case(
        args=(s.link(),), request={"amount": "900"}, check=lambda a: a.paymentLink.amount == 900
    ),
    "export_paybylinks_v3": lambda s: (
        s.link(),
        Case(args=("csv",), request={}, check=lambda a: a.mediaType == "text/csv" and a.content.startswith(b"linkId,")),
    )[1],
    "paybylink_qrcode_v3": lambda s: Case(
        args=(s.link(),), request={"size": 3}, check=lambda a: a.content.startswith(b"\x89PNG\r\n\x1a\n")
    ),
    "svs_init_order": lambda s: Case(
        request={"order": order(s.new_id("o")), "card": card()}, check=lambda a: a.operation.operationResult == "PENDING"
    ),
    "svs_pay_operation": _svs_pay,
    "three_steps_init": lambda s: Case(
        request={"order": order(s.new_id("o")), "card": card(CHALLENGE)},
        check=lambda a: a.threeDSEnrollmentStatus == "ENROLLED" and a.threeDSAuthUrl.endswith("/_sim/acs"),
    ),
    "three_steps_validation": _three_steps_validation,
    "three_steps_payment": _three_steps_payment,
    "create_mit_order": lambda s: Case(
        request={"order": order(s.new_id("o")), "contractId": s.contract()},
        key=s.new_id("key"),
        check=lambda a: a.operation.operationResult == "EXECUTED",
    ),
    "card_verification": lambda s: Case(
        request={"order": order(s.new_id("o"), 0), "card": card()},
        check=lambda a: (a.operation.operationType, a.operation.operationResult) == ("CARD_VERIFICATION", "EXECUTED"),
    ),
    "create_moto_order": lambda s: Case(
        request={"order": order(s.new_id("o")), "card": card()}, check=lambda a: a.operation.operationType == "CAPTURE"
    ),
    "wallet_pay": lambda s: Case(
        request={"order": order(s.new_id("o")), "walletPaymentData": {"wallet": "APPLE_PAY"}},
        check=lambda a: a.operation.paymentCircuit == "APPLE_PAY",
    ),
    "create_build_order": lambda s: Case(
        request={
            "merchantUrl": "https://shop.example",
            "order": order(s.new_id("o")),
            "paymentSession": session(),
            "version": "2",
        },
        check=lambda a: a.state == "PAYMENT_METHOD_SELECTION" and len(a.fields) == 5,
    ),
    "build_finalize_payment": _build_case(
        "3", filled=True, check=lambda a: a.state == "PAYMENT_COMPLETE" and a.operation.operationResult == "EXECUTED"
    ),
    "build_cancel": _build_case("3", filled=False, check=lambda a: a.operation.operationResult == "CANCELED"),
    "build_state": _build_case("3", filled=False, check=lambda a: a.state == "CARD_DATA_COLLECTION"),
    "build_card_data": _build_case(
        "3", filled=True, check=lambda a: (a.bin, a.lastFourDigits, a.circuit) == (APPROVE[:6], APPROVE[-4:], "VISA")
    ),
    "build_integrity": _build_case("3", filled=False, check=lambda a: a.integrityCheck == "OK"),
    "build_confirm_payment": _build_case("2", filled=True, check=lambda a: a.state == "PAYMENT_COMPLETE"),
    "list_orders": lambda s: (s.moto(), Case(request={"maxRecords": 5}, check=lambda a: len(a.orders) == 1))[1],
    "get_order": lambda s: (s.moto(), Case(args=(s.last_order_id,), check=lambda a: a.orderStatus.capturedAmount == 1500))[1],
    "list_operations": lambda s: (s.moto(), Case(request={"operationType": "CAPTURE"}, check=lambda a: len(a.operations) == 1))[
        1
    ],
    "get_operation": lambda s: (op := s.moto(), Case(args=(op,), check=lambda a: a.operationId == op))[1],
    "get_operation_actions": lambda s: Case(
        args=(s.moto(explicit=True),), check=lambda a: [x.actionType for x in a.actions] == ["CAPTURE", "REFUND"]
    ),
    "refund_operation": lambda s: Case(args=(s.moto(),), request={"amount": "500", "currency": "EUR"}, key=s.new_id("key")),
    "capture_operation": lambda s: Case(args=(s.moto(explicit=True),), request={}, key=s.new_id("key")),
    "cancel_operation": lambda s: Case(args=(s.moto(),), request={"description": "same day"}),
    "get_customer_contracts": lambda s: (
        cid := s.contract("cust-9"),
        Case(args=("cust-9",), check=lambda a: [c.contractId for c in a.contracts] == [cid]),
    )[1],
    "deactivate_contract": lambda s: Case(args=(s.contract(),)),
    "list_payment_methods": lambda s: Case(check=lambda a: {"VISA", "MC"} <= {m.circuit for m in a.paymentMethods}),
    "get_exchange_rates": lambda s: Case(
        request={"currency": "USD"},
        check=lambda a: [(r.currency, r.exchangeRate) for r in a.exchangeRates] == [("USD", "1.0850")],
    ),
    "create_structure": lambda s: Case(request={"structure": {"structureId": s.new_id("st"), "structureName": "Hotel"}}),
    "list_structures": lambda s: (s.structure(), Case(check=lambda a: len(a.structure) == 1))[1],
    "get_structure": lambda s: (sid := s.structure(), Case(args=(sid,), check=lambda a: a.structure.structureId == sid))[1],
    "create_reservation": lambda s: Case(
        request={
            "reservation": {
                "reservationId": s.new_id("r"),
                "amount": "10000",
                "currency": "EUR",
                "reservationType": "GUARANTEED_NOSHOW",
            }
        },
        check=lambda a: bool(a.reservationId),
    ),
    "list_reservations": lambda s: (
        s.reservation(paid=False),
        Case(request={"customerSurnameReservation": "Lovelace"}, check=lambda a: len(a.reservation) == 1),
    )[1],
    "get_reservation": lambda s: Case(args=(s.reservation(),), check=lambda a: a.reservationStatus.capturedAmount == 5000),
    "create_reservation_paybylink": lambda s: Case(
        args=(s.reservation(paid=False),), request={"captureType": "EXPLICIT"}, check=lambda a: a.paymentLink.amount == 5000
    ),
    "create_no_show": _charge("NOSHOW"),
    "create_incremental": _charge("INCREMENTAL"),
    "create_delay_charge": _charge("DELAY_CHARGE"),
    "create_terms_and_conditions": lambda s: Case(
        request={"name": "General", "termsAndConditions": []}, check=lambda a: bool(a.termsAndConditionsId)
    ),
    "list_terms_and_conditions": lambda s: (_terms(s), Case(check=lambda a: len(a.termsAndConditions) == 1))[1],
    "get_terms_and_conditions": lambda s: Case(args=(_terms(s),), check=lambda a: a.name == "General"),
    "cancel_terms_and_conditions": lambda s: Case(args=(_terms(s),)),
    "create_structure_condition": lambda s: Case(
        request={"structureId": s.structure(), "name": "Strict", "termsAndConditions": s.condition_texts()}
    ),
    "list_structure_conditions": _list_conditions(_structure_condition, "structureConditionId"),
    "get_structure_condition": lambda s: Case(args=(_structure_condition(s)[1],), check=lambda a: a.name == "Flexible"),
    "cancel_structure_condition": lambda s: Case(args=(_structure_condition(s)[1],)),
    "create_structure_custom_field": _custom_field("structureId"),
    "get_structure_custom_field": _get_custom_field("create_structure_custom_field", "structureId"),
    "create_agency_condition": lambda s: Case(
        request={"agencyId": s.agency(), "name": "Agency", "termsAndConditions": s.condition_texts()}
    ),
    "list_agency_conditions": _list_conditions(_agency_condition, "agencyConditionId"),
    "get_agency_condition": lambda s: Case(args=(_agency_condition(s)[1],), check=lambda a: a.name == "Agency terms"),
    "cancel_agency_condition": lambda s: Case(args=(_agency_condition(s)[1],)),
    "get_agency_condition_pdf": lambda s: Case(
        args=(_agency_condition(s)[1],),
        check=lambda a: (
            a.mediaType == "application/pdf" and a.content.startswith(b"%PDF-1.4") and a.content.rstrip().endswith(b"%%EOF")
        ),
    ),
    "create_agency": lambda s: Case(request={"agency": {"agencyId": s.new_id("ag"), "agencyName": "Travel"}}),
    "list_agencies": lambda s: (s.agency(), Case(check=lambda a: len(a.agency) == 1))[1],
    "get_agency": lambda s: (aid := s.agency(), Case(args=(aid,), check=lambda a: a.agency.agencyId == aid))[1],
    "create_agency_custom_field": _custom_field("agencyId"),
    "get_agency_custom_field": _get_custom_field("create_agency_custom_field", "agencyId"),
    "validate_incremental": _validation,
    "validate_no_show": _validation,
    "validate_delay_charge": _validation,
    "set_reservation_service": lambda s: Case(request={"serviceName": "DISPUTELESS", "terminalId": "T1", "enabled": "Y"}),
    "list_reservation_services": lambda s: (
        s.client.call(
            Catalogue.set_reservation_service, request={"serviceName": "DISPUTELESS", "terminalId": "T1", "enabled": "N"}
        ),
        Case(
            request={"terminalId": "T1"},
            check=lambda a: [(x.serviceName, x.enabled) for x in a.services] == [("DISPUTELESS", "N")],
        ),
    )[1],
    "validate_no_show_earlier": _validation,
    "validate_delay_charge_earlier": _validation,
    "validate_incremental_earlier": _validation,
    "create_custom_field_earlier": _custom_field("structureId"),
    "get_custom_field_earlier": _get_custom_field("create_custom_field_earlier", "structureId"),
    "create_reservation_mit_earlier": lambda s: Case(
        args=(s.reservation(),), request={"amount": "2500", "currency": "EUR"}, key=s.new_id("key")
    ),
}


def test_every_catalogue_operation_has_a_case() -> None:
    assert sorted(CASES) == sorted(op.name for op in CATALOGUE)


@pytest.mark.parametrize("op", CATALOGUE, ids=lambda op: op.name)
def test_every_operation_answers_a_well_formed_typed_response(op: Any, client: GatewayClient, sim: SimulatorServer) -> None:
    case = CASES[op.name](Scenario(client, sim))
    answer = client.call(op, *case.args, request=case.request, idempotency_key=case.key)
    assert isinstance(answer, op.response)
    assert case.check(answer), f"{op.name}: unexpected answer {answer!r}"
    if issubclass(op.response, BinaryResponse):
        assert answer.content


def test_operations_made_through_the_catalogue_are_all_recorded(client: GatewayClient, sim: SimulatorServer) -> None:
    scenario = Scenario(client, sim)
    operation_id = scenario.moto(explicit=True)
    client.call(Catalogue.capture_operation, operation_id, request={"amount": "700"}, idempotency_key="cap-1")
    recorded = sim.admin.operations(order_id=scenario.last_order_id)
    assert [(r["operation"], r["operationType"], r["amount"], r["idempotencyKey"]) for r in recorded] == [
        ("create_moto_order", "AUTHORIZATION", 1500, None),
        ("capture_operation", "CAPTURE", 700, "cap-1"),
    ]
