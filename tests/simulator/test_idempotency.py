"""Idempotency-Key: same key and body replay the first answer without a second operation; anything else is refused."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient, ServerError
from durapay.simulator import SimulatorServer
from tests.simulator.scenario import Scenario
from tests.simulator.support import order


def _mit(client: GatewayClient, contract_id: str, order_id: str, key: str) -> Any:
    return client.call(
        Catalogue.create_mit_order, request={"order": order(order_id), "contractId": contract_id}, idempotency_key=key
    )


def test_same_key_and_body_replays_the_first_answer_without_a_second_operation(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    contract_id = Scenario(client, sim).contract()
    first = _mit(client, contract_id, "mit-1", "key-1")
    again = _mit(client, contract_id, "mit-1", "key-1")
    assert again == first
    charges = sim.admin.operations(idempotency_key="key-1")
    assert [(c["orderId"], c["operationResult"]) for c in charges] == [("mit-1", "EXECUTED")]


def test_a_replay_is_marked_and_byte_identical(sim: SimulatorServer) -> None:
    headers = {"X-Api-Key": sim.config.api_key, "Idempotency-Key": "raw-1"}
    moto = httpx.post(
        sim.base_url + "/orders/moto",
        headers={"X-Api-Key": sim.config.api_key},
        json={"order": order("m-1"), "card": {"pan": "4349940199004549", "expiryDate": "1230"}},
    )
    operation_id = moto.json()["operation"]["operationId"]
    url = f"{sim.base_url}/operations/{operation_id}/refunds"
    first = httpx.post(url, headers=headers, json={"amount": "100"})
    second = httpx.post(url, headers=headers, json={"amount": "100"})
    assert (first.status_code, second.status_code) == (200, 200)
    assert first.content == second.content
    assert "idempotent-replayed" not in first.headers and second.headers["idempotent-replayed"] == "true"
    assert len(sim.admin.operations(operation="refund_operation")) == 1


def test_same_key_with_a_different_body_or_path_is_refused(client: GatewayClient, sim: SimulatorServer) -> None:
    contract_id = Scenario(client, sim).contract()
    _mit(client, contract_id, "mit-1", "key-1")
    with pytest.raises(BadRequest) as different_body:
        _mit(client, contract_id, "mit-2", "key-1")
    assert different_body.value.codes == ("PS0025",)
    assert "reused with a different request" in different_body.value.errors[0].description
    operation_id = sim.admin.operations(order_id="mit-1")[0]["operationId"]
    with pytest.raises(BadRequest) as different_path:
        client.call(Catalogue.refund_operation, operation_id, request={}, idempotency_key="key-1")
    assert different_path.value.codes == ("PS0025",)
    assert len(sim.admin.operations(operation="create_mit_order")) == 1
    assert sim.admin.operations(operation="refund_operation") == []


def test_a_business_refusal_is_replayed_too(client: GatewayClient, sim: SimulatorServer) -> None:
    operation_id = Scenario(client, sim).moto()
    for _ in range(2):
        with pytest.raises(BadRequest) as refused:
            client.call(Catalogue.capture_operation, operation_id, request={}, idempotency_key="cap-1")
        assert refused.value.codes == ("PS0023",)


@pytest.mark.parametrize(("headers", "reason"), [({}, "no Idempotency-Key"), ({"Idempotency-Key": "k" * 64}, "64 characters")])
def test_a_missing_or_too_long_key_is_ps0025(sim: SimulatorServer, headers: dict[str, str], reason: str) -> None:
    response = httpx.post(sim.base_url + "/operations/1/refunds", headers={"X-Api-Key": sim.config.api_key, **headers}, json={})
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["code"] == "PS0025" and reason in error["description"]


def test_a_key_on_an_operation_that_takes_none_is_ignored(sim: SimulatorServer) -> None:
    headers = {"X-Api-Key": sim.config.api_key, "Idempotency-Key": "ignored"}
    body = {"order": order("m-1"), "card": {"pan": "4349940199004549", "expiryDate": "1230"}}
    assert httpx.post(sim.base_url + "/orders/moto", headers=headers, json=body).status_code == 200
    body["order"]["orderId"] = "m-2"
    assert httpx.post(sim.base_url + "/orders/moto", headers=headers, json=body).status_code == 200


def test_a_duplicate_sent_while_the_first_is_in_flight_waits_and_replays(client: GatewayClient, sim: SimulatorServer) -> None:
    contract_id = Scenario(client, sim).contract()
    sim.admin.set_faults(mode="latency", operation="create_mit_order", latency_ms=300)
    answers: list[Any] = []

    def send() -> None:
        answers.append(_mit(client, contract_id, "mit-c", "key-c"))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(answers) == 4 and all(answer == answers[0] for answer in answers)
    assert len(sim.admin.operations(idempotency_key="key-c")) == 1


def test_an_error_before_the_operation_ran_stores_nothing_so_a_resend_acts(client: GatewayClient, sim: SimulatorServer) -> None:
    contract_id = Scenario(client, sim).contract()
    sim.admin.set_faults(mode="error", status=503, operation="create_mit_order", count=1)
    with pytest.raises(ServerError):
        _mit(client, contract_id, "mit-e", "key-e")
    assert sim.admin.operations(idempotency_key="key-e") == []
    assert _mit(client, contract_id, "mit-e", "key-e").operation.operationResult == "EXECUTED"
    assert len(sim.admin.operations(idempotency_key="key-e")) == 1
