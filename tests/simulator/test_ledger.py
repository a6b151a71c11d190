"""Captures, refunds and cancels: the documented rules and codes, the actions list, the order amounts."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient, GatewayOperation
from durapay.simulator import SimulatorServer
from tests.simulator.scenario import Scenario


@pytest.fixture
def scenario(client: GatewayClient, sim: SimulatorServer) -> Scenario:
    # Noon UTC, so that "the same day" never straddles midnight while a test runs.
    sim.admin.set_clock(sim.admin.now().strftime("%Y-%m-%dT12:00:00Z"))
    return Scenario(client, sim)


def _refuse(client: GatewayClient, op: GatewayOperation[Any], *args: str, code: str, **kwargs: Any) -> None:
    with pytest.raises(BadRequest) as refused:
        client.call(op, *args, **kwargs)
    assert refused.value.codes == (code,), refused.value


def _result(client: GatewayClient, operation_id: str) -> tuple[str, str]:
    op = client.call(Catalogue.get_operation, operation_id)
    return str(op.operationType), str(op.operationResult)


def _amounts(client: GatewayClient, order_id: str) -> tuple[int | None, int | None]:
    status = client.call(Catalogue.get_order, order_id).orderStatus
    return status.authorizedAmount, status.capturedAmount


def _actions(client: GatewayClient, operation_id: str) -> list[tuple[str, int | None, int | None]]:
    answer = client.call(Catalogue.get_operation_actions, operation_id)
    return [(a.actionType, a.minAmount, a.maxAmount) for a in answer.actions]


def test_implicit_capture_is_a_capture_and_explicit_an_authorization(client: GatewayClient, scenario: Scenario) -> None:
    assert _result(client, scenario.moto()) == ("CAPTURE", "EXECUTED")
    assert _amounts(client, scenario.last_order_id) == (1500, 1500)
    assert _result(client, scenario.moto(explicit=True)) == ("AUTHORIZATION", "AUTHORIZED")
    assert _amounts(client, scenario.last_order_id) == (1500, 0)


def test_an_authorization_is_captured_once(client: GatewayClient, scenario: Scenario) -> None:
    auth = scenario.moto(explicit=True)
    order_id = scenario.last_order_id
    assert _actions(client, auth) == [("CAPTURE", 1, 1500), ("REFUND", 1500, 1500)]
    _refuse(client, Catalogue.capture_operation, auth, code="PS0026", request={"amount": "1501"}, idempotency_key="c-0")
    capture = client.call(Catalogue.capture_operation, auth, request={"amount": "1000"}, idempotency_key="c-1")
    assert _result(client, capture.operationId) == ("CAPTURE", "EXECUTED")
    assert _amounts(client, order_id) == (1500, 1000)
    _refuse(client, Catalogue.capture_operation, auth, code="PS0023", request={}, idempotency_key="c-2")
    _refuse(client, Catalogue.capture_operation, capture.operationId, code="PS0023", request={}, idempotency_key="c-3")
    assert _actions(client, capture.operationId) == [("REFUND", 1, 1000), ("CANCEL", 1000, 1000)]


def test_refunds_are_bounded_by_what_was_captured(client: GatewayClient, scenario: Scenario) -> None:
    payment = scenario.moto()
    order_id = scenario.last_order_id
    first = client.call(Catalogue.refund_operation, payment, request={"amount": "600"}, idempotency_key="r-1")
    assert _result(client, first.operationId) == ("REFUND", "REFUNDED")
    _refuse(client, Catalogue.refund_operation, payment, code="PS0029", request={"amount": "901"}, idempotency_key="r-2")
    client.call(Catalogue.refund_operation, payment, request={}, idempotency_key="r-3")  # the rest: 900
    assert _amounts(client, order_id) == (1500, 0)
    _refuse(client, Catalogue.refund_operation, payment, code="PS0027", request={"amount": "1"}, idempotency_key="r-4")
    _refuse(client, Catalogue.refund_operation, first.operationId, code="PS0026", request={}, idempotency_key="r-5")
    assert _actions(client, payment) == []


def test_a_refund_of_an_uncaptured_authorization_is_a_void(client: GatewayClient, scenario: Scenario) -> None:
    auth = scenario.moto(explicit=True)
    void = client.call(Catalogue.refund_operation, auth, request={}, idempotency_key="v-1")
    assert _result(client, void.operationId) == ("VOID", "VOIDED")
    assert _result(client, auth) == ("AUTHORIZATION", "VOIDED")
    assert _amounts(client, scenario.last_order_id) == (0, 0)
    _refuse(client, Catalogue.refund_operation, auth, code="PS0028", request={}, idempotency_key="v-2")
    _refuse(client, Catalogue.capture_operation, auth, code="PS0022", request={}, idempotency_key="v-3")


def test_capture_after_a_refund_is_ps0024(client: GatewayClient, scenario: Scenario) -> None:
    auth = scenario.moto(explicit=True)
    client.call(Catalogue.capture_operation, auth, request={}, idempotency_key="c-1")
    client.call(Catalogue.refund_operation, auth, request={"amount": "100"}, idempotency_key="r-1")
    _refuse(client, Catalogue.capture_operation, auth, code="PS0024", request={}, idempotency_key="c-2")


def test_cancel_applies_to_captures_on_the_same_day_only(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    auth = scenario.moto(explicit=True)
    order_id = scenario.last_order_id
    _refuse(client, Catalogue.cancel_operation, auth, code="PS0026", request={})
    capture = client.call(Catalogue.capture_operation, auth, request={}, idempotency_key="c-1")
    cancel = client.call(Catalogue.cancel_operation, capture.operationId, request={"description": "oops"})
    assert _result(client, cancel.operationId) == ("CANCEL", "EXECUTED")
    assert client.call(Catalogue.get_operation, cancel.operationId).cancelledOperationId == capture.operationId
    assert _result(client, capture.operationId) == ("CAPTURE", "CANCELED")
    assert _amounts(client, order_id) == (1500, 0)
    again = client.call(Catalogue.capture_operation, auth, request={}, idempotency_key="c-2")  # capturable again
    sim.admin.advance_clock(86_400)
    _refuse(client, Catalogue.cancel_operation, again.operationId, code="PS0002", request={})
    assert ("CANCEL", 1500, 1500) not in _actions(client, again.operationId)


def test_cancel_of_an_implicit_payment_rolls_it_back_and_not_after_a_refund(client: GatewayClient, scenario: Scenario) -> None:
    payment = scenario.moto()
    client.call(Catalogue.cancel_operation, payment, request={})
    assert _amounts(client, scenario.last_order_id) == (0, 0)
    refunded = scenario.moto()
    client.call(Catalogue.refund_operation, refunded, request={"amount": "10"}, idempotency_key="r-1")
    _refuse(client, Catalogue.cancel_operation, refunded, code="PS0027", request={})


def test_declined_payments_allow_nothing(client: GatewayClient, scenario: Scenario) -> None:
    declined = scenario.moto(pan="4000000000000002")
    assert _result(client, declined) == ("AUTHORIZATION", "DECLINED")
    assert _actions(client, declined) == []
    _refuse(client, Catalogue.refund_operation, declined, code="PS0026", request={}, idempotency_key="r-1")
    _refuse(client, Catalogue.capture_operation, declined, code="PS0026", request={}, idempotency_key="c-1")
