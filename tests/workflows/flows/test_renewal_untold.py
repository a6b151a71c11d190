"""A renewal or modification whose holder was not told at once: its worker lost, or the tell refused.

``Engine.tell_holder`` keeps a holder that ended (its link expired unpaid) while the renewed link can be
paid, so that a payment there shows in it (money invariants 1 and 2). Told after the renewal's completion
and nowhere else, a worker lost between the two ended the renewal ``succeeded`` with nobody told, and the
holder expired with its link payable. The completion now writes the tell it owes, and the packing pass
tells what the worker did not (``workflows.engine.holders``). Two fixes before this one retried the step
instead; blind reviews found what that breaks, each a case here: a cancel in between ended the renewal
untold; a modification resent undid a later one; a renewal resent after the customer paid was refused and
its payment shown nowhere; tells refused past claim.lua's bound stopped the renewal as a lost worker.

The fault is a process death at one line, or a store write refused there, which no real fault places:
the only mock here, raised where the tell is made (``times`` tries). Everything else is a real Valkey and
simulator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import holders
from durapay.workflows.engine.compact import TELL_RETRY_SECONDS
from durapay.workflows.engine.errors import OperatorError
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld
from tests.workflows.flows.test_link_renewals import holder, pay_late_and_look, run_all
from tests.workflows.model_kinds import APPROVE, now_of


class WorkerLost(BaseException):
    """The process running the step ends here: no ``except Exception`` sees it."""


FAULTS = pytest.mark.parametrize("fault", [WorkerLost, redis.ConnectionError], ids=["worker-lost", "store-write-failed"])


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=963)
    yield built
    built.close()


def tell_fails(world: FlowWorld, monkeypatch: pytest.MonkeyPatch, fault: type[BaseException], times: int = 1) -> list[str]:
    """The first ``times`` tells fail with ``fault``; the orders they were for are listed."""
    told = world.engine.tell_holder
    failed: list[str] = []

    def fails(name: str, output: Any) -> None:
        if len(failed) < times:
            failed.append(str(output.get("orderId")))
            raise fault("lost here")
        told(name, output)

    monkeypatch.setattr(world.engine, "tell_holder", fails)
    return failed


def first_try(world: FlowWorld, flow_id: str, step: str, fault: type[BaseException]) -> None:
    """The step's first try: its change made and completed, its tell failed (the worker dies, or the
    store refused the tell's write)."""
    if fault is WorkerLost:
        with pytest.raises(WorkerLost):
            world.engine.run_step(flow_id, step, worker="w-lost")
    else:
        assert world.engine.run_step(flow_id, step, worker="w-1") == "succeeded"


def told(world: FlowWorld, flow_id: str) -> FlowRecord:
    """The flow once it owes no tell: the dispatcher's packing passes tell its holder (one a refused
    tell is tried again at, each)."""
    for _ in range(20):
        record = world.engine.store.get(flow_id)
        assert record is not None
        if holders.FIELD not in record.fields:
            return record
        world.advance(TELL_RETRY_SECONDS)
        with contextlib.suppress(WorkerLost):  # the dispatcher dies at the tell: another runs the next pass
            world.compact()
    raise AssertionError(f"flow {flow_id} still owes its holder a tell: {record.summary()}")


def renew(world: FlowWorld, link_id: str) -> tuple[str, str]:
    """A renewal of the link for 60 days, started: its flow id and the new date."""
    day = now_of(world.clock.now() + 60 * 86400).strftime("%Y-%m-%d")
    return world.engine.start("paybylink_renew", {"linkId": link_id, "expirationDate": day}).id, day


def renewed_until(world: FlowWorld, link_id: str, day: str) -> None:
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(link.status) == "ACTIVE" and link.expirationDate == day, link  # renewed, never undone


@FAULTS
@pytest.mark.parametrize("times", [1, 5], ids=["once", "five-passes"])
def test_a_renewal_whose_holder_was_not_told_at_once_still_keeps_it(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch, fault: type[BaseException], times: int
) -> None:
    flow, link_id = holder(world)
    failed = tell_fails(world, monkeypatch, fault, times)
    renewal, day = renew(world, link_id)
    first_try(world, renewal, "renew", fault)
    ended = world.engine.store.get(renewal)
    assert ended is not None and ended.state is FlowState.SUCCEEDED, ended and ended.summary()
    with pytest.raises(OperatorError):  # a cancel now cannot end it untold: it ended, its change made
        world.engine.cancel(renewal, "the merchant cancels the renewal")
    told(world, renewal)
    renewed_until(world, link_id, day)
    pay_late_and_look(world, flow, link_id, day, told=failed)


def test_a_modification_whose_tell_failed_is_not_sent_again_over_a_later_one(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, link_id = holder(world, ended=False)
    failed = tell_fails(world, monkeypatch, redis.ConnectionError)
    first = world.engine.start("paybylink_modify", {"linkId": link_id, "amount": 2000})
    first_try(world, first.id, "modify", redis.ConnectionError)
    # Meanwhile the merchant corrects the amount through durapay: a second modification, told at once.
    second = world.engine.start("paybylink_modify", {"linkId": link_id, "amount": 3000})
    assert world.engine.run_step(second.id, "modify", worker="w-2") == "succeeded"
    told(world, first.id)
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert link.amount == 3000, f"flow {first.id}'s tell, failed once ({failed}), sent 2000 again"


def test_a_renewed_link_paid_before_the_renewal_told_its_holder_shows_the_payment(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The holder adopted its link (its create's answer lost): the renewal's answer brings its first token.
    world.sim.admin.set_faults(mode="commit_then_fail", operation="create_paybylink_v3", count=1)
    flow, link_id = holder(world)
    held = world.record(flow)
    assert held is not None and held.outputs["create"].get("adopted") is True, world.describe(flow)
    tell_fails(world, monkeypatch, redis.ConnectionError)
    renewal, _ = renew(world, link_id)
    first_try(world, renewal, "renew", redis.ConnectionError)
    paid = world.sim.admin.complete_link(link_id, pan=APPROVE)  # the customer pays the renewed link at once
    statuses = [world.notify(note["body"]) for note in world.sim.admin.notifications() if note["orderId"] == flow.base]
    done = told(world, renewal)
    # the gateway notifies again until answered
    statuses += [world.notify(note["body"]) for note in world.sim.admin.notifications() if note["orderId"] == flow.base]
    after = world.record(flow)
    shown = after is not None and paid["operationId"] in str({"outcome": after.outcome, "error": after.error})
    assert done.state is FlowState.SUCCEEDED and shown, (
        f"payment {paid['operationId']} on link {link_id}, renewed by flow {renewal}, shows in no flow: the holder "
        f"is {after and after.state.value}, the receiver answered {statuses}, the renewal ended {done.summary()}"
    )


def settled(world: FlowWorld, flow_id: str) -> FlowRecord:
    """The flow once ended: each lease runs out, the dispatcher sends the step again (a read, then)."""
    for _ in range(10):
        record = world.engine.store.get(flow_id)
        assert record is not None
        if record.finished:
            return record
        world.advance(120)
        world.engine.dispatch_due()
        run_all(world)
    record = world.engine.store.get(flow_id)
    assert record is not None and record.finished, record and record.summary()
    return record


@pytest.mark.parametrize("lost", ["worker", "answer"])
def test_a_renewal_lost_after_the_gateway_renewed_then_cancelled_reads_the_link_and_keeps_its_holder(
    world: FlowWorld, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    """Blind review 3: the renewal's worker dies after the gateway renewed the link (before its completion,
    so nothing owes a tell yet), or the answer is lost (a 5xx after the commit: no mock); the merchant's
    cancel arrives while the step runs. A renewal was not money in flight, so the cancel was believed
    unread ("nothing moved") and the holder never told. Marked now (``reopens``), its read-back finds the
    link renewed: the renewal ends ``succeeded`` and tells."""
    flow, link_id = holder(world)
    renewal, day = renew(world, link_id)
    if lost == "worker":
        real = world.engine.protocol._complete

        def dies(claim: Any, outcome: Any, *args: Any, **kwargs: Any) -> Any:
            if claim.record.kind == "paybylink_renew":
                raise WorkerLost("SIGKILL after the gateway renewed the link")
            return real(claim, outcome, *args, **kwargs)

        monkeypatch.setattr(world.engine.protocol, "_complete", dies)
        with pytest.raises(WorkerLost):
            world.engine.run_step(renewal, "renew", worker="w-lost")
        monkeypatch.setattr(world.engine.protocol, "_complete", real)
        asked = world.engine.cancel(renewal, "the merchant cancels the renewal")  # running: a request
    else:
        world.sim.admin.set_faults(mode="commit_then_fail", operation="renew_paybylink", count=1)
        claim = world.engine.protocol.claim(renewal, "renew", worker="w-1", money=True)
        assert not isinstance(claim, str), claim
        ran = world.engine.protocol.run(claim)  # the gateway renewed the link; its answer was lost
        asked = world.engine.cancel(renewal, "the merchant cancels the renewal")  # running: a request
        world.engine.protocol.finish(claim, ran)
    assert asked.cancel_requested, asked.summary()
    ended = settled(world, renewal)
    assert ended.state is FlowState.SUCCEEDED, ended.summary()  # the link read back renewed: its change made
    told(world, renewal)
    renewed_until(world, link_id, day)
    pay_late_and_look(world, flow, link_id, day, told=f"renewal {renewal} ended {ended.state.value}")


@pytest.mark.parametrize("made", [True, False], ids=["made", "never-made"])
def test_a_modification_whose_answer_was_lost_is_read_back_by_what_it_asked(world: FlowWorld, made: bool) -> None:
    """A modification's answer lost while a cancel is asked: the link read back shows the amount asked (the
    modification made: ``succeeded``, the holder told) or not (the request never reached the gateway:
    ``cancelled`` once it can no longer arrive), never sent again for the cancel."""
    _, link_id = holder(world, ended=False)
    mode = "commit_then_fail" if made else "error"
    world.sim.admin.set_faults(mode=mode, status=503, operation="modify_paybylink_v3", count=1)
    modification = world.engine.start("paybylink_modify", {"linkId": link_id, "amount": 2000}).id
    claim = world.engine.protocol.claim(modification, "modify", worker="w-1", money=True)
    assert not isinstance(claim, str), claim
    ran = world.engine.protocol.run(claim)
    asked = world.engine.cancel(modification, "the merchant cancels the modification")
    assert asked.cancel_requested, asked.summary()
    world.engine.protocol.finish(claim, ran)
    ended = settled(world, modification)
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    if made:
        assert ended.state is FlowState.SUCCEEDED and link.amount == 2000, (ended.summary(), link)
        assert told(world, modification).outputs["modify"].get("adopted") is True
    else:
        assert ended.state is FlowState.CANCELLED and link.amount != 2000, (ended.summary(), link)


def test_an_undated_renewal_whose_answer_was_lost_then_cancelled_keeps_its_holder(world: FlowWorld) -> None:
    """Blind review 4: a renewal asked with no date (the gateway sets today plus the link's own length), its
    answer lost, then cancelled: the read-back compared only what was asked, nothing, and found it not made;
    the flow ended ``cancelled`` with the link renewed and the holder untold. A renewal with no date asks
    the link payable again, and an ACTIVE link is that. No mock: the simulator commits, then answers 500."""
    flow = world.start("paybylink", "approve")  # a link longer than the retention
    run_all(world)
    waiting = world.record(flow)
    assert waiting is not None and waiting.state is FlowState.WAITING, world.describe(flow)
    link_id = str(waiting.outputs["create"]["paymentLink"]["linkId"])
    for _ in range(90):  # the link expires unpaid; the flow ends
        world.advance(86400)
        world.settle()
        done = world.record(flow)
        if done is not None and done.finished:
            break
    before = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(before.status) == "EXPIRED", before
    renewal = world.engine.start("paybylink_renew", {"linkId": link_id}).id  # no date: the gateway's default
    world.sim.admin.set_faults(mode="commit_then_fail", operation="renew_paybylink", count=1)
    claim = world.engine.protocol.claim(renewal, "renew", worker="w-1", money=True)
    assert not isinstance(claim, str), claim
    ran = world.engine.protocol.run(claim)  # the gateway renewed the link; its answer was lost
    asked = world.engine.cancel(renewal, "the merchant cancels the renewal")
    assert asked.cancel_requested, asked.summary()
    world.engine.protocol.finish(claim, ran)
    ended = settled(world, renewal)
    assert ended.state is FlowState.SUCCEEDED, ended.summary()
    told(world, renewal)
    link = world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink
    assert str(link.status) == "ACTIVE" and link.expirationDate != before.expirationDate, link
    pay_late_and_look(world, flow, link_id, str(link.expirationDate), told=f"renewal {renewal} ended {ended.state.value}")
