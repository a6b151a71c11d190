"""The protocol around every operation: API key, cid, routing, JSON and field errors, error-code families."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from durapay.config import GatewaySettings
from durapay.gateway import BadRequest, Catalogue, GatewayClient, NotFound, Unauthorized
from durapay.simulator import SimulatorServer
from durapay.simulator._app import all_handlers, routing_order
from tests.simulator.scenario import Scenario
from tests.simulator.support import card, order, session


@pytest.fixture
def raw(sim: SimulatorServer) -> Iterator[httpx.Client]:
    """A plain HTTP client with the API key: for requests the typed client refuses to send."""
    with httpx.Client(base_url=sim.base_url, headers={"X-Api-Key": sim.config.api_key}) as http:
        yield http


def test_every_catalogue_operation_has_a_handler() -> None:
    assert len(all_handlers()) == 83


def test_literal_paths_are_routed_before_parameterised_ones() -> None:
    ordered = routing_order()
    for op in ordered:
        concrete = re.sub(r"\{\w+\}", "sample", op.path)
        first = next(
            other
            for other in ordered
            if other.method == op.method and re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", other.path), concrete)
        )
        assert first is op, f"{op.method} {concrete} would reach {first.name} before {op.name}"


def test_literal_list_paths_answer_lists_not_lookups(client: GatewayClient) -> None:
    assert client.call(Catalogue.list_paybylinks, request={}).paymentLinks == []
    assert client.call(Catalogue.list_reservation_services, request={}).services == []


def test_a_missing_or_wrong_api_key_is_401_without_body(sim: SimulatorServer) -> None:
    for headers in ({}, {"X-Api-Key": "wrong"}):
        response = httpx.get(sim.base_url + "/payment_methods", headers=headers)
        assert (response.status_code, response.content) == (401, b"")
    with GatewayClient(GatewaySettings(base_url=sim.base_url, api_key="wrong")) as client, pytest.raises(Unauthorized):
        client.call(Catalogue.list_payment_methods)


def test_every_answer_carries_a_fresh_cid_and_accepts_any_correlation_id(raw: httpx.Client) -> None:
    first = raw.get("/payment_methods", headers={"Correlation-Id": "ngGFbpHStk"})
    second = raw.get("/orders/unknown")
    assert first.status_code == 200 and second.status_code == 404
    assert uuid.UUID(first.headers["cid"]) != uuid.UUID(second.headers["cid"])


def test_unknown_order_operation_and_path_are_404_without_body(client: GatewayClient, raw: httpx.Client) -> None:
    with pytest.raises(NotFound):
        client.call(Catalogue.get_order, "nope")
    with pytest.raises(NotFound):
        client.call(Catalogue.get_operation, "123")
    assert (raw.get("/no/such/path").status_code, raw.get("/no/such/path").content) == (404, b"")


def test_bad_json_is_ps0035(raw: httpx.Client) -> None:
    response = raw.post("/orders/hpp", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["code"] == "PS0035"
    response = raw.post("/orders/hpp", json=[1, 2])
    assert response.json()["errors"][0]["code"] == "PS0035"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"order": order("o-1", 10) | {"amount": "12.50"}, "paymentSession": session()}, "order.amount"),
        ({"order": order("o-1"), "paymentSession": {"amount": "100", "language": "english"}}, "paymentSession.language"),
        ({"paymentSession": session()}, "order"),
        ({"order": order("bad/id"), "paymentSession": session()}, "order.orderId"),
    ],
)
def test_a_bad_field_is_ps0026_naming_it(raw: httpx.Client, body: dict[str, Any], field: str) -> None:
    response = raw.post("/orders/hpp", json=body)
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["code"] == "PS0026"
    assert error["description"].startswith(f"Invalid {field} parameter: ")


def test_a_query_over_the_limit_is_ps0026(raw: httpx.Client) -> None:
    error = raw.get("/orders", params={"maxRecords": "501"}).json()["errors"][0]
    assert error["code"] == "PS0026" and "maxRecords" in error["description"]


def test_a_second_create_with_the_same_order_id_is_refused_naming_order_id(client: GatewayClient) -> None:
    client.call(Catalogue.create_moto_order, request={"order": order("dup-1"), "card": card()})
    with pytest.raises(BadRequest) as refused:
        client.call(Catalogue.create_hpp_order, request={"order": order("dup-1"), "paymentSession": session()})
    assert refused.value.codes == ("PS0026",)
    assert "order.orderId" in refused.value.errors[0].description
    assert "already used" in refused.value.errors[0].description


def test_a_resent_create_is_refused_on_order_id_before_any_other_check(client: GatewayClient, sim: SimulatorServer) -> None:
    recurrence = {"action": "CONTRACT_CREATION", "contractId": "c-1"}
    request = {"order": order("first-1"), "paymentSession": session(recurrence=recurrence)}
    client.call(Catalogue.create_hpp_order, request=request)
    sim.admin.complete_hpp("first-1")  # the contract now exists too
    with pytest.raises(BadRequest) as resent:
        client.call(Catalogue.create_hpp_order, request=request)
    assert resent.value.codes == ("PS0026",) and "order.orderId" in resent.value.errors[0].description
    with pytest.raises(BadRequest) as mit:
        client.call(Catalogue.create_mit_order, request={"order": order("first-1"), "contractId": "c-1"}, idempotency_key="new")
    assert mit.value.codes == ("PS0026",) and "order.orderId" in mit.value.errors[0].description


def _families(s: Scenario) -> list[tuple[str, Any, tuple[str, ...], dict[str, Any], str | None]]:
    """(expected code, operation, path args, request, key) — one invalid request per error family."""
    return [
        ("PS0007", Catalogue.create_hpp_order, (), {"order": order("f-1", 100), "paymentSession": session(200)}, None),
        ("PS0009", Catalogue.refund_operation, (s.moto(),), {"amount": "10", "currency": "USD"}, "k-ps0009"),
        ("PS0008", Catalogue.list_orders, (), {"fromTime": "yesterday"}, None),
        ("PS0013", Catalogue.list_operations, (), {"fromTime": "2024-01-01T00:00:00Z", "toTime": "2024-03-01T00:00:00Z"}, None),
        ("PS0017", Catalogue.create_mit_order, (), {"order": order("f-2"), "contractId": "no-such"}, "k-ps0017"),
        ("PS0023", Catalogue.capture_operation, (s.moto(),), {}, "k-ps0023"),
        ("PS0029", Catalogue.refund_operation, (s.moto(),), {"amount": "99999"}, "k-ps0029"),
        ("PS0043", Catalogue.create_reservation_mit_earlier, (s.reservation(paid=False),), {"amount": "100"}, "k-ps0043"),
        (
            "GW0001",
            Catalogue.create_build_order,
            (),
            {"merchantUrl": "https://shop.example/checkout", "order": order("f-3"), "paymentSession": session()},
            None,
        ),
        ("PS0026", Catalogue.three_steps_validation, (), {"operationId": "0", "threeDSAuthResponse": "x"}, None),
    ]


def test_one_invalid_request_per_error_family_gets_its_documented_code(client: GatewayClient, sim: SimulatorServer) -> None:
    for code, op, args, request, key in _families(Scenario(client, sim)):
        with pytest.raises(BadRequest) as refused:
            client.call(op, *args, request=request, idempotency_key=key)
        assert refused.value.codes == (code,), f"{op.name}: {refused.value}"
        assert refused.value.errors[0].description
