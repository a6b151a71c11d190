"""What a contract lets the merchant charge (issue 23, item 6): nothing on a ``CIT`` contract, and on an
``MIT_SCHEDULED`` one nothing closer to the contract's last payment than ``contractFrequency`` days.

The days are the gateway's calendar days (UTC+01:00, the zone of its operation times); the first payment
that created the contract counts; a declined charge does not (docs/gateway.md, "MIT contracts"). The
clock is the simulator's, moved by the tests.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient, NotFound
from durapay.simulator import SimulatorServer
from tests.simulator.support import order, session

DAY = 86_400.0


def _contract(
    client: GatewayClient, sim: SimulatorServer, contract_id: str, contract_type: str, frequency: str | None = None
) -> None:
    """A contract made by the customer's first payment on a hosted page, now."""
    recurrence = {"action": "CONTRACT_CREATION", "contractId": contract_id, "contractType": contract_type}
    if frequency is not None:
        recurrence["contractFrequency"] = frequency
    order_id = f"first-{contract_id}"
    request = {"order": order(order_id, customerId="cust-23"), "paymentSession": session(recurrence=recurrence)}
    client.call(Catalogue.create_hpp_order, request=request)
    assert sim.admin.complete_hpp(order_id)["operationResult"] == "EXECUTED"


def _mit(client: GatewayClient, contract_id: str, order_id: str) -> str:
    """The charge's ``operationResult``, or the code the gateway refused it with."""
    try:
        answer = client.call(
            Catalogue.create_mit_order,
            request={"order": order(order_id, 990), "contractId": contract_id},
            idempotency_key=f"k-{order_id}",
        )
    except BadRequest as refused:
        return ",".join(refused.codes)
    return str(answer.operation.operationResult)


def _refusal(client: GatewayClient, contract_id: str, order_id: str) -> BadRequest:
    with pytest.raises(BadRequest) as refused:
        client.call(
            Catalogue.create_mit_order,
            request={"order": order(order_id, 990), "contractId": contract_id},
            idempotency_key=f"k-{order_id}",
        )
    return refused.value


def test_a_merchant_cannot_charge_a_contract_created_as_cit(client: GatewayClient, sim: SimulatorServer) -> None:
    _contract(client, sim, "cit-1", "CIT")
    refused = _refusal(client, "cit-1", "mit-cit-1")
    assert refused.codes == ("PS0017",)
    assert "CIT" in refused.errors[0].description
    with pytest.raises(NotFound):
        client.call(Catalogue.get_order, "mit-cit-1")  # refused before anything was recorded
    # The cardholder still pays with it: a one-click payment on a page.
    again = {"action": "SUBSEQUENT_PAYMENT", "contractId": "cit-1", "contractType": "CIT"}
    client.call(Catalogue.create_hpp_order, request={"order": order("oneclick-1"), "paymentSession": session(recurrence=again)})
    assert sim.admin.complete_hpp("oneclick-1")["operationResult"] == "EXECUTED"


def test_a_scheduled_contract_refuses_charges_closer_together_than_its_frequency(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.set_clock(datetime(2027, 3, 1, 9, 0, tzinfo=UTC))
    _contract(client, sim, "sch-1", "MIT_SCHEDULED", "30")  # the first payment, on March 1
    assert [_mit(client, "sch-1", f"same-day-{n}") for n in range(3)] == ["PS0043"] * 3
    sim.admin.advance_clock(29 * DAY)
    refused = _refusal(client, "sch-1", "day-29")
    assert refused.codes == ("PS0043",)
    assert "2027-03-01" in refused.errors[0].description and "2027-03-31" in refused.errors[0].description
    sim.admin.advance_clock(DAY)
    assert [_mit(client, "sch-1", f"day-30-{n}") for n in range(3)] == ["EXECUTED", "PS0043", "PS0043"]


def test_days_are_the_gateways_calendar_days_in_utc_plus_one(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_clock(datetime(2027, 1, 1, 22, 30, tzinfo=UTC))  # 23:30 on January 1 at the gateway
    _contract(client, sim, "sch-2", "MIT_SCHEDULED", "30")
    sim.admin.set_clock(datetime(2027, 1, 30, 22, 50, tzinfo=UTC))  # 23:50 on January 30: day 29
    assert _mit(client, "sch-2", "jan-30") == "PS0043"
    sim.admin.set_clock(datetime(2027, 1, 30, 23, 10, tzinfo=UTC))  # 00:10 on January 31: day 30, 29 d 0 h 40 min later
    assert _mit(client, "sch-2", "jan-31") == "EXECUTED"


def test_a_monthly_rule_on_the_31st_needs_a_frequency_of_at_most_28(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_clock(datetime(2027, 1, 31, 9, 0, tzinfo=UTC))
    _contract(client, sim, "month-30", "MIT_SCHEDULED", "30")
    _contract(client, sim, "month-28", "MIT_SCHEDULED", "28")
    sim.admin.set_clock(datetime(2027, 2, 28, 9, 0, tzinfo=UTC))  # "the 31st" of February: 28 days later
    assert (_mit(client, "month-30", "feb-a"), _mit(client, "month-28", "feb-b")) == ("PS0043", "EXECUTED")


def test_a_declined_charge_is_no_payment_and_a_retry_that_succeeds_moves_the_next_date(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    sim.admin.set_clock(datetime(2027, 3, 1, 9, 0, tzinfo=UTC))
    _contract(client, sim, "dun-1", "MIT_SCHEDULED", "30")
    sim.admin.script_outcomes(["116"], contract_id="dun-1")
    sim.admin.advance_clock(30 * DAY)
    assert _mit(client, "dun-1", "occ-1") == "DECLINED"
    sim.admin.advance_clock(DAY)
    assert _mit(client, "dun-1", "occ-1-r1") == "EXECUTED", "day 31: the last payment is still the first"
    sim.admin.advance_clock(29 * DAY)
    assert _mit(client, "dun-1", "occ-2") == "PS0043", "day 60: 29 days after the retry"
    sim.admin.advance_clock(DAY)
    assert _mit(client, "dun-1", "occ-2-late") == "EXECUTED"


def test_a_pending_charge_counts_until_it_settles_declined(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_clock(datetime(2027, 3, 1, 9, 0, tzinfo=UTC))
    _contract(client, sim, "pend-1", "MIT_SCHEDULED", "30")
    sim.admin.advance_clock(30 * DAY)
    sim.admin.pend("create_mit_order", final="116")
    assert _mit(client, "pend-1", "p-1") == "PENDING"
    assert _mit(client, "pend-1", "p-2") == "PS0043", "it may still be approved"
    sim.admin.settle_pending()
    assert _mit(client, "pend-1", "p-3") == "EXECUTED", "settled declined: no payment"


def test_a_contract_made_by_a_card_verification_has_no_payment_yet(client: GatewayClient, sim: SimulatorServer) -> None:
    recurrence = {
        "action": "CONTRACT_CREATION",
        "contractId": "ver-1",
        "contractType": "MIT_SCHEDULED",
        "contractFrequency": "30",
    }
    verify = {"order": order("first-ver-1"), "paymentSession": session(actionType="VERIFY", recurrence=recurrence)}
    client.call(Catalogue.create_hpp_order, request=verify)
    sim.admin.complete_hpp("first-ver-1")
    [verified] = client.call(Catalogue.get_order, "first-ver-1").operations
    assert (verified.operationType, verified.operationResult) == ("CARD_VERIFICATION", "EXECUTED")
    assert [_mit(client, "ver-1", f"ver-{n}") for n in range(2)] == ["EXECUTED", "PS0043"]


def test_unscheduled_contracts_and_scheduled_ones_without_a_frequency_have_no_minimum(
    client: GatewayClient, sim: SimulatorServer
) -> None:
    _contract(client, sim, "free-1", "MIT_UNSCHEDULED", "30")  # a frequency binds only MIT_SCHEDULED
    _contract(client, sim, "free-2", "MIT_SCHEDULED")
    assert [_mit(client, c, f"{c}-{n}") for c in ("free-1", "free-2") for n in range(2)] == ["EXECUTED"] * 4


@pytest.mark.parametrize("frequency", ["0", "abc", "3.5", "²"])
def test_a_contract_frequency_is_a_number_of_days(client: GatewayClient, frequency: str) -> None:
    recurrence = {
        "action": "CONTRACT_CREATION",
        "contractId": "bad-1",
        "contractType": "MIT_SCHEDULED",
        "contractFrequency": frequency,
    }
    with pytest.raises(BadRequest) as refused:
        client.call(
            Catalogue.create_hpp_order, request={"order": order("first-bad-1"), "paymentSession": session(recurrence=recurrence)}
        )
    assert refused.value.codes == ("PS0026",)
    assert "paymentSession.recurrence.contractFrequency" in refused.value.errors[0].description


def test_a_refused_charge_leaves_its_order_id_free_and_its_key_answered(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_clock(datetime(2027, 3, 1, 9, 0, tzinfo=UTC))
    _contract(client, sim, "key-1", "MIT_SCHEDULED", "30")
    assert _refusal(client, "key-1", "occ-1").codes == ("PS0043",)
    sim.admin.advance_clock(30 * DAY)
    assert _refusal(client, "key-1", "occ-1").codes == ("PS0043",), "the same key: the refusal replayed"
    charged = client.call(
        Catalogue.create_mit_order,
        request={"order": order("occ-1", 990), "contractId": "key-1"},
        idempotency_key="k-occ-1-later",
    )
    assert charged.operation.operationResult == "EXECUTED", "a new key, the same order id"


def test_the_cardholders_own_payment_with_the_contract_counts(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_clock(datetime(2027, 3, 1, 9, 0, tzinfo=UTC))
    _contract(client, sim, "own-1", "MIT_SCHEDULED", "30")
    sim.admin.advance_clock(30 * DAY)
    again = {"action": "SUBSEQUENT_PAYMENT", "contractId": "own-1", "contractType": "MIT_SCHEDULED"}
    client.call(Catalogue.create_hpp_order, request={"order": order("own-page"), "paymentSession": session(recurrence=again)})
    assert sim.admin.complete_hpp("own-page")["operationResult"] == "EXECUTED", "a customer is never held to the frequency"
    assert _mit(client, "own-1", "own-mit") == "PS0043"


def test_an_approved_charge_counts_even_once_voided(client: GatewayClient, sim: SimulatorServer) -> None:
    sim.admin.set_clock(datetime(2027, 3, 1, 9, 0, tzinfo=UTC))
    _contract(client, sim, "void-1", "MIT_SCHEDULED", "30")
    sim.admin.advance_clock(30 * DAY)
    authorized = client.call(
        Catalogue.create_mit_order,
        request={"order": order("auth-1", 990), "contractId": "void-1", "captureType": "EXPLICIT"},
        idempotency_key="k-auth-1",
    ).operation
    assert authorized.operationResult == "AUTHORIZED"
    client.call(Catalogue.refund_operation, authorized.operationId, request={}, idempotency_key="k-void-1")
    assert client.call(Catalogue.get_operation, authorized.operationId).operationResult == "VOIDED"
    assert _mit(client, "void-1", "after-void") == "PS0043"
