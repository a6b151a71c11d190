"""Every flow kind's documented failures end to end: real Valkey, a real Celery worker, the simulator.

docs/flows.md lists, per kind, how a flow fails: a decline (ISO code, soft or hard), a 3DS failure,
an expired link or session, the customer cancelling, no payment by the deadline, a gateway 400/404.
Each test drives the simulator to that failure and checks both the final state and that the record
keeps the gateway's word: the decline (``responseCode``, ``decline``, the operation) or the error
(``status`` and the ``errors`` list of the answer), and the operation in ``outcome``.

Two stacks: ``stack`` (conftest's, on this module's own simulator, whose notifications go nowhere and
whose clock never moves) and ``live`` (below, one per test: a private simulator whose clock the test may
move, the receiver served over HTTP so that the simulator's notifications reach the flows as they would
in production, and an engine clock the test may move past a wait's deadline instead of sleeping).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from durapay.config.embedded import free_port
from durapay.service.app import create_app
from durapay.service.runtime import build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine.clock import OffsetClock
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from tests.waiting import wait_until
from tests.workflows.integration.conftest import Stack, stack_settings
from tests.workflows.integration.test_flows import (
    APPROVE,
    DECLINE,
    SOFT_116,
    THREEDS_FAIL,
    assert_operation,
    card,
    order,
    session,
    wait_for_state,
)

HARD_208 = "4000000000000004"  # last digit 4: declined 208 lost card (hard)
HARD_209 = "4000000000000005"  # last digit 5: declined 209 stolen card (hard)
RISK = "4000000000000008"  # last digit 8: DENIED_BY_RISK, 102
MERCHANT_URL = "https://shop.example"
API_KEY = "flow-failures-test-key-0123456789"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorServer]:
    """This module's own simulator for ``stack`` (overrides the session's); its clock is never moved."""
    with SimulatorServer(SimulatorConfig(seed=17)) as sim:
        yield sim


# -- what a failed record must keep ------------------------------------------------------------------


def assert_declined(record: FlowRecord, code: str, kind: str | None, *, result: str = "DECLINED") -> dict[str, Any]:
    """Failed on a decline: the error and the outcome both carry the gateway's operation and ISO code."""
    assert record.state is FlowState.FAILED, record.summary()
    error = record.error
    assert error is not None, record.summary()
    assert error["type"] == "PaymentDeclined", error
    assert error["operationResult"] == result, error
    assert error["responseCode"] == code, error
    assert error["decline"] == kind, error
    assert record.outcome is not None and record.outcome["result"] == "failed", record.summary()
    operation = assert_operation(record, result)
    assert operation["operationId"] == error["operationId"]
    assert operation["responseCode"] == code
    assert error["operationId"] in record.outcome["operationIds"]
    return operation


def assert_gateway_error(record: FlowRecord, code: str | None, status: int = 400) -> dict[str, Any]:
    """Failed on a gateway refusal: the HTTP status and the answer's ``errors`` are in the record."""
    assert record.state is FlowState.FAILED, record.summary()
    error = record.error
    assert error is not None, record.summary()
    assert error["status"] == status, error
    assert [item["code"] for item in error["errors"]] == ([code] if code else []), error
    assert error["retryable"] is False, error
    assert record.outcome is not None and record.outcome["result"] == "failed", record.summary()
    assert record.outcome["reason"], record.summary()
    return error


def gateway_operation(sim: SimulatorServer, operation_id: str) -> dict[str, Any]:
    """The operation as the simulator recorded it."""
    found = sim.admin.operations(operation_id=operation_id)
    assert len(found) == 1, found
    return found[0]


# -- a private stack: its own simulator (clock free to move), the receiver over HTTP ---------------------


@dataclass
class Live:
    stack: Stack  # on a clock the test moves (Stack.pass_deadline)

    @property
    def sim(self) -> SimulatorServer:
        return self.stack.simulator


@pytest.fixture
def live(redis_url: str, key_prefix: str) -> Iterator[Live]:
    port = free_port()
    config = SimulatorConfig(seed=23, notify_backoff_ms=50, notify_backoff_cap_ms=500, sweep_interval_seconds=0.1)
    with SimulatorServer(config) as sim, ExitStack() as stack:
        settings = stack_settings(
            key_prefix,
            sim.base_url,
            receiver={"public_url": f"http://127.0.0.1:{port}/notifications"},
            api={"key": API_KEY},
        )
        clock = OffsetClock()
        runtime = build_runtime(settings, redis_url=redis_url, clock=clock, rng=random.Random(29))
        stack.callback(runtime.close)
        stack.enter_context(ApiServer(create_app(runtime), port=port))
        dispatcher = Dispatcher(runtime.engine, interval=0.05)
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=4, perform_ping_check=False))
        dispatcher.start()
        stack.callback(dispatcher.stop)
        yield Live(Stack(runtime, sim, dispatcher, clock))


def delivered(sim: SimulatorServer, order_id: str, result: str) -> list[dict[str, Any]]:
    """Wait until the simulator delivered (HTTP 2xx from the receiver) a notification of ``result``."""

    def probe() -> list[dict[str, Any]]:
        return [n for n in sim.admin.notifications(order_id=order_id, state="delivered") if n["operationResult"] == result]

    return wait_until(probe, 30, f"the {result} notification of {order_id} to be delivered")


# -- one-call payments: card verification, wallet ----------------------------------------------------


@pytest.mark.parametrize(
    ("pan", "code", "kind", "result"),
    [(DECLINE, "100", "soft", "DECLINED"), (HARD_208, "208", "hard", "DECLINED"), (RISK, "102", "hard", "DENIED_BY_RISK")],
)
def test_card_verification_declined(stack: Stack, pan: str, code: str, kind: str, result: str) -> None:
    failed = stack.run("card_verification", {"order": order(0), "card": card(pan)})
    operation = assert_declined(failed, code, kind, result=result)
    assert operation["operationType"] == "CARD_VERIFICATION"
    assert gateway_operation(stack.simulator, operation["operationId"])["operationResult"] == result


@pytest.mark.parametrize(
    ("wallet_data", "code", "kind"),
    [
        ({"outcome": "116"}, "116", "soft"),
        ({"pan": HARD_209}, "209", "hard"),
        ({"pan": DECLINE, "wallet": "APPLE_PAY"}, "100", "soft"),
    ],
)
def test_wallet_declined(stack: Stack, wallet_data: dict[str, str], code: str, kind: str) -> None:
    failed = stack.run("wallet", {"order": order(), "walletPaymentData": wallet_data})
    operation = assert_declined(failed, code, kind)
    assert operation["operationAmount"] == "1500"
    assert gateway_operation(stack.simulator, operation["operationId"])["operationResult"] == "DECLINED"


# -- hosted payment page -----------------------------------------------------------------------------


def test_hpp_card_declined_on_the_page_reported_by_the_notification(live: Live) -> None:
    engine = live.stack.engine
    started = engine.start("hpp", {"order": order(), "paymentSession": session()})
    waiting = wait_for_state(live.stack, started.id, FlowState.WAITING)
    attempt = live.sim.admin.complete_hpp(waiting.order_id, pan=DECLINE)
    assert attempt["operationResult"] == "DECLINED"
    failed = engine.wait(started.id, 30)
    operation = assert_declined(failed, "100", "soft")
    assert operation["operationId"] == attempt["operationId"]
    assert "readAtDeadline" not in failed.outputs["payment"], "the notification, not the deadline, ended it"
    assert failed.outputs["payment"]["readAfterNotification"] is True, "checked against the order (the page is over)"
    assert delivered(live.sim, waiting.order_id, "DECLINED")


@pytest.mark.parametrize("cancel", [False, True], ids=["declined", "cancelled"])
def test_hpp_declined_or_cancelled_read_at_the_deadline_when_the_notification_is_lost(live: Live, cancel: bool) -> None:
    live.sim.admin.set_faults(mode="notify_drop")
    engine = live.stack.engine
    started = engine.start("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 900})
    waiting = wait_for_state(live.stack, started.id, FlowState.WAITING)
    attempt = live.sim.admin.complete_hpp(waiting.order_id, pan=SOFT_116, cancel=cancel)
    live.stack.pass_deadline(started.id)
    failed = engine.wait(started.id, 30)
    if cancel:
        assert failed.state is FlowState.FAILED, failed.summary()
        assert failed.error is not None and failed.error["type"] == "Cancelled", failed.error
        assert failed.error["operationId"] == attempt["operationId"]
        assert_operation(failed, "CANCELED")
    else:
        operation = assert_declined(failed, "116", "soft")
        assert operation["operationId"] == attempt["operationId"]
    assert failed.outputs["payment"]["readAtDeadline"] is True


def test_hpp_cancelled_by_the_customer(live: Live) -> None:
    engine = live.stack.engine
    started = engine.start("hpp", {"order": order(), "paymentSession": session()})
    waiting = wait_for_state(live.stack, started.id, FlowState.WAITING)
    cancelled = live.sim.admin.complete_hpp(waiting.order_id, cancel=True)
    failed = engine.wait(started.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "Cancelled", failed.error
    assert failed.error["operationId"] == cancelled["operationId"]
    assert_operation(failed, "CANCELED")


def test_hpp_no_payment_by_the_deadline(stack: Stack) -> None:
    failed = stack.run("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 0.5})
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error == {"type": "Expired"}
    assert failed.outcome is not None and "no payment by the deadline" in failed.outcome["reason"]
    assert failed.outcome["operationIds"] == [], "the gateway recorded no payment"
    assert stack.simulator.admin.operations(order_id=failed.order_id) == []


# -- pay-by-link ---------------------------------------------------------------------------------------


def _start_link(stack: Stack, expires: str | None = None) -> tuple[FlowRecord, str]:
    """A paybylink flow waiting for its customer, and its link id."""
    day = expires or (stack.simulator.admin.now() + timedelta(days=3)).date().isoformat()
    started = stack.engine.start("paybylink", {"order": order(), "paymentSession": session(), "expirationDate": day})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    return waiting, str(waiting.outputs["create"]["paymentLink"]["linkId"])


def test_paybylink_card_declined_on_the_link(live: Live) -> None:
    waiting, link_id = _start_link(live.stack)
    attempt = live.sim.admin.complete_link(link_id, pan=HARD_208)
    failed = live.stack.engine.wait(waiting.id, 30)
    operation = assert_declined(failed, "208", "hard")
    assert operation["operationId"] == attempt["operationId"]
    assert failed.outcome is not None and failed.outcome["paymentLink"]["linkId"] == link_id


def test_paybylink_expires_when_the_gateway_clock_passes_its_date_notified(live: Live) -> None:
    """The simulator's clock moves past the link's expiration day: the gateway expires the link, records
    an EXPIRED operation and notifies; the flow fails as expired with that operation in its record."""
    today = live.sim.admin.now().date().isoformat()
    waiting, link_id = _start_link(live.stack, expires=today)
    live.sim.admin.advance_clock(timedelta(days=2).total_seconds())
    assert live.sim.state.links[link_id].status == "EXPIRED"
    (expired_op,) = live.sim.admin.operations(order_id=waiting.order_id, operation_result="EXPIRED")

    failed = live.stack.engine.wait(waiting.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "Expired", failed.error
    assert failed.error["operationId"] == expired_op["operationId"]
    assert failed.error["operationResult"] == "EXPIRED"
    operation = assert_operation(failed, "EXPIRED")
    assert operation["operationId"] == expired_op["operationId"]
    assert failed.outcome is not None and failed.outcome["paymentLink"]["linkId"] == link_id
    assert delivered(live.sim, waiting.order_id, "EXPIRED")
    renewed = live.stack.run("paybylink_renew", {"linkId": link_id})
    assert renewed.state is FlowState.SUCCEEDED, "an expired link can be renewed"


def test_an_expired_links_outcome_reports_the_gateways_link_status(live: Live) -> None:
    today = live.sim.admin.now().date().isoformat()
    waiting, link_id = _start_link(live.stack, expires=today)
    live.sim.admin.advance_clock(timedelta(days=2).total_seconds())
    failed = live.stack.engine.wait(waiting.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert live.sim.state.links[link_id].status == "EXPIRED"
    assert failed.outcome is not None
    assert failed.outcome["paymentLink"]["status"] == "EXPIRED", failed.outcome["paymentLink"]


def test_paybylink_expiry_read_at_the_next_read_when_the_notification_is_lost(live: Live) -> None:
    """No notification arrives: at its next read (an open link is read at a pace, before the end of its
    expiration day by durapay's clock) the flow reads the order and finds the gateway's EXPIRED operation."""
    live.sim.admin.set_faults(mode="notify_drop")
    today = live.sim.admin.now().date().isoformat()
    waiting, link_id = _start_link(live.stack, expires=today)
    live.sim.admin.advance_clock(timedelta(days=2).total_seconds())
    assert live.sim.state.links[link_id].status == "EXPIRED"
    (expired_op,) = live.sim.admin.operations(order_id=waiting.order_id, operation_result="EXPIRED")
    assert live.stack.engine.get(waiting.id).state is FlowState.WAITING, "nothing told the flow yet"

    live.stack.pass_deadline(waiting.id)
    failed = live.stack.engine.wait(waiting.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "Expired", failed.error
    assert failed.error["operationId"] == expired_op["operationId"]
    assert failed.outputs["payment"]["readWhileWaiting"] is True
    assert_operation(failed, "EXPIRED")
    assert failed.outcome is not None and failed.outcome["paymentLink"]["status"] == "EXPIRED"


def test_paybylink_cancelled_by_the_merchant_ends_the_waiting_flow(live: Live) -> None:
    """A ``paybylink_cancel`` flow cancels the link; the gateway records a CANCELED operation and notifies
    the waiting ``paybylink`` flow, which fails as cancelled with that operation."""
    waiting, link_id = _start_link(live.stack)
    assert live.stack.run("paybylink_cancel", {"linkId": link_id}).state is FlowState.SUCCEEDED
    (cancelled_op,) = live.sim.admin.operations(order_id=waiting.order_id, operation_result="CANCELED")
    failed = live.stack.engine.wait(waiting.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "Cancelled", failed.error
    assert failed.error["operationId"] == cancelled_op["operationId"]
    assert_operation(failed, "CANCELED")


def test_paybylink_refused_by_the_gateway(stack: Stack) -> None:
    """An expiration date more than 90 days ahead passes the input model and is refused by the gateway."""
    too_far = (stack.simulator.admin.now() + timedelta(days=120)).date().isoformat()
    failed = stack.run("paybylink", {"order": order(), "paymentSession": session(), "expirationDate": too_far})
    error = assert_gateway_error(failed, "PS0026")
    assert "expirationDate" in error["errors"][0]["description"]
    assert "create" not in failed.outputs


def test_paybylink_renew_refused_for_a_paid_or_unknown_link(stack: Stack) -> None:
    waiting, link_id = _start_link(stack)
    paid = stack.simulator.admin.complete_link(link_id)
    operation = {"orderId": waiting.order_id, "operationId": paid["operationId"], "operationResult": paid["operationResult"]}
    stack.engine.signal(waiting.id, "notification", {"operation": operation}, by="notification")
    assert stack.engine.wait(waiting.id, 30).state is FlowState.SUCCEEDED

    refused = stack.run("paybylink_renew", {"linkId": link_id})
    error = assert_gateway_error(refused, "PS0042")
    assert "PAID" in error["errors"][0]["description"]
    assert_gateway_error(stack.run("paybylink_renew", {"linkId": "L-no-such-link"}), None, status=404)


def test_paybylink_cancel_refused_for_a_paid_or_cancelled_link(stack: Stack) -> None:
    _, paid_link = _start_link(stack)
    stack.simulator.admin.complete_link(paid_link)
    assert_gateway_error(stack.run("paybylink_cancel", {"linkId": paid_link}), "PS0045")

    _, open_link = _start_link(stack)
    assert stack.run("paybylink_cancel", {"linkId": open_link}).state is FlowState.SUCCEEDED
    error = assert_gateway_error(stack.run("paybylink_cancel", {"linkId": open_link}), "PS0044")
    assert "CANCELLED" in error["errors"][0]["description"]
    renewal = stack.run("paybylink_renew", {"linkId": open_link})
    assert_gateway_error(renewal, "PS0042")


# -- embedded form (build) -----------------------------------------------------------------------------


def _start_build(stack: Stack, version: str = "3", **extra: Any) -> tuple[FlowRecord, str]:
    body = {"merchantUrl": MERCHANT_URL, "order": order(), "paymentSession": session(), "version": version, **extra}
    started = stack.engine.start("build", body)
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    return waiting, str(waiting.outputs["create"]["sessionId"])


@pytest.mark.parametrize("version", ["3", "2"])
def test_build_card_declined(stack: Stack, version: str) -> None:
    """The customer enters a declining card in the form (as a browser posts it), the page signals."""
    waiting, session_id = _start_build(stack, version)
    assert stack.simulator.admin.fill_build_form(session_id, pan=DECLINE) == "READY_FOR_PAYMENT"
    stack.engine.signal(waiting.id, "form_completed", {})
    failed = stack.engine.wait(waiting.id, 30)
    operation = assert_declined(failed, "100", "soft")
    assert gateway_operation(stack.simulator, operation["operationId"])["orderId"] == waiting.order_id


def test_build_3ds_failed_in_the_form(stack: Stack) -> None:
    waiting, session_id = _start_build(stack, "3")
    assert stack.simulator.admin.fill_build_form(session_id, pan=THREEDS_FAIL, complete_gdi=False) == "GDI_VERIFICATION"
    assert stack.simulator.admin.complete_build_gdi(session_id, approve=False) == "READY_FOR_PAYMENT"
    stack.engine.signal(waiting.id, "form_completed", {})
    failed = stack.engine.wait(waiting.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "ThreeDSFailed", failed.error
    operation = assert_operation(failed, "THREEDS_FAILED")
    assert operation["operationId"] == failed.error["operationId"]


def test_build_form_not_completed_by_the_deadline(clocked_stack: Stack) -> None:
    """The deadline passed by moving the engine's clock: the waiting flow is seen however slow the machine."""
    stack = clocked_stack
    waiting, session_id = _start_build(stack, formSeconds=60)
    stack.pass_deadline(waiting.id)
    failed = stack.engine.wait(waiting.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "Expired", failed.error
    assert failed.outcome is not None and "(state PAYMENT_METHOD_SELECTION)" in failed.outcome["reason"], failed.outcome
    # durapay's deadline closed the untouched form (/build/cancel), so the customer can no longer pay on it
    assert stack.simulator.state.build_sessions[session_id].state == "PAYMENT_COMPLETE"
    (closed,) = stack.simulator.admin.operations(order_id=failed.order_id)
    assert closed["operationResult"] in {"CANCELED", "CANCELLED"}, "nothing was charged"


def test_build_session_expired_at_the_gateway(live: Live) -> None:
    """The simulator's clock passes the session's five minutes: the gateway ends it with an EXPIRED
    operation and notifies; the flow fails as expired; a cancel of that session is refused (PS0026)."""
    waiting, session_id = _start_build(live.stack)
    live.sim.admin.advance_clock(timedelta(minutes=6).total_seconds())
    (expired_op,) = live.sim.admin.operations(order_id=waiting.order_id, operation_result="EXPIRED")
    failed = live.stack.engine.wait(waiting.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    assert failed.error is not None and failed.error["type"] == "Expired", failed.error
    assert failed.error["operationId"] == expired_op["operationId"]
    assert_operation(failed, "EXPIRED")

    refused = live.stack.run("build_cancel", {"sessionId": session_id})
    error = assert_gateway_error(refused, "PS0026")
    assert "expired" in error["errors"][0]["description"]


def test_build_refused_by_the_gateway(stack: Stack) -> None:
    """A merchant URL with a path is refused by the gateway (GW0001) when the order is created."""
    body = {"merchantUrl": f"{MERCHANT_URL}/shop/checkout", "order": order(), "paymentSession": session()}
    failed = stack.run("build", body)
    error = assert_gateway_error(failed, "GW0001")
    assert "merchant URL" in error["errors"][0]["description"]


def test_build_cancel_of_an_unknown_or_finished_session(stack: Stack) -> None:
    assert_gateway_error(stack.run("build_cancel", {"sessionId": "S-no-such-session"}), None, status=404)

    waiting, session_id = _start_build(stack)
    assert stack.run("build_cancel", {"sessionId": session_id}).state is FlowState.SUCCEEDED
    again = stack.run("build_cancel", {"sessionId": session_id})
    error = assert_gateway_error(again, "PS0026")
    assert "already complete" in error["errors"][0]["description"]
    stack.engine.cancel(waiting.id, "test over")


# -- back office: capture, cancel of a capture, refund, contract deactivation ---------------------------


def _authorized(stack: Stack, amount: int = 2000) -> str:
    return str(_authorization(stack, amount)["operationId"])


def _authorization(stack: Stack, amount: int) -> dict[str, Any]:
    done = stack.run("moto", {"order": order(amount), "card": card(APPROVE), "captureType": "EXPLICIT"})
    return assert_operation(done, "AUTHORIZED")


def _sale(stack: Stack, amount: int = 3000) -> str:
    done = stack.run("moto", {"order": order(amount), "card": card(APPROVE)})
    return str(assert_operation(done, "EXECUTED")["operationId"])


def test_capture_refused(stack: Stack) -> None:
    authorization = _authorization(stack, 2000)
    auth = str(authorization["operationId"])
    too_much = stack.run("capture", {"operationId": auth, "amount": 2500, "currency": "EUR"})
    error = assert_gateway_error(too_much, "PS0026")
    assert "amount" in error["errors"][0]["description"]
    wrong_currency = stack.run("capture", {"operationId": auth, "amount": 1000, "currency": "USD"})
    assert_gateway_error(wrong_currency, "PS0009")
    assert stack.simulator.admin.operations(order_id=authorization["orderId"], operation_type="CAPTURE") == []

    assert stack.run("capture", {"operationId": auth, "amount": 2000, "currency": "EUR"}).state is FlowState.SUCCEEDED
    twice = stack.run("capture", {"operationId": auth, "amount": 2000, "currency": "EUR"})
    assert_gateway_error(twice, "PS0023")

    voided = _authorized(stack, 1000)
    assert_operation(stack.run("refund", {"operationId": voided}), "VOIDED")
    assert_gateway_error(stack.run("capture", {"operationId": voided}), "PS0022")
    assert_gateway_error(stack.run("capture", {"operationId": "no-such-operation"}), None, status=404)
    assert len(stack.simulator.admin.operations(order_id=authorization["orderId"], operation_type="CAPTURE")) == 1


def test_cancel_capture_refused(stack: Stack) -> None:
    auth = _authorized(stack, 2000)
    not_a_capture = stack.run("cancel_capture", {"operationId": auth})
    error = assert_gateway_error(not_a_capture, "PS0026")
    assert "only an executed capture" in error["errors"][0]["description"]

    sale = _sale(stack, 3000)
    assert stack.run("refund", {"operationId": sale, "amount": 500, "currency": "EUR"}).state is FlowState.SUCCEEDED
    assert_gateway_error(stack.run("cancel_capture", {"operationId": sale}), "PS0027")

    captured = stack.run("capture", {"operationId": _authorized(stack, 1200)})
    capture_op = str(assert_operation(captured, "EXECUTED")["operationId"])
    assert stack.run("cancel_capture", {"operationId": capture_op}).state is FlowState.SUCCEEDED
    assert_gateway_error(stack.run("cancel_capture", {"operationId": capture_op}), "PS0026")
    assert_gateway_error(stack.run("cancel_capture", {"operationId": "no-such-operation"}), None, status=404)


def test_cancel_capture_refused_on_a_later_day(live: Live) -> None:
    """A capture may be cancelled only on the day it was made, by the gateway's clock: PS0002."""
    captured = live.stack.run("capture", {"operationId": _authorized(live.stack, 1800)})
    capture_op = str(assert_operation(captured, "EXECUTED")["operationId"])
    live.sim.admin.advance_clock(timedelta(days=1).total_seconds())
    refused = live.stack.run("cancel_capture", {"operationId": capture_op})
    assert_gateway_error(refused, "PS0002")
    assert gateway_operation(live.sim, capture_op)["operationResult"] == "EXECUTED", "the capture stands"


def test_refund_refused(stack: Stack) -> None:
    sale = _sale(stack, 3000)
    assert stack.run("refund", {"operationId": sale}).state is FlowState.SUCCEEDED, "refund everything"
    nothing_left = stack.run("refund", {"operationId": sale, "amount": 100, "currency": "EUR"})
    assert_gateway_error(nothing_left, "PS0027")

    auth = _authorized(stack, 1000)
    assert_operation(stack.run("refund", {"operationId": auth}), "VOIDED")
    assert_gateway_error(stack.run("refund", {"operationId": auth}), "PS0028")
    assert_gateway_error(stack.run("refund", {"operationId": "no-such-operation"}), None, status=404)


def test_deactivate_an_unknown_contract(stack: Stack) -> None:
    refused = stack.run("deactivate_contract", {"contractId": "ct-no-such-contract"})
    error = assert_gateway_error(refused, "PS0017")
    assert "ct-no-such-contract" in error["errors"][0]["description"]
