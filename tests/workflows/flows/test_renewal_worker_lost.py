"""A renewal's worker lost after the gateway renewed the link and before the flow holding it was told.

``Engine.tell_holder`` keeps a holder that ended (its link expired unpaid) while the renewed link can be
paid, so that a payment there shows in it (money invariants 1 and 2). Telling it after the renewal's
completion was written left a window: a worker lost between the two ends the renewal ``succeeded`` with
nobody told, and the holder expires with its link payable. The holder is told before the completion is
written (``Protocol._complete``): a worker lost there leaves the step to its reclaim, which renews again
(the same date) and tells; a tell that fails (the store refused its write) is retried with the step. The
loss is a process death at one line, which no real fault places there: the only mock here, raised once
where the worker would die (an exception no handler catches) or where the store's write failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld
from tests.workflows.flows.test_link_renewals import pay_late_and_look, run_all
from tests.workflows.model_kinds import now_of


class WorkerLost(BaseException):
    """The process running the renewal ends here: no ``except Exception`` sees it."""


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=963)
    yield built
    built.close()


@pytest.mark.parametrize("fault", [WorkerLost, redis.ConnectionError], ids=["worker-lost", "store-write-failed"])
def test_a_renewal_whose_holder_could_not_be_told_at_once_still_keeps_it(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch, fault: type[BaseException]
) -> None:
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

    told = world.engine.tell_holder
    lost: list[str] = []

    def dies_once(name: str, output: Any) -> None:
        if not lost:
            lost.append(str(output.get("orderId")))
            raise fault("lost here")
        told(name, output)

    monkeypatch.setattr(world.engine, "tell_holder", dies_once)
    day = now_of(world.clock.now() + 60 * 86400).strftime("%Y-%m-%d")
    renewal = world.engine.start("paybylink_renew", {"linkId": link_id, "expirationDate": day})
    if fault is WorkerLost:
        with pytest.raises(WorkerLost):
            world.engine.run_step(renewal.id, "renew", worker="w-lost")
    else:
        assert world.engine.run_step(renewal.id, "renew", worker="w-1") == "retrying"
    assert lost, "the renewal never came to tell its holder"
    for _ in range(20):  # the lease ends (or the retry is due); the dispatcher sends the step again
        renewed = world.engine.store.get(renewal.id)
        if renewed is not None and renewed.finished:
            break
        world.advance(60)
        world.settle()
    renewed = world.engine.store.get(renewal.id)
    assert renewed is not None and renewed.state.value == "succeeded", renewed and renewed.summary()
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(link.status) == "ACTIVE" and link.expirationDate == day, link
    pay_late_and_look(world, flow, link_id, day, told=lost)
