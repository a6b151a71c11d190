"""Review of 05811a6 (``protocol._wait_since``): a wait the previous release wrote with no ``since``, on a
flow never restarted (generation 0), counted from the flow's creation, "within the seconds of its first
steps". A flow started to run later (``run_at``) made its link a day after its creation: across the
upgrade its ``waitSeconds`` (600) was taken as long past and the guest's link closed at its first read,
five minutes after it was made. Now such a wait counts from the log's entry into the step. Real flow,
simulator over HTTP, real Valkey."""

from __future__ import annotations

import json

import pytest

from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.session_engine import engine, step_until
from tests.workflows.flows.test_reservations_retry import advance, reservation_input
from tests.workflows.flows.test_reservations_retry import link_of as reservation_link
from tests.workflows.flows.test_wait_clock import DAY, Parts
from tests.workflows.flows.test_waits import link_status

__all__ = ["engine"]


@pytest.mark.parametrize("legacy", [False, True], ids=["since-kept", "previous-release-wait"])
def test_a_delayed_start_waiting_across_the_upgrade_keeps_its_link_open(engine: Parts, legacy: bool) -> None:
    flows, sim = engine
    started = flows.start("reservation", reservation_input(f"res-delayed-{legacy}"), run_at=flows.clock.now() + DAY)
    assert started.state is FlowState.SLEEPING and started.generation == 0
    advance(flows, sim, DAY + 1)  # it runs the next day: its link is made then
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    assert waiting.generation == 0
    link_id = reservation_link(waiting)
    key = flows.store.keys.flow(started.id)
    wait = json.loads(flows.redis.hget(key, "wait"))
    if legacy:
        wait.pop("since")  # as the previous release wrote it
    flows.redis.hset(key, "wait", json.dumps(wait, separators=(",", ":"), sort_keys=True))
    advance(flows, sim, waiting.due - flows.clock.now() + 0.001)  # its first read, five minutes on
    flows.run_step(started.id, "payment")
    assert link_status(flows, link_id) == "ACTIVE", (
        f"the link, made {flows.clock.now() - (waiting.due - 300):.0f}s ago with waitSeconds 600, was closed: "
        f"{flows.get(started.id).summary()}"
    )
