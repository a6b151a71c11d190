"""Pay-by-link renewals through durapay (``paybylink_renew``, workflows/flows/sessions.py) that race the
flow holding the link: the holder ends as its step's read said, and must still show a payment made on the
renewed link however late (invariants 1 and 2; docs/durability.md, "Waiting flows").

From an adversarial review (its tests, assertions kept): each interleaving below left a payment on a link
renewed through durapay in no flow.

1. ``Engine.tell_holder`` read the holder going (its deadline read in flight) and only signalled it; the
   holder's step completed ``failed`` before the signal was written, and the signal met a finished flow
   (``finished``, dropped): nothing moved its ``keep_until``. The signal's answer decides now.
2. A cancel's step (close, then read: EXPIRED) completed ``cancelled`` although a ``link_changed`` told
   while it read was stored on the flow: a cancel's completion did not look (a failing wait's did). Now
   transition.lua turns any such end into another run of the step.
3. A link adopted after its create's answer was lost has no security token; the flow ended, the merchant
   renewed the link through durapay, the flow was kept, and the customer's payment's notifications were
   refused (401: no token kept for the order), so the payment showed in no flow. The renewal's answer
   carries the link's token: ``Engine.tell_holder`` keeps it for the holder's order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.states import FlowState
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld, ModelFlow
from tests.workflows.model_kinds import APPROVE, now_of


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=961)
    yield built
    built.close()


def run_all(world: FlowWorld) -> None:
    while world.messages.chains:
        world.deliver(0)


def holder(world: FlowWorld, *, ended: bool = True) -> tuple[ModelFlow, str]:
    """A pay-by-link flow for a day and its link id: waiting, or (``ended``) ended with its link expired."""
    flow = world.start("paybylink", "decline")
    run_all(world)
    for _ in range(10):  # a create whose answer was lost is adopted on a retry
        waiting = world.record(flow)
        if waiting is None or waiting.state is not FlowState.RETRYING or waiting.due is None:
            break
        world.advance(waiting.due - world.clock.now() + 0.001)
        world.engine.dispatch_due()
        run_all(world)
    waiting = world.record(flow)
    assert waiting is not None and waiting.state is FlowState.WAITING, world.describe(flow)
    link_id = str(waiting.outputs["create"]["paymentLink"]["linkId"])
    for _ in range(4 if ended else 0):
        world.advance(86400)  # the link expires unpaid; the flow's read finds it EXPIRED and it ends
        world.settle()
    if ended:
        done = world.record(flow)
        assert done is not None and done.finished, world.describe(flow)
    return flow, link_id


def pay_late_and_look(world: FlowWorld, flow: ModelFlow, link_id: str, day: str, told: object = None) -> None:
    """45 days later (past the flow's 30-day retention, the renewed link still open) the customer pays the
    renewed link; the payment must show in the flow that held it (invariant 1)."""
    done = world.record(flow)
    assert done is not None
    ended, kept_for = done.state, done.keep_until - world.clock.now()
    for _ in range(3):
        world.advance(15 * 86400)
    paid = world.sim.admin.complete_link(link_id, pan=APPROVE)
    statuses = [world.notify(note["body"]) for note in world.sim.admin.notifications() if note["orderId"] == flow.base]
    after = world.record(flow)
    shown = after is not None and paid["operationId"] in str({"outcome": after.outcome, "error": after.error})
    assert shown, (
        f"payment {paid['operationId']} on link {link_id} (renewed through durapay until {day}) shows in no flow: the "
        f"flow ended {ended.value} with the link ACTIVE, kept {kept_for / 86400:.1f} more days, and is "
        f"{'gone' if after is None else after.state.value}; the receiver answered {statuses}; told: {told}"
    )


def test_a_renewal_told_while_the_deadline_read_completes_keeps_the_flow_while_its_link_can_be_paid(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moves: a pay-by-link flow for a day waits; the link expires unpaid; at the deadline a worker claims the
    wait step and reads the link (EXPIRED); the merchant renews the link through durapay for 60 days (the
    gateway makes it ACTIVE again); the renewal's worker tells the holder: it reads it (running), and the
    holder's worker completes its read (``failed``) just before the ``link_changed`` signal is written. A
    month and more later (past the 30-day retention) the customer pays the renewed link.

    What goes wrong: the flow ends ``failed`` while its link is ACTIVE at the gateway for 60 more days
    (invariant 2), kept only for its own retention; the payment made on the renewed link after that finds
    no flow (its record, order lookup and token expired): it shows in no flow (invariant 1)."""
    flow = world.start("paybylink", "decline")  # a link for one day
    run_all(world)
    waiting = world.record(flow)
    assert waiting is not None and waiting.state is FlowState.WAITING, world.describe(flow)
    link_id = str(waiting.outputs["create"]["paymentLink"]["linkId"])
    world.advance(2 * 86400)  # past the link's expiry: the gateway expires it; the deadline is due
    world.engine.dispatch_due()
    world.messages.chains.clear()  # the deadline's message: run by the slow worker below instead
    assert world.begin_step(flow) == "held", world.describe(flow)  # read: EXPIRED, completion held

    real_signal = world.engine.signal
    told: list[str] = []

    def holder_completes_first(flow_id: str, name: str, payload: Any, **kwargs: Any) -> str:
        if name == "link_changed" and world.held:
            world.finish_step(0)  # the holder's worker completes between tell_holder's read and its signal
        result = real_signal(flow_id, name, payload, **kwargs)
        told.append(result)
        return result

    monkeypatch.setattr(world.engine, "signal", holder_completes_first)
    day = now_of(world.clock.now() + 60 * 86400).strftime("%Y-%m-%d")
    renewal = world.engine.start("paybylink_renew", {"linkId": link_id, "expirationDate": day})
    world.engine.run_step(renewal.id, "renew")
    monkeypatch.undo()
    renewed = world.engine.store.get(renewal.id)
    assert renewed is not None and renewed.state is FlowState.SUCCEEDED, renewed and renewed.summary()
    assert told, "the renewal told the holder"
    run_all(world)
    world.settle()
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(link.status) == "ACTIVE" and link.expirationDate == day, link  # the customer can pay for 60 days
    pay_late_and_look(world, flow, link_id, day, told)


def test_a_renewal_while_a_cancel_reads_the_link_keeps_the_flow_while_its_link_can_be_paid(world: FlowWorld) -> None:
    """Moves (no injection: a slow worker, as the flow model has): a pay-by-link flow for a day waits; its link
    expires unpaid at the gateway; the merchant cancels the flow (a request: its step closes the link, here
    already EXPIRED, and reads it); a worker claims that step and reads EXPIRED, its completion held; the
    merchant renews the link through durapay for 60 days: ACTIVE again, and the holder, still going, is told
    ``link_changed`` (stored: its step is running); the worker completes ``cancelled``. 45 days later the
    customer pays the renewed link.

    What goes wrong: the cancel's completion does not look at the ``link_changed`` it was told before it was
    written (a failing wait's does: ``Change.awaited``), so the flow ends ``cancelled`` with its link ACTIVE
    for 60 days (invariant 2), kept for its retention only; the payment then shows in no flow (invariant 1)."""
    flow = world.start("paybylink", "decline")  # a link for one day
    run_all(world)
    waiting = world.record(flow)
    assert waiting is not None and waiting.state is FlowState.WAITING, world.describe(flow)
    link_id = str(waiting.outputs["create"]["paymentLink"]["linkId"])
    world.advance(2 * 86400)  # the gateway expired the link; the flow's deadline read has not run yet
    asked = world.engine.cancel(flow.flow_id, "the merchant cancels")
    assert asked.cancel_requested and asked.state is FlowState.READY, asked.summary()
    world.messages.chains.clear()  # the cancel's read: run by the slow worker below
    assert world.begin_step(flow) == "held", world.describe(flow)  # closes (EXPIRED already) and reads: EXPIRED
    day = now_of(world.clock.now() + 60 * 86400).strftime("%Y-%m-%d")
    renewal = world.engine.start("paybylink_renew", {"linkId": link_id, "expirationDate": day})
    world.engine.run_step(renewal.id, "renew")
    renewed = world.engine.store.get(renewal.id)
    assert renewed is not None and renewed.state is FlowState.SUCCEEDED, renewed and renewed.summary()
    world.finish_step(0)
    run_all(world)
    world.settle()
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(link.status) == "ACTIVE" and link.expirationDate == day, link
    pay_late_and_look(world, flow, link_id, day)


def test_an_adopted_link_renewed_after_its_flow_ended_has_its_notifications_verified(world: FlowWorld) -> None:
    """Moves: the answer to a pay-by-link create is lost after the gateway made the link (commit then 500);
    the flow adopts the link, which has no security token (the answer carried it), and reads it until it
    expires unpaid: the flow ends. The merchant renews the link through durapay for 60 days; the holder is
    kept. 45 days later the customer pays the renewed link.

    What went wrong: the receiver had no token for the order (401 to every notification), the finished flow
    reads nothing, so the payment showed in no flow (invariant 1) until a reconciliation found it."""
    world.sim.admin.set_faults(mode="commit_then_fail", operation="create_paybylink_v3", count=1)
    flow, link_id = holder(world)  # the retry after the 500 reads the order: the link is there, adopted
    ended = world.record(flow)
    assert ended is not None and ended.outputs["create"].get("adopted") is True, ended.outputs
    assert world.engine.tokens_for_order(flow.base) == [], "adopted: no token kept"
    day = now_of(world.clock.now() + 60 * 86400).strftime("%Y-%m-%d")
    renewal = world.engine.start("paybylink_renew", {"linkId": link_id, "expirationDate": day})
    world.engine.run_step(renewal.id, "renew")
    renewed = world.engine.store.get(renewal.id)
    assert renewed is not None and renewed.state is FlowState.SUCCEEDED, renewed and renewed.summary()
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(link.status) == "ACTIVE" and link.expirationDate == day, link
    pay_late_and_look(world, flow, link_id, day)
