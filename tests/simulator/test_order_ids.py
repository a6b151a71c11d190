"""``order_id_max_length``: every request that creates an order refuses a longer ``orderId`` (issue 23, item 5).

Public material gives the gateway's limit as 18 (two client libraries written for the live gateway) or 27
(another document): docs/gateway.md. The simulator takes the limit from its config; both values are
tested here, each on a simulator of its own, with requests sent over plain HTTP so that the client's own
checks (27 characters) do not stand in front of the simulator's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from durapay.gateway import CATALOGUE
from durapay.simulator import SimulatorConfig, SimulatorServer
from tests.simulator.support import card, order, session

Builder = Callable[[SimulatorServer, str], dict[str, Any]]


def _link(sim: SimulatorServer, order_id: str) -> dict[str, Any]:
    expiry = (sim.admin.now() + timedelta(days=5)).date().isoformat()
    return {"order": order(order_id), "paymentSession": session(), "expirationDate": expiry}


#: The operations that create an order, each with a valid request for a given ``orderId``
#: (``three_steps_payment`` also carries the order, but pays the one its init created).
CREATES: dict[str, Builder] = {
    "create_hpp_order": lambda sim, order_id: {"order": order(order_id), "paymentSession": session()},
    "create_paybylink": _link,
    "create_paybylink_v1": _link,
    "create_paybylink_v2": _link,
    "create_paybylink_v3": _link,
    "three_steps_init": lambda sim, order_id: {"order": order(order_id), "card": card()},
    "svs_init_order": lambda sim, order_id: {"order": order(order_id), "card": card()},
    "create_mit_order": lambda sim, order_id: {"order": order(order_id), "contractId": "ctr-ids"},
    "card_verification": lambda sim, order_id: {"order": order(order_id, 0), "card": card()},
    "create_moto_order": lambda sim, order_id: {"order": order(order_id), "card": card()},
    "wallet_pay": lambda sim, order_id: {"order": order(order_id), "walletPaymentData": {}},
    "create_build_order": lambda sim, order_id: {
        "merchantUrl": "https://shop.example",
        "order": order(order_id),
        "paymentSession": session(paymentService="CARDS"),
    },
}


def test_every_operation_that_creates_an_order_is_covered() -> None:
    carrying_an_order = {op.name for op in CATALOGUE if op.request is not None and "order" in op.request.model_fields}
    assert carrying_an_order - {"three_steps_payment"} == set(CREATES)


@pytest.fixture(scope="module", params=[18, 27], ids=["limit-18", "limit-27"])
def limited(request: pytest.FixtureRequest) -> Iterator[SimulatorServer]:
    config = SimulatorConfig(seed=23, order_id_max_length=request.param, sweep_interval_seconds=0.05)
    with SimulatorServer(config) as server:
        yield server


def _post(sim: SimulatorServer, name: str, order_id: str) -> httpx.Response:
    op = next(op for op in CATALOGUE if op.name == name)
    headers = {"X-Api-Key": sim.config.api_key, "Correlation-Id": "c0ffee00-0000-4000-8000-000000000000"}
    if op.idempotency_key:
        headers["Idempotency-Key"] = f"key-{order_id}"
    return httpx.post(sim.base_url + op.path, json=CREATES[name](sim, order_id), headers=headers, timeout=10)


def _contract_for_mit(sim: SimulatorServer) -> None:
    """The contract ``create_mit_order``'s requests charge, made once per simulator by a first payment."""
    if sim.state.contract("ctr-ids") is not None:
        return
    recurrence = {"action": "CONTRACT_CREATION", "contractId": "ctr-ids", "contractType": "MIT_UNSCHEDULED"}
    init = httpx.post(
        sim.base_url + "/orders/3steps/init",
        json={"order": order("ids-first"), "card": card(), "recurrence": recurrence},
        headers={"X-Api-Key": sim.config.api_key},
        timeout=10,
    ).json()
    payment = {"operationId": init["operation"]["operationId"], "order": order("ids-first"), "card": card()}
    paid = httpx.post(
        sim.base_url + "/orders/3steps/payment", json=payment, headers={"X-Api-Key": sim.config.api_key}, timeout=10
    )
    assert paid.json()["operation"]["operationResult"] == "EXECUTED", paid.text


def _order_id(length: int, tag: str) -> str:
    """An id of exactly ``length`` characters, unique per ``tag`` (the operation's name)."""
    head = f"{sorted(CREATES).index(tag):02d}-"
    return (head + "x" * length)[:length]


@pytest.mark.parametrize("name", sorted(CREATES))
def test_an_order_id_longer_than_the_setting_is_refused_naming_order_id(limited: SimulatorServer, name: str) -> None:
    limit = limited.config.order_id_max_length
    _contract_for_mit(limited)
    fits, too_long = _order_id(limit, name), _order_id(limit + 1, name)

    refused = _post(limited, name, too_long)
    assert refused.status_code == 400, refused.text
    [error] = refused.json()["errors"]
    assert error["code"] == "PS0026" and error["description"].startswith("Invalid order.orderId parameter"), error
    assert limited.state.order(too_long) is None, "a refused create makes no order"

    accepted = _post(limited, name, fits)
    assert accepted.status_code == 200, accepted.text
    assert limited.state.order(fits) is not None


def test_the_default_is_durapays_18() -> None:
    """The simulator enforces what durapay derives within (``DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH``)."""
    from durapay.config import load_settings

    assert SimulatorConfig().order_id_max_length == 18 == load_settings().gateway.order_id_max_length


@pytest.mark.parametrize("value", [0, 28])
def test_a_limit_outside_1_to_27_is_refused_at_start(value: int) -> None:
    with pytest.raises(ValueError, match="order_id_max_length"):
        SimulatorConfig(order_id_max_length=value)
