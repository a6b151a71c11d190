"""Review (the notification receiver's deliveries, reordered): a waiting page flow told of the merchant's
own capture of its payment before the payment itself.

money.lua keeps a notified payment only when it is the customer's (``gateway.customer_payment``: a
``BACKOFFICE`` capture or refund of the payment, a reservation charge are the merchant's own flows' money),
but the wait's reading of a notification (``workflows.flows.waits.notified``) takes any AUTHORIZED or
EXECUTED operation of the flow's order as the flow's payment. Real Valkey, a Celery worker, the simulator
over HTTP (its notifications dropped: the test posts the capture's, as the gateway would send it, to the
receiver, which reads it back from the simulator)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from durapay.gateway import Catalogue
from durapay.service.receiver import NotificationReceiver
from durapay.workflows.engine.states import FlowState
from tests.workflows.integration.conftest import Stack
from tests.workflows.integration.test_flows import order, session, wait_for_state

pytestmark = pytest.mark.integration


def test_a_capture_notified_before_the_payment_is_not_taken_as_the_links_payment(stack: Stack) -> None:
    engine, sim = stack.engine, stack.simulator
    sim.admin.set_faults(mode="notify_drop")  # the payment's own notification never comes (or comes late)
    expires = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
    explicit = {**session(), "captureType": "EXPLICIT"}
    started = engine.start("paybylink", {"order": order(), "paymentSession": explicit, "expirationDate": expires})
    waiting = wait_for_state(stack, started.id, FlowState.WAITING)
    link = waiting.outputs["create"]["paymentLink"]
    token = waiting.outputs["create"]["securityToken"]
    paid = sim.admin.complete_link(link["linkId"])  # the customer pays: an authorization
    assert paid["operationResult"] == "AUTHORIZED", paid
    # The merchant captures it (seen at the gateway, the customer back on the shop's result page).
    captured = stack.run("capture", {"operationId": paid["operationId"]})
    assert captured.state is FlowState.SUCCEEDED, captured.summary()
    capture_id = str(captured.outcome["operation"]["operationId"])
    capture = engine.gateway().call(Catalogue.get_operation, capture_id).wire()  # as the gateway has it
    assert capture["channel"] == "BACKOFFICE" and capture["operationResult"] == "EXECUTED", capture
    # The gateway notifies the capture on the page's order (its token) before the payment's notification.
    body = {
        "eventId": "evt-capture-first",
        "eventTime": datetime.now(UTC).isoformat(),
        "securityToken": token,
        "operation": capture,
    }
    receiver = NotificationReceiver(engine, stack.runtime.settings.receiver)
    answered = receiver.receive(json.dumps(body).encode())
    assert answered.status == 200, answered
    taken = engine.wait(started.id, 20)
    # Then the payment's own notification comes, late.
    payment = engine.gateway().call(Catalogue.get_operation, paid["operationId"]).wire()
    late = {**body, "eventId": "evt-payment-late", "operation": payment}
    assert receiver.receive(json.dumps(late).encode()).status == 200
    final = engine.get(started.id)
    named = ((taken.outcome or {}).get("operation") or {}).get("operationId")
    # Invariants 3, 4 and 6: the flow's outcome names its own payment, never another flow's operation taken
    # because its result fits (the capture is the capture flow's: its call made it); and the customer's one
    # payment is never reported to a person as a second one (LatePayment), to be kept or refunded.
    assert named == paid["operationId"] and final.state is FlowState.SUCCEEDED, (
        f"the link's flow succeeded naming {named} (the capture is {capture['operationId']}, the payment "
        f"{paid['operationId']}); after the payment's notification it is {final.state} with {final.error}"
    )
