"""Every door through which a merchant gives an identifier refuses one that looks like a card number
(``workflows.engine.sensitive.refuse_card_identifier``): identifiers are shown whole, so a card number there
would be shown whole. Over real HTTP (flow inputs, schedules, the ``Idempotency-Key`` of both) and from
Python (``durapay.connect()``, ``Schedules``); the CLI's are in tests/service/cli/test_card_identifiers.py.
Each refusal names the field, never repeats the number whole, and writes nothing. Ordinary numeric ids
and the ids the gateway assigns are taken."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

import durapay
from durapay.workflows.engine import InputError
from durapay.workflows.engine.sensitive import CARD_IDENTIFIER, card_like
from durapay.workflows.engine.states import FlowState
from durapay.workflows.late_payments import refund_key
from durapay.workflows.schedules.policy import order_id
from tests.service.conftest import API_KEY, Served, service_settings, waiting_flow
from tests.service.test_api_schedules import schedule
from tests.waiting import wait_until

KEY = {"X-Api-Key": API_KEY}
PAN = "4349940199004549"
CARD = {"pan": PAN, "expiryDate": "1230", "cvv": "123"}
#: A millisecond timestamp: 13 digits that the mask's rule alone would take for a card number if it passed.
TIMESTAMP = "1732660000000"


def moto(**order: Any) -> dict[str, Any]:
    return {"order": {"orderId": "ord-ident-1", "amount": "1500", "currency": "EUR", **order}, "card": CARD}


def assert_refused(answer: Any, field: str) -> None:
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert (body["error"], body["field"]) == ("invalid_input", field), body
    assert CARD_IDENTIFIER in body["reason"]
    assert PAN not in answer.text and "4111111111111111" not in answer.text, "the refusal never repeats it whole"


@pytest.mark.parametrize(
    ("path", "body", "headers", "field"),
    [
        ("/flows/notified", {"orderId": PAN, "token": "t"}, {}, "orderId"),
        ("/flows/moto", moto(orderId="ORD-4111-1111-1111-1111"), {}, "order.orderId"),
        ("/flows/moto", moto(customerId=f"cust {PAN}"), {}, "order.customerId"),
        ("/flows/moto", moto(invoiceId=PAN), {}, "order.invoiceId"),
        (
            "/flows/moto",
            {**moto(), "passThrough": {"merchantRef": [{"basketId": int(PAN)}]}},
            {},
            "passThrough.merchantRef.0.basketId",
        ),
        ("/flows/notified", {"orderId": "ord-ident-2", "token": "t"}, {"Idempotency-Key": PAN}, "header.Idempotency-Key"),
        ("/schedules", schedule(contractId=PAN), {}, "contractId"),
        ("/schedules", schedule(customerId=PAN), {}, "customerId"),
        ("/schedules", schedule(), {"Idempotency-Key": f"gym {PAN}"}, "header.Idempotency-Key"),
    ],
)
def test_the_api_refuses_a_card_number_as_an_identifier(
    served: Served, path: str, body: dict[str, Any], headers: dict[str, str], field: str
) -> None:
    assert_refused(served.http.post(path, json=body, headers=KEY | headers), field)
    assert list(served.engine.list()) == [] and served.http.get("/schedules", headers=KEY).json()["schedules"] == []


def test_the_api_takes_numeric_ids_and_the_gateways_own(served: Served) -> None:
    started = served.http.post(
        "/flows/notified", json={"orderId": TIMESTAMP, "token": "t"}, headers=KEY | {"Idempotency-Key": "9" + PAN}
    )
    assert started.status_code == 201, started.text
    # An operation to refund is the gateway's id (one in ten of them passes the Luhn check): taken as it is.
    refund = served.http.post("/flows/refund", json={"operationId": PAN, "amount": 100, "currency": "EUR"}, headers=KEY)
    assert refund.status_code == 201, refund.text
    created = served.http.post("/schedules", json=schedule(contractId=TIMESTAMP), headers=KEY | {"Idempotency-Key": TIMESTAMP})
    assert created.status_code == 201, created.text


def test_the_python_api_refuses_a_card_number_as_an_identifier(redis_url: str, key_prefix: str) -> None:
    with durapay.connect(service_settings(key_prefix), redis_url=redis_url) as engine:
        engine.sender = None
        with pytest.raises(InputError) as refused:
            engine.start("moto", moto(orderId=PAN))
        assert (refused.value.field, refused.value.reason.startswith(CARD_IDENTIFIER)) == ("order.orderId", True)
        with pytest.raises(InputError) as refused:
            engine.start("moto", moto(), key=f"key-{PAN}")
        assert refused.value.field == "key" and PAN not in str(refused.value)
        schedules = durapay.Schedules(engine)
        with pytest.raises(InputError) as refused:
            schedules.create(schedule(customerId=PAN))
        assert refused.value.field == "customerId"
        with pytest.raises(InputError) as refused:
            schedules.create(schedule(), key=PAN)
        assert refused.value.field == "key"
        assert list(engine.list()) == [] and schedules.list() == []
        assert engine.start("moto", moto(orderId=TIMESTAMP), key=TIMESTAMP).order_id == TIMESTAMP


# -- identifiers durapay derives never meet the rule ---------------------------------------------------------------
# Flow ids (a hash of the key), schedule ids and their occurrences' order ids, the -2 order ids of a retry
# and durapay's own keys are made by durapay, not given by a merchant: the rule is asked at the doors only,
# so one that happens to hold a Luhn-valid run from a scheme's prefix is still taken. Each test plants such an id.


def test_a_flow_id_derived_from_a_key_is_never_refused(served: Served) -> None:
    key = "k4531"  # an ordinary key whose derived flow id holds a run that looks like a card number
    started = served.http.post(
        "/flows/notified", json={"orderId": "ord-derived-1", "token": "t"}, headers=KEY | {"Idempotency-Key": key}
    )
    assert started.status_code == 201, started.text
    assert card_like(started.json()["id"]) is not None, started.json()["id"]
    assert served.http.get(f"/flows/{started.json()['id']}", headers=KEY).status_code == 200


def test_a_schedules_derived_order_id_is_never_refused(served: Served) -> None:
    schedules = durapay.Schedules(served.engine)
    soon = datetime.fromtimestamp(math.ceil(served.engine.clock.now()) + 1, UTC).isoformat(timespec="seconds")
    record = schedules.create(schedule(start=soon, timezone="UTC", rule={"every": "days", "interval": 1}), key="gym-132")
    assert card_like(order_id(record.id, 0, 0)) is not None, "its first occurrence's order id looks like a card number"
    fired: list[int] = []
    wait_until(lambda: fired.append(schedules.tick()) or sum(fired) > 0, 10, "the first occurrence fired")
    [flow] = list(served.engine.list())
    assert flow.order_id == order_id(record.id, 0, 0)


def test_a_retrys_derived_order_id_is_never_refused(served: Served) -> None:
    base = "434994019900457"  # 15 digits: taken; its retry's order id 434994019900457-2 is Luhn-valid
    assert card_like(base) is None and card_like(f"{base}-2") is not None
    flow_id = waiting_flow(served.engine, base, "t")
    served.engine.signal(flow_id, "notification", {"fail": True}, by="notification")
    assert served.engine.run_step(flow_id, "payment") == FlowState.FAILED.value
    assert served.http.post(f"/flows/{flow_id}/retry", headers=KEY).status_code == 200
    assert served.engine.get(flow_id).order_id == f"{base}-2"


def test_a_late_payments_refund_key_is_durapays_not_a_merchants(served: Served) -> None:
    """LatePayments.refund starts its refund under a key naming the gateway's operation id: a key of
    durapay's (``derived_key``), taken whatever the operation id; the same key from a merchant is not."""
    key = refund_key("f" + "0" * 24, PAN)
    assert served.engine.start("refund", {"operationId": PAN}, key, derived_key=True).id
    with pytest.raises(InputError):
        served.engine.start("refund", {"operationId": PAN}, key)
