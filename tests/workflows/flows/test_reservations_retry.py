"""A reservation whose guest was declined, retried by an operator as the runbook says, then paid on its
new link (issue 23, items 3 and 11).

The real flow runs step by step on a manual clock against the simulator over HTTP (``session_engine``);
the gateway's notification is handed to the real receiver, as the gateway would post it.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from durapay.gateway import Catalogue, PayByLinkRenewRequest
from durapay.service.receiver import NotificationReceiver
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine, OperatorError
from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.session_engine import engine, step_until

__all__ = ["engine"]

ENDED = {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION}
DECLINE = "4349940199997007"  # the simulator's published VISA declined 100 (soft)


def advance(flows: Engine, sim: SimulatorServer, seconds: float) -> None:
    """Move both clocks: the engine's (deadlines) and the simulator's (expiries)."""
    flows.clock.advance(seconds)  # type: ignore[attr-defined]
    sim.admin.advance_clock(seconds)


def reservation_input(reservation_id: str) -> dict[str, Any]:
    reservation = {
        "reservationId": reservation_id,
        "amount": "20000",
        "currency": "EUR",
        "deposit": "5000",
        "reservationType": "PREPAID_REFUNDABLE",
    }
    return {"reservation": reservation, "waitSeconds": 600}


def link_of(record: Any) -> str:
    return str(record.outputs["link"]["paymentLink"]["linkId"])


def declined_then_retried(flows: Engine, sim: SimulatorServer, reservation_id: str) -> tuple[str, dict[str, str]]:
    """The guest's card is declined on the first link and the flow fails at its deadline; the operator
    retries it and the guest pays the new link. The flow id and the payment."""
    started = flows.start("reservation", reservation_input(reservation_id))
    first = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.complete_link(link_of(first), pan=DECLINE)
    advance(flows, sim, 601)
    failed = step_until(flows, started.id, ENDED)
    assert failed.state is FlowState.FAILED and failed.error is not None, failed.summary()
    assert failed.error["type"] == "PaymentDeclined", failed.error
    flows.retry(started.id)
    second = step_until(flows, started.id, {FlowState.WAITING})
    assert link_of(second) != link_of(first)
    return started.id, sim.admin.complete_link(link_of(second))


def test_a_retried_reservation_paid_on_its_new_link_succeeds_at_its_deadline_without_the_notification(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    """Item 3, refuted on this main: the deadline read is ``judge_wait`` (workflows/flows/waits.py), which
    looks for a successful payment among all the reservation's operations before a failed one (since
    bd43a29); the reservation's own copy that took the first final operation is gone."""
    flows, sim = engine
    flow_id, paid = declined_then_retried(flows, sim, "res-declined")  # its notification is lost
    advance(flows, sim, 601)
    done = step_until(flows, flow_id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]
    assert done.outputs["payment"]["readAtDeadline"] is True


def test_a_retried_reservation_s_notification_is_verified_and_ends_its_wait(engine: tuple[Engine, SimulatorServer]) -> None:
    """Item 11: the retry gave the flow the order id ``<reservationId>-2`` and kept the new link's token
    under it, while the gateway's order and notifications keep the reservation's id: the receiver answered
    401 and the flow waited on. A reservation's gateway order is its id for good. Passes once
    ``Engine.retry`` keeps that order id (report: workflows/engine/api.py)."""
    flows, sim = engine
    flow_id, paid = declined_then_retried(flows, sim, "res-retried")
    record = flows.get(flow_id)
    assert record.order_id == "res-retried", "the gateway's order is the reservation's, whatever the retry"
    (note,) = [n for n in sim.admin.notifications() if n["body"]["operation"]["operationId"] == paid["operationId"]]
    receiver = NotificationReceiver(flows, flows.settings.receiver)
    assert receiver.receive(json.dumps(note["body"]).encode()).status == 200, "verified, not refused (401)"
    done = step_until(flows, flow_id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]
    assert "readAtDeadline" not in done.outputs["payment"], "ended by the notification, not at the deadline"


def test_a_refund_of_one_payment_is_never_taken_for_anothers_on_the_same_order(engine: tuple[Engine, SimulatorServer]) -> None:
    """A review of refund-late-payment's "already given back" close: a reservation keeps its order id on a
    retry, so its order may hold two payments (the second link's P, then the first link renewed and paid:
    Q); a partial refund of P was taken as Q's, and Q closed as given back while the merchant held it. A
    refund that names no payment counts for one only on an order of one payment (``undone_by``)."""
    flows, sim = engine
    started = flows.start("reservation", reservation_input("r2same"))
    first = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.complete_link(link_of(first), pan=DECLINE)
    advance(flows, sim, 601)
    step_until(flows, started.id, ENDED)
    flows.retry(started.id)
    second = step_until(flows, started.id, {FlowState.WAITING})
    p = sim.admin.complete_link(link_of(second))
    receiver = NotificationReceiver(flows, flows.settings.receiver)
    seen = set()

    def deliver() -> None:
        for note in sim.admin.notifications():
            if note["body"]["eventId"] not in seen:
                seen.add(note["body"]["eventId"])
                receiver.receive(json.dumps(note["body"]).encode())

    deliver()
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    # the first link is renewed at the gateway and the guest pays it too: a second payment Q on the same order
    day = datetime.fromtimestamp(flows.clock.now() + 5 * 86400, UTC).strftime("%Y-%m-%d")
    flows.gateway().call(Catalogue.renew_paybylink, link_of(first), request=PayByLinkRenewRequest(expirationDate=day).wire())
    q = sim.admin.complete_link(link_of(first))
    deliver()
    late = step_until(flows, started.id, ENDED)
    assert late.state is FlowState.NEEDS_ATTENTION, late.summary()
    # the merchant refunds 100 of the first payment P (a plain refund flow)
    refund = flows.start("refund", {"operationId": p["operationId"], "amount": "100", "currency": "EUR"}, "r2same-refund")
    assert step_until(flows, refund.id, ENDED).state is FlowState.SUCCEEDED
    with contextlib.suppress(OperatorError):  # a keep may be refused while the gateway leaves it in doubt
        flows.keep_late_payment(started.id)
    closed = flows.refund_late_payment(started.id)
    qop = flows.gateway().call(Catalogue.get_operation, q["operationId"]).wire()
    assert "undone" not in json.dumps(closed.outcome), (
        f"payment {q['operationId']} ({qop['operationResult']}, nothing refunded of it) closed as given back at the "
        f"gateway because a refund of {p['operationId']} is on the same order: {closed.outcome}"
    )
