"""A waiting flow's opening call and its wakes: a lost answer to a call that opens what a customer pays on
(a pay-by-link, a hosted page, a form), and notifications replayed at it.

A review of issues 21 and 22 found: a pay-by-link whose create answer was lost (the gateway made the link
and answered 500) was cancelled at once, with the link ACTIVE at the gateway and no security token kept,
so a payment on it was refused (401) and in no flow. The claim marked only calls that move money as money
in flight; an opening call is one too (``workflows.engine.inflight.money_operation``): a cancel then reads the
gateway back (the create's own read-back finds the link) and the wait that follows closes the link first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from durapay.gateway import Catalogue
from durapay.service.receiver import NotificationReceiver
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.session_engine import engine, link_input, session_engine, step_until

__all__ = ["engine"]

ENDED = {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION}


def test_a_cancel_after_a_lost_link_create_closes_the_link_the_gateway_made(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    sim.admin.set_faults(mode="commit_then_fail", status=500, operation="create_paybylink_v3", count=1)
    started = flows.start("paybylink", link_input("lost-link"))
    flows.run_step(started.id, "create")
    retrying = flows.get(started.id)
    assert retrying.unsettled is not None, "the create may have opened a link: money may move"
    asked = flows.cancel(started.id, "customer changed their mind")
    assert asked.state is not FlowState.CANCELLED and asked.cancel_requested, "read first"
    done = step_until(flows, started.id, ENDED, limit=20)
    order = flows.gateway().call(Catalogue.get_order, done.order_id)
    links = [str(link.status) for link in order.all_links()]
    assert links, "the gateway made the link"
    assert done.state is FlowState.CANCELLED, done.summary()
    assert "ACTIVE" not in links, f"a cancelled flow left its link payable: {links}"


def test_a_lost_link_create_is_read_back_and_its_payment_found(engine: tuple[Engine, SimulatorServer]) -> None:
    """Without the create's answer durapay has no security token for the order (the gateway gives it only
    there): the link's notifications cannot be verified, and the wait's own reads of the order find the
    payment instead (``workflows.flows.waits.read_later``)."""
    flows, sim = engine
    sim.admin.set_faults(mode="commit_then_fail", status=500, operation="create_paybylink_v3", count=1)
    started = flows.start("paybylink", link_input("lost-link-2"))
    waiting = step_until(flows, started.id, {FlowState.WAITING, *ENDED}, limit=20)
    assert waiting.state is FlowState.WAITING, waiting.summary()
    assert waiting.unsettled is not None and waiting.unsettled.get("open"), "the customer may pay on the link"
    order = flows.gateway().call(Catalogue.get_order, waiting.order_id)
    paid = sim.admin.complete_link(order.all_links()[-1].linkId)
    done = step_until(flows, started.id, ENDED, limit=20)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert paid["operationId"] in (done.outcome or {}).get("operationIds", []), done.outcome


@pytest.fixture
def engine10(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    """The engine with ``max_step_runs`` at its minimum (10), so that a few replays would reach it."""
    with session_engine(redis_client, key_prefix, max_step_runs=10) as made:
        yield made


def test_a_notification_replayed_with_fresh_event_ids_never_stops_a_waiting_flow(
    engine10: tuple[Engine, SimulatorServer],
) -> None:
    """The review: twelve receipts of a PENDING payment's notification, each with a new ``eventId`` (the
    security token travels in every notification of the order), woke the waiting flow twelve times; a wait
    never counted its runs afresh, so the flow stopped in ``needs_attention`` (TooManyRuns) and no longer
    followed its customer. A wake that takes a signal is progress, not a loop."""
    flows, sim = engine10
    started = flows.start("paybylink", link_input("replayed"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.pend("page_payment")
    operation = sim.admin.complete_link(str(waiting.outputs["create"]["paymentLink"]["linkId"]))
    assert operation["operationResult"] == "PENDING"
    (note,) = [n for n in sim.admin.notifications() if n["body"]["operation"]["operationId"] == operation["operationId"]]
    receiver = NotificationReceiver(flows, flows.settings.receiver)
    for replay in range(12):
        assert receiver.receive(json.dumps(dict(note["body"], eventId=f"replay-{replay}")).encode()).status == 200
        record = flows.get(started.id)
        if record.state is FlowState.READY:
            flows.run_step(started.id, record.step)
    assert flows.get(started.id).state is FlowState.WAITING, flows.get(started.id).summary()
    sim.admin.settle_pending(operation["operationId"])
    for final in [n for n in sim.admin.notifications() if n["body"]["operation"]["operationId"] == operation["operationId"]][1:]:
        receiver.receive(json.dumps(final["body"]).encode())
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
