"""``pend("page_payment")``: the payment a customer makes on a page (hosted page, link, build) answered
PENDING, notified at once, then settled by the admin or by the simulator's clock as an immediate one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from durapay.config import GatewaySettings
from durapay.gateway import BadRequest, Catalogue, GatewayClient
from durapay.simulator import PAGE_PAYMENT, SimulatorAdminError, SimulatorConfig, SimulatorServer
from tests.simulator.scenario import Scenario
from tests.simulator.support import CHALLENGE, DECLINE, Receiver, order, session
from tests.waiting import wait_until

DAY = timedelta(days=1).total_seconds()


@pytest.fixture
def scenario(client: GatewayClient, sim: SimulatorServer) -> Scenario:
    # Noon UTC, so that clock moves and "the same day" never straddle midnight while a test runs.
    sim.admin.set_clock(sim.admin.now().strftime("%Y-%m-%dT12:00:00Z"))
    return Scenario(client, sim)


def _order(client: GatewayClient, order_id: str) -> tuple[list[tuple[str, str]], int | None, int | None]:
    """The order read: its operations (type, result) and its authorized and captured amounts."""
    answer = client.call(Catalogue.get_order, order_id)
    operations = [(str(op.operationType), str(op.operationResult)) for op in answer.operations]
    return operations, answer.orderStatus.authorizedAmount, answer.orderStatus.capturedAmount


def _notified(receiver: Receiver, count: int) -> list[tuple[str, str]]:
    """The notifications received, as (operationId, operationResult), once there are ``count``; sorted, since
    two events of one order may arrive in either order (each is sent on its own)."""

    def received() -> list[dict[str, Any]]:
        bodies = receiver.bodies()
        return bodies if len(bodies) >= count else []

    bodies = wait_until(received, what=f"{count} notification(s)")
    return sorted((body["operation"]["operationId"], body["operation"]["operationResult"]) for body in bodies)


def _hpp(client: GatewayClient, scenario: Scenario, receiver: Receiver, **extra: Any) -> str:
    order_id = scenario.new_id("hpp")
    request = {"order": order(order_id), "paymentSession": session(notificationUrl=receiver.url, **extra)}
    client.call(Catalogue.create_hpp_order, request=request)
    return order_id


def _link(client: GatewayClient, scenario: Scenario, receiver: Receiver, days: int = 10) -> tuple[str, str]:
    """A link with a notification URL: (linkId, orderId)."""
    link_id = scenario.link(notification_url=receiver.url, days=days)
    return link_id, client.call(Catalogue.get_paybylink, link_id).orderId or ""


def _link_state(client: GatewayClient, link_id: str) -> tuple[str, str | None, list[str]]:
    details = client.call(Catalogue.get_paybylink_v3, link_id)
    link = details.paymentLink
    return str(link.status), link.paidByOperationId, [str(op.operationResult) for op in details.operations]


# -- hosted page -------------------------------------------------------------------------------------


def test_a_hosted_page_payment_pending_then_settled_approved(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    order_id = _hpp(client, scenario, receiver)
    sim.admin.pend(PAGE_PAYMENT)
    paid = sim.admin.complete_hpp(order_id)
    assert paid["operationResult"] == "PENDING"
    assert _order(client, order_id) == ([("AUTHORIZATION", "PENDING")], 0, 0)
    assert _notified(receiver, 1) == [(paid["operationId"], "PENDING")]
    with pytest.raises(SimulatorAdminError, match="in use") as again:
        sim.admin.complete_hpp(order_id)
    assert again.value.status == 409
    [held] = sim.admin.pending()["operations"]
    assert (held["operationId"], held["operation"]) == (paid["operationId"], PAGE_PAYMENT)
    assert sim.admin.settle_pending() == [paid["operationId"]]
    assert _order(client, order_id) == ([("CAPTURE", "EXECUTED")], 1500, 1500)
    assert _notified(receiver, 2) == [(paid["operationId"], "EXECUTED"), (paid["operationId"], "PENDING")]
    [recorded] = sim.admin.operations(order_id=order_id)
    assert [(step["operation"], step["result"]) for step in recorded["steps"]] == [
        ("hpp_page", "PENDING"),
        ("pending_settle", "EXECUTED"),
    ]
    with pytest.raises(SimulatorAdminError, match="already completed"):
        sim.admin.complete_hpp(order_id)


def test_a_hosted_page_payment_settled_declined_ends_as_an_immediate_decline(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    pended, immediate = _hpp(client, scenario, receiver), scenario.new_id("hpp")
    client.call(Catalogue.create_hpp_order, request={"order": order(immediate), "paymentSession": session()})
    assert sim.admin.complete_hpp(immediate, pan=DECLINE)["operationResult"] == "DECLINED"
    sim.admin.pend(PAGE_PAYMENT, final="116")
    paid = sim.admin.complete_hpp(pended)
    sim.admin.settle_pending(paid["operationId"])
    assert _order(client, pended) == _order(client, immediate) == ([("AUTHORIZATION", "DECLINED")], 0, 0)
    assert client.call(Catalogue.get_operation, paid["operationId"]).additionalData["responseCode"] == "116"
    assert _notified(receiver, 2) == [(paid["operationId"], "DECLINED"), (paid["operationId"], "PENDING")]
    for order_id in (pended, immediate):  # the page is used either way
        with pytest.raises(SimulatorAdminError, match="already completed"):
            sim.admin.complete_hpp(order_id)


def test_a_hosted_page_payment_settles_by_the_simulators_clock(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    order_id = _hpp(client, scenario, receiver)
    sim.admin.pend(PAGE_PAYMENT, settle_after=60)
    paid = sim.admin.complete_hpp(order_id)
    sim.admin.advance_clock(30)
    assert _order(client, order_id)[0] == [("AUTHORIZATION", "PENDING")]
    sim.admin.advance_clock(31)
    assert _order(client, order_id) == ([("CAPTURE", "EXECUTED")], 1500, 1500)
    assert _notified(receiver, 2) == [(paid["operationId"], "EXECUTED"), (paid["operationId"], "PENDING")]


def test_a_verification_on_a_hosted_page_pends_and_creates_its_contract_when_settled(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    recurrence = {"action": "CONTRACT_CREATION", "contractId": "ctr-page", "contractType": "MIT_UNSCHEDULED"}
    order_id = scenario.new_id("hpp")
    request = {"order": order(order_id, 0), "paymentSession": session(0, actionType="VERIFY", recurrence=recurrence)}
    client.call(Catalogue.create_hpp_order, request=request)
    sim.admin.pend(PAGE_PAYMENT)
    paid = sim.admin.complete_hpp(order_id)
    assert paid["operationResult"] == "PENDING"
    assert "ctr-page" not in sim.admin.snapshot()["contracts"]
    sim.admin.settle_pending()
    assert _order(client, order_id)[0] == [("CARD_VERIFICATION", "EXECUTED")]
    assert "ctr-page" in sim.admin.snapshot()["contracts"]


# -- pay-by-link ---------------------------------------------------------------------------------------


def test_a_link_payment_pending_keeps_the_link_in_use_then_pays_it(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    link_id, order_id = _link(client, scenario, receiver)
    sim.admin.pend(PAGE_PAYMENT)
    paid = sim.admin.complete_link(link_id)
    assert paid["operationResult"] == "PENDING"
    assert _link_state(client, link_id) == ("ACTIVE", None, ["PENDING"])
    assert _order(client, order_id) == ([("AUTHORIZATION", "PENDING")], 0, 0)
    [(notified_id, result)] = _notified(receiver, 1)
    assert (notified_id, result) == (paid["operationId"], "PENDING")
    for cancel in (False, True):  # neither a second payment nor an abandon on the page
        with pytest.raises(SimulatorAdminError, match="in use") as refused:
            sim.admin.complete_link(link_id, cancel=cancel)
        assert refused.value.status == 409
    with pytest.raises(BadRequest) as cancelled:
        client.call(Catalogue.cancel_paybylink, link_id)
    assert cancelled.value.codes == ("PS0045",) and "PENDING" in cancelled.value.errors[0].description
    with pytest.raises(BadRequest) as modified:
        client.call(Catalogue.modify_paybylink_v3, link_id, request={"amount": "10"})
    assert modified.value.codes == ("PS0045",)
    sim.admin.settle_pending(paid["operationId"])
    assert _link_state(client, link_id) == ("PAID", paid["operationId"], ["EXECUTED"])
    assert _order(client, order_id) == ([("CAPTURE", "EXECUTED")], 1500, 1500)
    assert _notified(receiver, 2) == [(paid["operationId"], "EXECUTED"), (paid["operationId"], "PENDING")]
    with pytest.raises(BadRequest) as used:
        client.call(Catalogue.cancel_paybylink, link_id)
    assert used.value.codes == ("PS0045",)


def test_notifications_of_a_pending_link_payment_carry_the_links_token(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    request = {
        "order": order(scenario.new_id("pbl")),
        "paymentSession": session(notificationUrl=receiver.url),
        "expirationDate": scenario.today_plus(5),
    }
    created = client.call(Catalogue.create_paybylink_v3, request=request)
    sim.admin.pend(PAGE_PAYMENT)
    sim.admin.complete_link(created.paymentLink.linkId)
    sim.admin.settle_pending()
    _notified(receiver, 2)
    assert [body["securityToken"] for body in receiver.bodies()] == [created.securityToken] * 2


def test_a_link_payment_settled_declined_fails_the_link_as_an_immediate_decline(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    link_id, order_id = _link(client, scenario, receiver)
    sim.admin.pend(PAGE_PAYMENT, final="116")
    paid = sim.admin.complete_link(link_id)
    sim.admin.settle_pending()
    assert _link_state(client, link_id) == ("FAILED", None, ["DECLINED"])
    assert _notified(receiver, 2) == [(paid["operationId"], "DECLINED"), (paid["operationId"], "PENDING")]
    with pytest.raises(SimulatorAdminError) as closed:
        sim.admin.complete_link(link_id)
    assert closed.value.status == 409
    client.call(Catalogue.renew_paybylink, link_id, request={})  # as after an immediate decline
    again = sim.admin.complete_link(link_id)
    assert again["operationResult"] == "EXECUTED"
    assert _link_state(client, link_id) == ("PAID", again["operationId"], ["DECLINED", "EXECUTED"])
    assert _order(client, order_id)[1:] == (1500, 1500)


@pytest.mark.parametrize(("final", "status", "results"), [("000", "PAID", ["EXECUTED"]), ("116", "FAILED", ["DECLINED"])])
def test_a_link_does_not_expire_under_a_pending_payment(
    client: GatewayClient,
    sim: SimulatorServer,
    scenario: Scenario,
    receiver: Receiver,
    final: str,
    status: str,
    results: list[str],
) -> None:
    link_id, order_id = _link(client, scenario, receiver, days=1)
    sim.admin.pend(PAGE_PAYMENT, final=final)
    paid = sim.admin.complete_link(link_id)
    sim.admin.advance_clock(5 * DAY)  # past the end of its date: the sweep and every read leave it
    assert _link_state(client, link_id) == ("ACTIVE", None, ["PENDING"])
    listed = client.call(Catalogue.list_paybylinks_v3, request={"orderId": order_id}).paymentLinks
    assert [str(link.status) for link in listed] == ["ACTIVE"]
    sim.admin.settle_pending()
    # Settled: the result an immediate payment would have left; a FAILED link does not turn EXPIRED.
    assert _link_state(client, link_id)[::2] == (status, results)
    sim.admin.advance_clock(DAY)
    assert [result for _, result in _order(client, order_id)[0]] == results, "no EXPIRED operation, then or later"
    assert _notified(receiver, 2) == sorted([(paid["operationId"], "PENDING"), (paid["operationId"], results[0])])


def test_a_link_payment_settling_by_the_clock_past_the_links_date_settles_before_any_expiry(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    link_id, order_id = _link(client, scenario, receiver, days=1)
    sim.admin.pend(PAGE_PAYMENT, settle_after=2 * DAY)
    paid = sim.admin.complete_link(link_id)
    sim.admin.advance_clock(DAY + 60)
    assert _link_state(client, link_id) == ("ACTIVE", None, ["PENDING"])
    sim.admin.advance_clock(3 * DAY)  # one move past both the link's date and the settling
    assert _link_state(client, link_id) == ("PAID", paid["operationId"], ["EXECUTED"])
    assert _order(client, order_id) == ([("CAPTURE", "EXECUTED")], 1500, 1500)
    assert sim.admin.operations(operation_id=paid["operationId"])[0]["steps"][-1]["path"] == "/_sim/clock"


def test_a_link_renewed_under_a_pending_payment_stays_in_use(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    link_id, _ = _link(client, scenario, receiver)
    sim.admin.pend(PAGE_PAYMENT)
    sim.admin.complete_link(link_id)
    renewed = client.call(Catalogue.renew_paybylink, link_id, request={"expirationDate": scenario.today_plus(20)})
    assert (renewed.paymentLink.status, renewed.paymentLink.expirationDate) == ("ACTIVE", scenario.today_plus(20))
    with pytest.raises(SimulatorAdminError, match="in use"):
        sim.admin.complete_link(link_id)


def test_a_reservations_deposit_link_pending_then_settled_is_the_original_of_later_charges(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    reservation_id = scenario.reservation(paid=False)
    link = client.call(Catalogue.create_reservation_paybylink, reservation_id, request={}).paymentLink
    sim.admin.pend(PAGE_PAYMENT)
    paid = sim.admin.complete_link(link.linkId)
    assert paid["operationResult"] == "PENDING"
    sim.admin.settle_pending()
    assert scenario.original_operation(reservation_id) == paid["operationId"]
    no_show = client.call(
        Catalogue.create_no_show,
        request={"originalOperationId": paid["operationId"], "amount": "100", "currency": "EUR"},
        idempotency_key="ns-page",
    ).operation
    assert no_show.operationResult == "EXECUTED"


# -- embedded form (build) -----------------------------------------------------------------------------


def _apm_session(client: GatewayClient, scenario: Scenario, receiver: Receiver) -> tuple[str, str]:
    order_id = scenario.new_id("apm")
    request = {
        "merchantUrl": "https://shop.example",
        "order": order(order_id),
        "paymentSession": session(paymentService="MYBANK", notificationUrl=receiver.url),
    }
    created = client.call(Catalogue.create_build_order, request=request)
    assert created.state == "REDIRECTED_TO_EXTERNAL_DOMAIN"
    return created.sessionId, order_id


def _build_state(client: GatewayClient, session_id: str) -> tuple[str, str | None]:
    state = client.call(Catalogue.build_state, request={"sessionId": session_id})
    return str(state.state), None if state.operation is None else str(state.operation.operationResult)


@pytest.mark.parametrize(("final", "settled"), [("000", ("CAPTURE", "EXECUTED")), ("116", ("AUTHORIZATION", "DECLINED"))])
def test_a_build_apm_payment_pending_then_settled(
    client: GatewayClient,
    sim: SimulatorServer,
    scenario: Scenario,
    receiver: Receiver,
    final: str,
    settled: tuple[str, str],
) -> None:
    session_id, order_id = _apm_session(client, scenario, receiver)
    sim.admin.pend(PAGE_PAYMENT, final=final)
    assert sim.admin.fill_build_form(session_id) == "PAYMENT_COMPLETE"
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", "PENDING")
    operations = client.call(Catalogue.get_order, order_id).operations
    assert [(op.paymentMethod, op.paymentCircuit, op.operationResult) for op in operations] == [("APM", "MYBANK", "PENDING")]
    [(operation_id, _)] = _notified(receiver, 1)
    sim.admin.advance_clock(600)  # past the session's 5 minutes: it is complete, nothing expires
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", "PENDING")
    sim.admin.settle_pending(operation_id)
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", settled[1])
    amount = 1500 if final == "000" else 0
    assert _order(client, order_id) == ([settled], amount, amount)
    assert _notified(receiver, 2) == sorted([(operation_id, "PENDING"), (operation_id, settled[1])])
    with pytest.raises(SimulatorAdminError) as again:
        sim.admin.fill_build_form(session_id)
    assert again.value.status == 409


def test_a_build_apm_payment_settles_by_the_simulators_clock(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario, receiver: Receiver
) -> None:
    session_id, order_id = _apm_session(client, scenario, receiver)
    sim.admin.pend(PAGE_PAYMENT, settle_after=120)
    sim.admin.fill_build_form(session_id)
    sim.admin.advance_clock(119)
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", "PENDING")
    sim.admin.advance_clock(2)
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", "EXECUTED")
    assert [result for _, result in _notified(receiver, 2)] == ["EXECUTED", "PENDING"]
    assert _order(client, order_id)[1:] == (1500, 1500)


def test_the_customers_version_2_gdi_step_runs_a_page_payment(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    session_id = scenario.build("2", filled=True, pan=CHALLENGE)
    assert client.call(Catalogue.build_confirm_payment, request={"sessionId": session_id}).state == "GDI_VERIFICATION"
    sim.admin.pend(PAGE_PAYMENT)
    assert sim.admin.complete_build_gdi(session_id) == "PAYMENT_COMPLETE"
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", "PENDING")
    sim.admin.settle_pending()
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", "EXECUTED")


def test_a_failed_3ds_is_final_at_once_and_leaves_the_rule(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    session_id = scenario.build("2", filled=True, pan=CHALLENGE)
    client.call(Catalogue.build_confirm_payment, request={"sessionId": session_id})
    sim.admin.pend(PAGE_PAYMENT)
    sim.admin.complete_build_gdi(session_id, approve=False)
    assert _build_state(client, session_id) == ("PAYMENT_COMPLETE", "THREEDS_FAILED")
    [rule] = sim.admin.pending()["rules"]
    assert (rule["remaining"], rule["fired"]) == (1, 0)


def test_a_page_payment_rule_leaves_the_merchants_build_steps_alone(
    client: GatewayClient, sim: SimulatorServer, scenario: Scenario
) -> None:
    session_id = scenario.build("1", filled=True)
    sim.admin.pend(PAGE_PAYMENT)
    done = client.call(Catalogue.build_finalize_payment, request={"sessionId": session_id})
    assert done.operation is not None and done.operation.operationResult == "EXECUTED"
    assert sim.admin.pending()["rules"][0]["remaining"] == 1


# -- auto-completion (the chaos campaign's customers) --------------------------------------------------


def test_auto_completed_pages_answer_pending_and_settle_by_the_clock() -> None:
    with (
        SimulatorServer(SimulatorConfig(auto_complete_ms=50, sweep_interval_seconds=0.05)) as sim,
        GatewayClient(GatewaySettings(base_url=sim.base_url)) as client,
    ):
        sim.admin.pend(PAGE_PAYMENT, count=2, settle_after=0.3)
        client.call(Catalogue.create_hpp_order, request={"order": order("auto-hpp"), "paymentSession": session()})
        expiry = (sim.admin.now() + timedelta(days=3)).date().isoformat()
        request = {"order": order("auto-pbl"), "paymentSession": session(), "expirationDate": expiry}
        link_id = client.call(Catalogue.create_paybylink, request=request).paymentLink.linkId

        def results() -> list[list[str]]:
            return [
                [step["result"] for step in op["steps"]] for op in sim.admin.operations() if op["operation"] == "auto_complete"
            ]

        wait_until(lambda: results() == [["PENDING", "EXECUTED"]] * 2, what="both pages to pay PENDING, then settle")
        assert str(client.call(Catalogue.get_paybylink, link_id).paymentLink.status) == "PAID"
        assert sim.admin.pending() == {"rules": [sim.admin.pending()["rules"][0]], "operations": []}


def test_pend_accepts_page_payment_and_names_it_when_refusing(sim: SimulatorServer) -> None:
    assert sim.admin.pend(PAGE_PAYMENT, count=3)["rules"][0]["operation"] == "page_payment"
    with pytest.raises(SimulatorAdminError, match="or page_payment"):
        sim.admin.pend("hpp_page")
