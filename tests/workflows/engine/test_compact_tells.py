"""The packing pass's tells owed to holders (``workflows.engine.holders``): bounded in each dispatcher tick,
and never in the way of the partition's other finished flows.

A tell to a going holder is a signal, which waits for durability (``FlowStore.sync``); while the store
cannot confirm it (on a Redis Cluster, the holders' node without its replica under ``sync_replicas``)
every tell is refused. A pass then tells at most ``TELLS_PER_PASS`` flows, moves each refused one behind
its partition's other finished flows for ``TELL_RETRY_SECONDS``, and packs the rest. Counted, never
timed. The stand-in: the refusal itself (``NotDurable``), which one Valkey node cannot produce.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durapay.simulator import SimulatorServer
from durapay.workflows.engine import holders
from durapay.workflows.engine.compact import TELL_RETRY_SECONDS, TELLS_PER_PASS
from durapay.workflows.engine.durability import NotDurable
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld
from tests.workflows.flows.test_link_renewals import holder

OWED = 3 * TELLS_PER_PASS


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=965)
    yield built
    built.close()


class Refusing:
    """The holders' node cannot confirm a write: every tell is refused while ``refusing``; the tries counted."""

    def __init__(self, tell: Any) -> None:
        self.tell, self.refusing, self.tries = tell, True, 0

    def __call__(self, name: str, output: Any) -> None:
        self.tries += 1
        if self.refusing:
            raise NotDurable("the holder's signal: WAIT 1 answered 0 replicas")
        self.tell(name, output)


def test_tells_refused_are_bounded_per_pass_and_let_the_partition_pack(world: FlowWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    _, link_id = holder(world, ended=False)
    refusing = Refusing(world.engine.tell_holder)
    monkeypatch.setattr(world.engine, "tell_holder", refusing)
    owed = [world.engine.start("paybylink_modify", {"linkId": link_id, "description": f"v{n}"}).id for n in range(OWED)]
    for flow_id in owed:
        assert world.engine.run_step(flow_id, "modify", worker="w") == "succeeded"
    assert refusing.tries == OWED  # each worker's own tell, refused: each flow owes it
    keys = world.engine.keys
    partition = keys.partition(owed[0])
    stuck = [flow_id for flow_id in owed if keys.partition(flow_id) == partition]
    other = None
    for n in range(40):  # a flow that owes nothing, finished after them, in the same partition
        started = world.engine.start("paybylink_cancel", {"linkId": f"L-none-{n}"})
        world.engine.cancel(started.id, "not needed")
        if keys.partition(started.id) == partition:
            other = started.id
            break
    assert other is not None
    compactor = world.compactor()
    compactor.batch = len(stuck) + 1

    passes = []
    for _ in range(3 * OWED):
        world.clock.advance(2)
        before = refusing.tries
        compactor.run(now=world.clock.now())
        passes.append(refusing.tries - before)
    assert max(passes) <= TELLS_PER_PASS, passes
    tried_once_each = OWED  # in TELL_RETRY_SECONDS a refused flow is not told again
    assert sum(passes[: int(TELL_RETRY_SECONDS // 2) - 1]) <= tried_once_each + TELLS_PER_PASS, passes
    assert world.engine.redis.hexists(keys.flow(other), "z"), f"flow {other}, owing nothing, was never packed behind {stuck}"

    refusing.refusing = False  # the replica is back: every tell is made, every flow packed
    for _ in range(OWED):
        world.clock.advance(TELL_RETRY_SECONDS)
        compactor.run(now=world.clock.now())
    for flow_id in owed:
        record = world.engine.store.get(flow_id)
        assert record is not None and holders.FIELD not in record.fields, record and record.summary()
        assert world.engine.redis.hexists(keys.flow(flow_id), "z"), flow_id
