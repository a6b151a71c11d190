"""Back-office answers as the real test environment gives them: payment method names, operation times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from durapay.gateway import Catalogue, GatewayClient
from durapay.simulator import SimulatorServer
from tests.simulator.support import APPROVE, card, order

#: The real test environment's form of ``operationTime`` (and ``lastOperationTime``).
SANDBOX_TIME = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$"


def test_payment_methods_carry_both_names_of_their_type(sim: SimulatorServer) -> None:
    """Sources name the type ``paymentMethodType`` or ``methodType``; clients read one or the other."""
    methods = httpx.get(sim.base_url + "/payment_methods", headers={"X-Api-Key": sim.config.api_key}).json()["paymentMethods"]
    assert methods and all(method["methodType"] == method["paymentMethodType"] for method in methods)


def test_operation_times_are_in_the_test_environment_form_and_page_by_last_operation_time(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    import re

    before = datetime.now(UTC) + timedelta(seconds=sim.state.clock.offset_seconds) - timedelta(seconds=1)
    paid = client.call(Catalogue.create_moto_order, request={"order": order("times-1"), "card": card(APPROVE)}).operation
    assert paid.operationTime is not None and re.match(SANDBOX_TIME, paid.operationTime), paid.operationTime
    moment = paid.operationTime.moment
    assert moment is not None and before <= moment <= before + timedelta(minutes=1), "UTC+01:00, not UTC"
    refund = client.call(
        Catalogue.refund_operation, paid.operationId, request={"amount": "500", "currency": "EUR"}, idempotency_key="times-r"
    )
    assert refund.operationTime is not None and re.match(SANDBOX_TIME, refund.operationTime)
    [details] = client.call(Catalogue.list_orders, request={"orderId": "times-1"}).orders
    assert details.lastOperationTime is not None and re.match(SANDBOX_TIME, details.lastOperationTime)
    # "For the next page set toTime equal to the lastOperationTime of the last record": the form goes back in.
    page = client.call(Catalogue.list_operations, request={"toTime": details.lastOperationTime}).operations
    assert {op.operationId for op in page} >= {paid.operationId}
