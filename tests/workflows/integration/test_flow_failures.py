"""Every flow kind reaches its documented failure, with the gateway's error or decline kept in the record.

Real Valkey, a real Celery worker, the simulator over HTTP (its own instance here: one test moves the
simulator's clock two days forward to let a link expire).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from simulator import SimulatorConfig, SimulatorServer
from tests.workflows.integration.conftest import Stack
from tests.workflows.integration.test_flows import APPROVE, DECLINE, assert_operation, card, order, session, wait_for_state
from workflows.states import FlowState

pytestmark = pytest.mark.integration

SOFT_116 = "4000000000000002"  # last digit 2: insufficient funds (soft)
HARD_208 = "4000000000000004"  # last digit 4: lost card (hard)


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorServer]:
    """This module's own simulator (overrides the session's): its clock may move."""
    with SimulatorServer(SimulatorConfig(seed=17)) as sim:
        yield sim


def gateway_codes(record: Any) -> list[str]:
    assert record.error is not None, record.summary()
    return [error["code"] for error in record.error.get("errors", [])]


def link_input(days: int = 1) -> dict[str, Any]:
    expires = (datetime.now(UTC) + timedelta(days=days)).date().isoformat()
    return {"order": order(), "paymentSession": session(), "expirationDate": expires}


def build_input(**extra: Any) -> dict[str, Any]:
    return {"merchantUrl": "https://shop.example", "order": order(), "paymentSession": session(), **extra}


def test_card_verification_declined_keeps_the_hard_decline(stack: Stack) -> None:
    declined = stack.run("card_verification", {"order": order(0), "card": card(HARD_208)})
    assert declined.state is FlowState.FAILED, declined.summary()
    assert declined.error is not None
    assert (declined.error["responseCode"], declined.error["decline"]) == ("208", "hard")


def test_wallet_declined_keeps_the_soft_decline(stack: Stack) -> None:
    declined = stack.run("wallet", {"order": order(), "walletPaymentData": {"outcome": "116"}})
    assert declined.state is FlowState.FAILED, declined.summary()
    assert declined.error is not None
    assert (declined.error["responseCode"], declined.error["decline"]) == ("116", "soft")


@pytest.mark.parametrize(("pay", "code"), [({"pan": DECLINE}, "100"), ({"cancel": True}, None)], ids=["declined", "cancelled"])
def test_hosted_page_declined_or_cancelled_on_the_page_is_read_at_the_deadline(
    stack: Stack, pay: dict[str, Any], code: str | None
) -> None:
    started = stack.engine.start("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 1.5})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    stack.simulator.admin.complete_hpp(waiting.order_id, **pay)
    failed = stack.engine.wait(started.id, 20)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error.get("responseCode") == code, failed.error
    assert failed.outputs["payment"]["readAtDeadline"] is True


def test_embedded_form_not_completed_by_its_deadline(stack: Stack) -> None:
    failed = stack.run("build", build_input(formSeconds=0.5))
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error == {"type": "Expired"}
    assert "finalize" not in failed.outputs, "nothing was paid"


@pytest.mark.parametrize("version", ["3", "2"])
def test_embedded_form_declined(stack: Stack, version: str) -> None:
    started = stack.engine.start("build", build_input(version=version))
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    stack.simulator.admin.fill_build_form(waiting.outputs["create"]["sessionId"], pan=SOFT_116)
    stack.engine.signal(started.id, "form_completed", {})
    failed = stack.engine.wait(started.id, 20)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["responseCode"] == "116"


def test_build_cancel_of_an_unknown_session_keeps_the_gateway_error(stack: Stack) -> None:
    failed = stack.run("build_cancel", {"sessionId": "no-such-session"})
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["status"] in {400, 404}


def test_paybylink_expires_when_the_gateway_clock_passes_its_date(stack: Stack) -> None:
    started = stack.engine.start("paybylink", link_input(days=1))
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    link_id = waiting.outputs["create"]["paymentLink"]["linkId"]
    stack.simulator.admin.advance_clock(2 * 86400)  # the gateway expires the link (and notifies)
    assert stack.simulator.admin.operations(order_id=waiting.order_id, operation_result="EXPIRED")
    # The flow's own deadline is the end of the expiration day in real time: bring it forward.
    stack.runtime.redis.zadd(stack.engine.keys.due_of(started.id), {started.id: 0})
    stack.runtime.redis.hset(stack.engine.keys.flow(started.id), "due", "0")
    failed = stack.engine.wait(started.id, 20)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None
    assert (failed.error["type"], failed.error["operationResult"]) == ("Expired", "EXPIRED"), "the gateway's expiry"
    renewed = stack.run("paybylink_renew", {"linkId": link_id})
    assert renewed.state is FlowState.SUCCEEDED, "an expired link can be renewed"


def test_a_paid_link_can_be_neither_renewed_nor_cancelled(stack: Stack) -> None:
    started = stack.engine.start("paybylink", link_input(days=3))
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    link_id = waiting.outputs["create"]["paymentLink"]["linkId"]
    stack.simulator.admin.complete_link(link_id, pan=APPROVE)
    renewal = stack.run("paybylink_renew", {"linkId": link_id})
    assert renewal.state is FlowState.FAILED, renewal.summary()
    assert gateway_codes(renewal) == ["PS0042"], "paybylink validation"
    cancel = stack.run("paybylink_cancel", {"linkId": link_id})
    assert cancel.state is FlowState.FAILED, cancel.summary()
    assert gateway_codes(cancel) == ["PS0045"], "already used"


def test_capture_above_the_authorized_amount_is_refused(stack: Stack) -> None:
    authorized = stack.run("moto", {"order": order(2000), "card": card(), "captureType": "EXPLICIT"})
    auth = assert_operation(authorized, "AUTHORIZED")
    refused = stack.run("capture", {"operationId": auth["operationId"], "amount": 2500, "currency": "EUR"})
    assert refused.state is FlowState.FAILED, refused.summary()
    assert gateway_codes(refused), refused.error
    assert stack.simulator.admin.operations(order_id=authorized.order_id, operation_type="CAPTURE") == []


def test_cancel_capture_of_an_operation_that_is_no_capture_is_refused(stack: Stack) -> None:
    authorized = stack.run("moto", {"order": order(2000), "card": card(), "captureType": "EXPLICIT"})
    auth = assert_operation(authorized, "AUTHORIZED")
    refused = stack.run("cancel_capture", {"operationId": auth["operationId"]})
    assert refused.state is FlowState.FAILED, refused.summary()
    assert refused.error is not None and refused.error["status"] in {400, 404}


def test_deactivating_an_unknown_contract_keeps_the_gateway_error(stack: Stack) -> None:
    refused = stack.run("deactivate_contract", {"contractId": "no-such-contract"})
    assert refused.state is FlowState.FAILED, refused.summary()
    assert refused.error is not None and refused.error["status"] in {400, 404}


def test_refund_of_an_unknown_operation_keeps_the_gateway_error(stack: Stack) -> None:
    refused = stack.run("refund", {"operationId": "999999999", "amount": 100, "currency": "EUR"})
    assert refused.state is FlowState.FAILED, refused.summary()
    assert refused.error is not None and refused.error["status"] in {400, 404}
