"""``pend``: money operations answered PENDING, then settled by the admin or by the simulator's clock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient
from durapay.simulator import Clock, SimulatorAdminError, SimulatorServer, SimulatorState
from tests.simulator.scenario import Scenario
from tests.simulator.support import APPROVE, Receiver, card, order, session
from tests.waiting import wait_until


@pytest.fixture
def scenario(client: GatewayClient, sim: SimulatorServer) -> Scenario:
    # Noon UTC, so that clock moves and "the same day" never straddle midnight while a test runs.
    sim.admin.set_clock(sim.admin.now().strftime("%Y-%m-%dT12:00:00Z"))
    return Scenario(client, sim)


def _moto(client: GatewayClient, order_id: str, pan: str = APPROVE) -> tuple[str, str]:
    answer = client.call(Catalogue.create_moto_order, request={"order": order(order_id), "card": card(pan)})
    return answer.operation.operationId, str(answer.operation.operationResult)


def _read(client: GatewayClient, operation_id: str) -> tuple[str, str, str | None]:
    op = client.call(Catalogue.get_operation, operation_id)
    code = (op.additionalData or {}).get("responseCode")
    return str(op.operationType), str(op.operationResult), None if code is None else str(code)


def _amounts(client: GatewayClient, order_id: str) -> tuple[int | None, int | None]:
    status = client.call(Catalogue.get_order, order_id).orderStatus
    return status.authorizedAmount, status.capturedAmount


def test_a_moto_answered_pending_settles_approved_and_only_then_moves_money(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.pend("create_moto_order")
    operation_id, result = _moto(client, "p-1")
    assert result == "PENDING"
    assert _read(client, operation_id) == ("AUTHORIZATION", "PENDING", None)
    assert _amounts(client, "p-1") == (0, 0)
    assert client.call(Catalogue.get_operation_actions, operation_id).actions == []
    assert [op["operationId"] for op in sim.admin.pending()["operations"]] == [operation_id]
    assert sim.admin.settle_pending() == [operation_id]
    assert _read(client, operation_id) == ("CAPTURE", "EXECUTED", "000")
    assert _amounts(client, "p-1") == (1500, 1500)
    assert sim.admin.pending()["operations"] == []
    assert [step["result"] for step in sim.admin.operations(operation_id=operation_id)[0]["steps"]] == ["PENDING", "EXECUTED"]
    assert _moto(client, "p-2")[1] == "EXECUTED"  # count 1: the next request is final at once


def test_a_pended_payment_takes_its_final_outcome_and_leaves_scripts_for_the_next(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.script_outcomes(["100"], pan=APPROVE)
    sim.admin.pend("create_moto_order", count=2, final="116")
    first, _ = _moto(client, "p-1")
    second, _ = _moto(client, "p-2")
    assert sim.admin.settle_pending(second) == [second]
    assert _read(client, second) == ("AUTHORIZATION", "DECLINED", "116")
    assert _read(client, first)[1] == "PENDING"
    assert sim.admin.settle_pending() == [first]
    assert _read(client, first) == ("AUTHORIZATION", "DECLINED", "116")
    assert _amounts(client, "p-1") == (0, 0)
    assert sim.admin.snapshot()["scripts"] == {f"pan:{APPROVE}": ["100"]}
    assert _moto(client, "p-3")[1] == "DECLINED"  # the script, untouched by the pended ones


@pytest.mark.parametrize(("final", "result", "captured"), [("000", "REFUNDED", 1000), ("FAILED", "FAILED", 1500)])
def test_a_refund_pending_then_settled(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, final: str, result: str, captured: int
) -> None:
    payment = scenario.moto()
    sim.admin.pend("refund_operation", final=final)
    answer = client.call(Catalogue.refund_operation, payment, request={"amount": "500"}, idempotency_key="r-1")
    assert _read(client, answer.operationId) == ("REFUND", "PENDING", None)
    assert _amounts(client, scenario.last_order_id) == (1500, 1500)
    sim.admin.settle_pending(answer.operationId)
    assert _read(client, answer.operationId)[:2] == ("REFUND", result)
    assert _amounts(client, scenario.last_order_id) == (1500, captured)


def test_a_cancel_pending_then_settled_rolls_the_payment_back(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    payment = scenario.moto()
    sim.admin.pend("cancel_operation")
    cancel = client.call(Catalogue.cancel_operation, payment, request={}).operationId
    assert (_read(client, cancel)[:2], _read(client, payment)[1]) == (("CANCEL", "PENDING"), "EXECUTED")
    sim.admin.settle_pending()
    assert (_read(client, cancel)[:2], _read(client, payment)[1]) == (("CANCEL", "EXECUTED"), "CANCELED")
    assert _amounts(client, scenario.last_order_id) == (0, 0)


def test_a_pending_post_operation_that_no_longer_fits_ends_failed(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    authorization = scenario.moto(explicit=True)
    sim.admin.pend("capture_operation")
    held = client.call(Catalogue.capture_operation, authorization, request={}, idempotency_key="c-1").operationId
    captured = client.call(Catalogue.capture_operation, authorization, request={}, idempotency_key="c-2").operationId
    assert _read(client, captured)[:2] == ("CAPTURE", "EXECUTED")
    sim.admin.settle_pending()
    assert _read(client, held)[:2] == ("CAPTURE", "FAILED")
    assert _amounts(client, scenario.last_order_id) == (1500, 1500)


def test_a_keyed_mit_repeated_while_pending_replays_the_pending_answer(client: GatewayClient, sim: SimulatorServer) -> None:
    contract_id = Scenario(client, sim).contract()
    sim.admin.pend("create_mit_order")
    url = sim.base_url + "/orders/mit"
    headers = {"X-Api-Key": sim.config.api_key, "Idempotency-Key": "mit-key"}
    body = {"order": order("mit-1"), "contractId": contract_id}
    first = httpx.post(url, headers=headers, json=body)
    again = httpx.post(url, headers=headers, json=body)
    assert first.json()["operation"]["operationResult"] == "PENDING"
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    [charge] = sim.admin.operations(idempotency_key="mit-key")
    sim.admin.settle_pending(charge["operationId"])
    assert _read(client, charge["operationId"])[:2] == ("CAPTURE", "EXECUTED")
    later = httpx.post(url, headers=headers, json=body)
    assert later.content == first.content  # the first answer, as every replay
    assert len(sim.admin.operations(idempotency_key="mit-key")) == 1


def test_settle_after_settles_by_the_simulators_clock(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    sim.admin.pend("create_moto_order", settle_after=60)
    operation_id, _ = _moto(client, "p-1")
    assert sim.admin.pending()["operations"][0]["settleAfter"] == 60
    sim.admin.advance_clock(30)
    assert _read(client, operation_id)[1] == "PENDING"
    sim.admin.advance_clock(31)  # moving the clock settles what is due before it answers
    assert _read(client, operation_id)[1] == "EXECUTED"
    assert sim.admin.operations(operation_id=operation_id)[0]["steps"][-1]["path"] == "/_sim/clock"


def test_settle_after_also_passes_in_real_time(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    payment = scenario.moto()
    sim.admin.pend("refund_operation", settle_after=0.2)
    refund = client.call(Catalogue.refund_operation, payment, request={}, idempotency_key="r-1").operationId
    wait_until(lambda: _read(client, refund)[1] == "REFUNDED", what="the refund to settle by itself")
    assert _amounts(client, scenario.last_order_id) == (1500, 0)


def test_each_kind_of_money_operation_can_pend(client: GatewayClient, sim: SimulatorServer, scenario: Scenario) -> None:
    original = scenario.original_operation(scenario.reservation())
    for name in ("card_verification", "create_no_show", "svs_pay_operation"):
        sim.admin.pend(name)
    verification = client.call(Catalogue.card_verification, request={"order": order("cv-1", 0), "card": card()}).operation
    no_show = client.call(
        Catalogue.create_no_show,
        request={"originalOperationId": original, "amount": "100", "currency": "EUR"},
        idempotency_key="ns-1",
    ).operation
    init = client.call(Catalogue.svs_init_order, request={"order": order("svs-1"), "card": card()}).operation
    paid = client.call(Catalogue.svs_pay_operation, init.operationId, request={}).operation
    assert [(op.operationType, op.operationResult) for op in (verification, no_show, paid)] == [
        ("CARD_VERIFICATION", "PENDING"),
        ("NOSHOW", "PENDING"),
        ("AUTHORIZATION", "PENDING"),
    ]
    with pytest.raises(BadRequest) as paid_twice:
        client.call(Catalogue.svs_pay_operation, init.operationId, request={})
    assert "PENDING" in paid_twice.value.errors[0].description
    assert len(sim.admin.settle_pending()) == 3
    settled = [_read(client, op.operationId)[:2] for op in (verification, no_show, paid)]
    assert settled == [("CARD_VERIFICATION", "EXECUTED"), ("NOSHOW", "EXECUTED"), ("CAPTURE", "EXECUTED")]


def _bodies(receiver: Receiver, count: int) -> list[dict[str, Any]]:
    bodies = receiver.bodies()
    return bodies if len(bodies) >= count else []


def test_settling_notifies_an_order_with_a_notification_url(
    client: GatewayClient, sim: SimulatorServer, receiver: Receiver
) -> None:
    request = {
        "merchantUrl": "https://shop.example",
        "order": order("bld-1"),
        "paymentSession": session(paymentService="CARDS", notificationUrl=receiver.url),
        "version": "3",
    }
    created = client.call(Catalogue.create_build_order, request=request)
    sim.admin.fill_build_form(created.sessionId)
    sim.admin.pend("build_finalize_payment")
    done = client.call(Catalogue.build_finalize_payment, request={"sessionId": created.sessionId})
    assert done.state == "PAYMENT_COMPLETE" and done.operation is not None
    assert done.operation.operationResult == "PENDING"
    [pending] = wait_until(lambda: _bodies(receiver, 1), what="the PENDING notification")
    assert pending["operation"]["operationResult"] == "PENDING"
    sim.admin.settle_pending()
    _, final = wait_until(lambda: _bodies(receiver, 2), what="the notification of the settled payment")
    assert final["securityToken"] == created.securityToken
    assert (final["operation"]["operationId"], final["operation"]["operationResult"]) == (done.operation.operationId, "EXECUTED")
    state = client.call(Catalogue.build_state, request={"sessionId": created.sessionId})
    assert state.operation is not None and state.operation.operationResult == "EXECUTED"


def test_held_operations_are_kept_in_the_state_snapshot(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.pend("create_moto_order", settle_after=60)
    operation_id, _ = _moto(client, "p-1")
    restored = SimulatorState(Clock())
    restored.restore(sim.admin.snapshot())
    assert list(restored.pending) == [operation_id]
    assert restored.pending[operation_id].settle_after == 60


def test_pend_refuses_what_cannot_pend(sim: SimulatorServer) -> None:
    with pytest.raises(SimulatorAdminError) as unknown:
        sim.admin.pend("create_hpp_order")
    assert unknown.value.status == 400
    assert "'create_hpp_order' cannot answer PENDING" in str(unknown.value)
    assert "create_moto_order" in str(unknown.value) and "create_delay_charge" in str(unknown.value)
    with pytest.raises(SimulatorAdminError, match="unknown outcome"):
        sim.admin.pend("create_moto_order", final="APPROVED")
    with pytest.raises(SimulatorAdminError, match="count"):
        sim.admin.pend("create_moto_order", count=0)
    with pytest.raises(SimulatorAdminError, match="not PENDING"):
        sim.admin.settle_pending("800000000000000001")
    assert sim.admin.pending() == {"rules": [], "operations": []}
