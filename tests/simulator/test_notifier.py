"""Notifications reach a real HTTP receiver: retried until it answers 2xx, at least once, faults on demand."""

from __future__ import annotations

import time
from typing import Any

import pytest

from durapay.gateway import Catalogue, GatewayClient, InvalidSecurityToken, parse_notification, verify_security_token
from durapay.simulator import SimulatorServer
from tests.simulator.support import DECLINE, Receiver, order, session
from tests.waiting import wait_until


def _hpp(client: GatewayClient, receiver: Receiver, order_id: str = "n-1") -> str:
    request = {"order": order(order_id), "paymentSession": session(notificationUrl=receiver.url)}
    return client.call(Catalogue.create_hpp_order, request=request).securityToken


def _when_two(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bodies once there are exactly two, else nothing (a probe for wait_until)."""
    return bodies if len(bodies) == 2 else []


def _delivered(sim: SimulatorServer, count: int = 1) -> list[dict[str, Any]]:
    return sim.admin.wait_for_notifications(lambda log: sum(1 for d in log if d["state"] in ("delivered", "failed")) >= count)


def test_a_payment_outcome_is_posted_with_the_orders_security_token(
    client: GatewayClient, sim: SimulatorServer, receiver: Receiver
) -> None:
    token = _hpp(client, receiver)
    completed = sim.admin.complete_hpp("n-1")
    [body] = wait_until(receiver.bodies, what="the notification")
    notification = parse_notification(body)
    verify_security_token(notification, [token])
    assert notification.operation is not None
    assert (notification.order_id, notification.operation.operationId) == ("n-1", completed["operationId"])
    assert notification.operation.operationResult == "EXECUTED"
    assert notification.eventId and notification.eventTime
    [delivery] = _delivered(sim)
    assert delivery["state"] == "delivered" and [a["status"] for a in delivery["attempts"]] == [200]


def test_declines_and_customer_cancels_are_notified_too(client: GatewayClient, sim: SimulatorServer, receiver: Receiver) -> None:
    _hpp(client, receiver, "n-1")
    _hpp(client, receiver, "n-2")
    sim.admin.complete_hpp("n-1", pan=DECLINE)
    sim.admin.complete_hpp("n-2", cancel=True)
    bodies = wait_until(lambda: _when_two(receiver.bodies()), what="two notifications")
    results = {
        b["operation"]["orderId"]: (b["operation"]["operationResult"], b["operation"]["additionalData"].get("responseCode"))
        for b in bodies
    }
    assert results == {"n-1": ("DECLINED", "100"), "n-2": ("CANCELED", None)}


def test_delivery_is_retried_with_backoff_until_the_receiver_answers(
    client: GatewayClient, sim: SimulatorServer, receiver: Receiver
) -> None:
    receiver.fail_next = 3
    _hpp(client, receiver)
    sim.admin.complete_hpp("n-1")
    wait_until(receiver.bodies, what="the notification after retries")
    [delivery] = _delivered(sim)
    assert [a["status"] for a in delivery["attempts"]] == [503, 503, 503, 200]
    assert delivery["state"] == "delivered" and receiver.attempts == 4


def test_delivery_gives_up_after_the_attempt_limit(client: GatewayClient, sim: SimulatorServer, receiver: Receiver) -> None:
    receiver.fail_next = 1000
    _hpp(client, receiver)
    sim.admin.complete_hpp("n-1")
    [delivery] = _delivered(sim)
    assert delivery["state"] == "failed"
    assert len(delivery["attempts"]) == sim.config.notify_max_attempts
    assert receiver.bodies() == []


def test_duplicate_fault_delivers_the_same_event_twice(client: GatewayClient, sim: SimulatorServer, receiver: Receiver) -> None:
    sim.admin.set_faults(mode="notify_duplicate", count=1)
    _hpp(client, receiver)
    sim.admin.complete_hpp("n-1")
    first, second = wait_until(lambda: _when_two(receiver.bodies()), what="the duplicate")
    assert first == second
    [delivery] = sim.admin.notifications()
    assert delivery["duplicate"] and delivery["deliveries"] == 2


def test_drop_fault_never_delivers_and_says_so(client: GatewayClient, sim: SimulatorServer, receiver: Receiver) -> None:
    sim.admin.set_faults(mode="notify_drop", count=1)
    _hpp(client, receiver, "n-1")
    _hpp(client, receiver, "n-2")
    sim.admin.complete_hpp("n-1")
    sim.admin.complete_hpp("n-2")
    [body] = wait_until(receiver.bodies, what="the second notification")
    assert body["operation"]["orderId"] == "n-2"
    dropped = sim.admin.notifications(order_id="n-1")
    assert [(d["state"], d["attempts"]) for d in dropped] == [("dropped", [])]


def test_delay_fault_delivers_late(client: GatewayClient, sim: SimulatorServer, receiver: Receiver) -> None:
    sim.admin.set_faults(mode="notify_delay", delay_ms=400)
    _hpp(client, receiver)
    started = time.monotonic()
    sim.admin.complete_hpp("n-1")
    wait_until(receiver.bodies, what="the delayed notification")
    assert time.monotonic() - started >= 0.4


def test_wrong_token_fault_is_caught_by_the_token_check(client: GatewayClient, sim: SimulatorServer, receiver: Receiver) -> None:
    sim.admin.set_faults(mode="notify_wrong_token")
    token = _hpp(client, receiver)
    sim.admin.complete_hpp("n-1")
    [body] = wait_until(receiver.bodies, what="the notification")
    with pytest.raises(InvalidSecurityToken):
        verify_security_token(parse_notification(body), [token])


def test_link_expiry_is_notified(client: GatewayClient, sim: SimulatorServer, receiver: Receiver) -> None:
    expiry = sim.admin.now().date().isoformat()
    request = {"order": order("n-link"), "paymentSession": session(notificationUrl=receiver.url), "expirationDate": expiry}
    link = client.call(Catalogue.create_paybylink, request=request)
    sim.admin.advance_clock(86_400)
    [body] = wait_until(receiver.bodies, what="the expiry notification")
    assert body["securityToken"] == link.securityToken
    assert (body["operation"]["operationResult"], body["operation"]["paymentLinkId"]) == ("EXPIRED", link.paymentLink.linkId)
