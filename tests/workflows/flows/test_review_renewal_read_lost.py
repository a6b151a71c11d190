"""Review 2: a renewal through durapay (``paybylink_renew``) whose follow-up read of the link fails once
(fixed: the read is retried with the step, ``sessions._link_changed``).

``sessions._link_changed`` reads ``GET /orders/paybylink/{linkId}`` after the renewal only to learn the
link's order (the renewal's answer does not carry it); on any GatewayError it returns the answer alone,
"the holder sees it at its deadline read". ``Engine.tell_holder`` then finds no ``orderId`` and returns:
a holder that already ended (its link expired unpaid) is neither kept nor given the renewal's token, so a
payment on the renewed link after the holder's retention shows in no flow (invariants 1 and 2).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld
from tests.workflows.flows.test_link_renewals import pay_late_and_look, run_all
from tests.workflows.model_kinds import now_of


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=962)
    yield built
    built.close()


@pytest.mark.parametrize("read_fails", [False, True], ids=["control", "read-503"])
def test_a_renewal_whose_link_read_fails_still_keeps_the_ended_holder(world: FlowWorld, read_fails: bool) -> None:
    flow = world.start("paybylink", "decline")  # a link for one day
    run_all(world)
    waiting = world.record(flow)
    assert waiting is not None
    link_id = str(waiting.outputs["create"]["paymentLink"]["linkId"])
    for _ in range(4):
        world.advance(86400)  # the link expires unpaid; the flow's read finds it EXPIRED and it ends
        world.settle()
    ended = world.record(flow)
    assert ended is not None and ended.finished, world.describe(flow)
    # one 503 on the read the renewal makes after its (successful) call
    if read_fails:
        world.sim.admin.set_faults(mode="error", status=503, operation="get_paybylink", count=1)
    day = now_of(world.clock.now() + 60 * 86400).strftime("%Y-%m-%d")
    renewal = world.engine.start("paybylink_renew", {"linkId": link_id, "expirationDate": day})
    world.engine.run_step(renewal.id, "renew")
    for _ in range(10):  # a failed read is retried with the step (the renewal sent again sets the same date)
        renewed = world.engine.store.get(renewal.id)
        if renewed is not None and renewed.finished:
            break
        world.advance(30)
        world.settle()
    renewed = world.engine.store.get(renewal.id)
    assert renewed is not None and renewed.state.value == "succeeded", renewed and renewed.summary()
    world.sim.admin.clear_faults()
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(link.status) == "ACTIVE" and link.expirationDate == day, link  # payable for 60 more days
    pay_late_and_look(world, flow, link_id, day)
