"""Every flow kind end to end: real Valkey, a real Celery worker, the simulator over HTTP.

Each flow reaches success, and each reaches its documented failure (decline, 3DS failure, expired
link, gateway 400) with the gateway's error kept in the record.
"""

from __future__ import annotations

import itertools
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durapay.gateway import OperationResult
from durapay.workflows.engine.signals import SignalRefused
from durapay.workflows.engine.states import FlowState
from tests.workflows.integration.conftest import Stack

APPROVE = "4349940199004549"  # published approving VISA, frictionless
CHALLENGE = "5186151650005008"  # published approving MC, 3DS challenge
DECLINE = "4349940199997007"  # published declining VISA (100, do not honour)
THREEDS_FAIL = "5533893874304465"  # published: 3DS failure
SOFT_116 = "4000000000000002"  # last digit 2: soft decline 116
_ids = itertools.count()


def order(amount: int = 1500, currency: str = "EUR") -> dict[str, Any]:
    # A letter between the clock and the count: one digit run of 13 or more would be refused one time in twenty
    # as looking like a card number (workflows.engine.sensitive.card_like).
    return {"orderId": f"ord{time.time_ns() % 10**9}n{next(_ids)}", "amount": str(amount), "currency": currency}


def card(pan: str = APPROVE) -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def session(amount: int = 1500) -> dict[str, Any]:
    return {"actionType": "PAY", "amount": str(amount), "language": "eng", "resultUrl": "https://shop.example/ok"}


def wait_for_state(stack: Stack, flow_id: str, state: FlowState, timeout: float = 20.0) -> Any:
    return stack.engine.wait(flow_id, timeout, states=frozenset({state}))


def assert_operation(record: Any, result: str) -> dict[str, Any]:
    assert record.outcome is not None, record.summary()
    operation: dict[str, Any] = record.outcome["operation"]
    assert operation["operationResult"] == result, record.summary()
    return operation


@pytest.mark.integration
def test_moto_success_and_decline(stack: Stack) -> None:
    done = stack.run("moto", {"order": order(), "card": card()})
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert_operation(done, "EXECUTED")

    declined = stack.run("moto", {"order": order(), "card": card(DECLINE)})
    assert declined.state is FlowState.FAILED
    assert declined.error is not None and declined.error["responseCode"] == "100"
    assert declined.error["decline"] == "soft"


@pytest.mark.integration
def test_card_verification_and_wallet(stack: Stack) -> None:
    verified = stack.run("card_verification", {"order": order(0), "card": card()})
    assert verified.state is FlowState.SUCCEEDED, verified.summary()
    assert_operation(verified, "EXECUTED")
    wallet = stack.run("wallet", {"order": order(), "walletPaymentData": {"pan": APPROVE}})
    assert wallet.state is FlowState.SUCCEEDED, wallet.summary()


@pytest.mark.integration
def test_three_steps_frictionless_challenge_and_failures(stack: Stack) -> None:
    frictionless = stack.run("three_steps", {"order": order(), "card": card()})
    assert frictionless.state is FlowState.SUCCEEDED, frictionless.summary()
    assert set(frictionless.outputs) == {"init", "payment"}

    started = stack.engine.start("three_steps", {"order": order(), "card": card(CHALLENGE), "captureType": "EXPLICIT"})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    assert waiting.customer_url.endswith("/_sim/acs")
    init = waiting.outputs["init"]
    pares = stack.simulator.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"])
    assert stack.engine.signal(started.id, "3ds_result", {"PaRes": pares}) == "resumed"
    done = stack.engine.wait(started.id, 20)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert set(done.outputs) == {"init", "challenge", "validation", "payment"}
    assert_operation(done, "AUTHORIZED")

    failing = stack.engine.start("three_steps", {"order": order(), "card": card(THREEDS_FAIL)})
    waiting = wait_for_state(stack, failing.id, FlowState.WAITING)
    init = waiting.outputs["init"]
    pares = stack.simulator.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"], approve=False)
    stack.engine.signal(failing.id, "3ds_result", {"PaRes": pares})
    failed = stack.engine.wait(failing.id, 20)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "ThreeDSFailed"

    declined = stack.run("three_steps", {"order": order(), "card": card(DECLINE)})
    assert declined.state is FlowState.FAILED and declined.error is not None
    assert declined.error["type"] == "PaymentDeclined"


@pytest.mark.integration
def test_three_steps_challenge_not_answered_expires_at_the_deadline(stack: Stack) -> None:
    started = stack.engine.start("three_steps", {"order": order(), "card": card(CHALLENGE), "challengeTimeoutSeconds": 0.5})
    failed = stack.engine.wait(started.id, 20)
    assert failed.state is FlowState.FAILED
    assert failed.error == {"type": "ChallengeExpired"}
    assert stack.simulator.admin.operations(order_id=failed.order_id, operation_type="CAPTURE") == []


@pytest.mark.integration
def test_svs_init_then_pay(stack: Stack) -> None:
    done = stack.run("svs", {"order": order(), "card": card()})
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert set(done.outputs) == {"init", "pay"}
    declined = stack.run("svs", {"order": order(), "card": card(SOFT_116)})
    assert declined.state is FlowState.FAILED and declined.error is not None
    assert declined.error["responseCode"] == "116"


@pytest.mark.integration
def test_gateway_400_ends_the_flow_with_the_gateway_error(stack: Stack) -> None:
    """A session amount above the order amount is PS0007 at the gateway."""
    body = {"order": order(1000), "paymentSession": session(5000)}
    failed = stack.run("hpp", body)
    assert failed.state is FlowState.FAILED
    assert failed.error is not None and failed.error["status"] == 400
    assert failed.error["errors"][0]["code"] == "PS0007"


@pytest.mark.integration
def test_hosted_page_paid_then_read_at_the_deadline(clocked_stack: Stack) -> None:
    """Paid, the notification lost: the read at the deadline (passed by moving the engine's clock, so the
    payment is in before it however slow the machine) finds the payment."""
    stack = clocked_stack
    started = stack.engine.start("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 60})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    assert waiting.customer_url and "/_sim/hpp/" in waiting.customer_url
    stack.simulator.admin.complete_hpp(waiting.order_id)
    stack.pass_deadline(started.id)
    done = stack.engine.wait(started.id, 20)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outputs["payment"]["readAtDeadline"] is True

    abandoned = stack.run("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 0.5})
    assert abandoned.state is FlowState.FAILED


@pytest.mark.integration
def test_hosted_page_resumed_by_a_notification_signal(stack: Stack) -> None:
    started = stack.engine.start("hpp", {"order": order(), "paymentSession": session()})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    paid = stack.simulator.admin.complete_hpp(waiting.order_id)
    operation = {"orderId": waiting.order_id, "operationId": paid["operationId"], "operationResult": paid["operationResult"]}
    assert stack.engine.signal(started.id, "notification", {"operation": operation}, by="notification") == "resumed"
    done = stack.engine.wait(started.id, 20)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert stack.engine.tokens_for_order(waiting.order_id) == [waiting.outputs["create"]["securityToken"]]


@pytest.mark.integration
@pytest.mark.parametrize("version", ["v3", "v2", "v1", "unversioned"])
def test_paybylink_every_version(stack: Stack, version: str) -> None:
    expires = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
    started = stack.engine.start(
        "paybylink", {"order": order(), "paymentSession": session(), "expirationDate": expires, "version": version}
    )
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    link = waiting.outputs["create"]["paymentLink"]
    assert waiting.customer_url == link["link"]
    paid = stack.simulator.admin.complete_link(link["linkId"])
    operation = {"orderId": waiting.order_id, "operationId": paid["operationId"], "operationResult": paid["operationResult"]}
    stack.engine.signal(started.id, "notification", {"operation": operation}, by="notification")
    done = stack.engine.wait(started.id, 20)
    assert done.state is FlowState.SUCCEEDED, done.summary()


@pytest.mark.integration
def test_paybylink_expired_cancel_and_renew(stack: Stack) -> None:
    expires = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    started = stack.engine.start("paybylink", {"order": order(), "paymentSession": session(), "expirationDate": expires})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    link_id = waiting.outputs["create"]["paymentLink"]["linkId"]

    renewed = stack.run("paybylink_renew", {"linkId": link_id})
    assert renewed.state is FlowState.SUCCEEDED, renewed.summary()
    cancelled = stack.run("paybylink_cancel", {"linkId": link_id})
    assert cancelled.state is FlowState.SUCCEEDED, cancelled.summary()
    again = stack.run("paybylink_cancel", {"linkId": link_id})
    assert again.state is FlowState.FAILED, "a used or cancelled link cannot be cancelled twice"

    # The waiting flow learns that its link will never be paid: from the cancellation's notification, or
    # (that one lost) at its deadline, moved to now here.
    record = stack.engine.get(started.id)
    if record.state is FlowState.WAITING and record.wait is not None:
        past = json.dumps({**record.wait, "deadline": 0})  # its deadline is now
        stack.runtime.redis.hset(stack.engine.keys.flow(started.id), mapping={"due": "0", "wait": past})
        stack.runtime.redis.zadd(stack.engine.keys.due_of(started.id), {started.id: 0})
    failed = stack.engine.wait(record.id, 20)
    assert failed.state is FlowState.FAILED
    assert failed.error is not None and failed.error["type"] in {"LinkCancelled", "LinkExpired", "Cancelled"}


@pytest.mark.integration
def test_embedded_form_versions_and_cancel(stack: Stack) -> None:
    for version in ("3", "2"):
        body = {
            "merchantUrl": "https://shop.example",
            "order": order(),
            "paymentSession": session(),
            "version": version,
        }
        started = stack.engine.start("build", body)
        waiting = wait_for_state(stack, started.id, FlowState.WAITING)
        session_id = waiting.outputs["create"]["sessionId"]
        stack.simulator.admin.fill_build_form(session_id)
        stack.engine.signal(started.id, "form_completed", {})
        done = stack.engine.wait(started.id, 20)
        assert done.state is FlowState.SUCCEEDED, (version, done.summary())

    started = stack.engine.start("build", {"merchantUrl": "https://shop.example", "order": order(), "paymentSession": session()})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    cancelled = stack.run("build_cancel", {"sessionId": waiting.outputs["create"]["sessionId"]})
    assert cancelled.state is FlowState.SUCCEEDED, cancelled.summary()


@pytest.mark.integration
def test_a_form_completed_signal_is_no_proof_of_payment(stack: Stack) -> None:
    body = {"merchantUrl": "https://shop.example", "order": order(), "paymentSession": session()}
    started = stack.engine.start("build", body)
    wait_for_state(stack, started.id, FlowState.WAITING)
    forged = {"operation": {"operationId": "forged", "operationResult": "EXECUTED", "orderId": started.order_id}}
    with pytest.raises(SignalRefused, match="unknown field"):  # a form_completed carries nothing
        stack.engine.signal(started.id, "form_completed", forged)
    assert stack.engine.get(started.id).signals == [], "nothing stored"
    stack.engine.signal(started.id, "form_completed", {})  # the form was never filled in
    done = stack.engine.wait(started.id, 20)
    assert done.state is not FlowState.SUCCEEDED, done.summary()
    assert done.outputs["form"] == {"formCompleted": True}, "the signal's payload is not taken as the gateway's word"
    assert "forged" not in str(done.outcome)


@pytest.mark.integration
def test_mit_after_contract_creation_then_deactivation(stack: Stack) -> None:
    contract = f"ct{time.time_ns() % 10**12}"
    recurrence = {"action": "CONTRACT_CREATION", "contractId": contract, "contractType": "MIT_UNSCHEDULED"}
    first = stack.run("three_steps", {"order": {**order(), "customerId": "cust-1"}, "card": card(), "recurrence": recurrence})
    assert first.state is FlowState.SUCCEEDED, first.summary()
    mit = stack.run("mit", {"order": order(990), "contractId": contract})
    assert mit.state is FlowState.SUCCEEDED, mit.summary()
    deactivated = stack.run("deactivate_contract", {"contractId": contract})
    assert deactivated.state is FlowState.SUCCEEDED, deactivated.summary()
    refused = stack.run("mit", {"order": order(990), "contractId": contract})
    assert refused.state is FlowState.FAILED
    assert refused.error is not None and refused.error["errors"][0]["code"] == "PS0017"


@pytest.mark.integration
def test_capture_refund_and_cancel_of_a_capture(stack: Stack) -> None:
    authorized = stack.run("moto", {"order": order(2000), "card": card(), "captureType": "EXPLICIT"})
    auth = assert_operation(authorized, OperationResult.AUTHORIZED.value)
    captured = stack.run("capture", {"operationId": auth["operationId"], "amount": 2000, "currency": "EUR"})
    assert captured.state is FlowState.SUCCEEDED, captured.summary()
    capture_op = assert_operation(captured, "EXECUTED")
    cancelled = stack.run("cancel_capture", {"operationId": capture_op["operationId"]})
    assert cancelled.state is FlowState.SUCCEEDED, cancelled.summary()

    paid = stack.run("moto", {"order": order(3000), "card": card()})
    sale = assert_operation(paid, "EXECUTED")
    refunded = stack.run("refund", {"operationId": sale["operationId"], "amount": 1000, "currency": "EUR"})
    assert refunded.state is FlowState.SUCCEEDED, refunded.summary()
    too_much = stack.run("refund", {"operationId": sale["operationId"], "amount": 5000, "currency": "EUR"})
    assert too_much.state is FlowState.FAILED
    assert too_much.error is not None and too_much.error["errors"][0]["code"] == "PS0029"
