"""Review of c0e4a31 (``waits.began``): a wait written by the release before it has no ``since``, and
counted from the flow's creation. For a flow that release restarted (generation > 0), that was the bug
the commit fixes, kept across the upgrade: the reservation's new link was closed at its first read by
the new code. Now such a wait counts from the record's last change (``protocol._wait_since``: late,
never early). Real flow, simulator over HTTP, real Valkey."""

from __future__ import annotations

import json

from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.session_engine import engine, step_until
from tests.workflows.flows.test_reservations_retry import advance
from tests.workflows.flows.test_reservations_retry import link_of as reservation_link
from tests.workflows.flows.test_wait_clock import DAY, Parts, _declined_and_failed
from tests.workflows.flows.test_waits import link_status

__all__ = ["engine"]


def test_a_restarted_flow_waiting_across_the_upgrade_keeps_its_new_link_open(engine: Parts) -> None:
    flows, sim = engine
    flow_id = _declined_and_failed(flows, sim, "res-upgrade")
    advance(flows, sim, DAY)
    flows.retry(flow_id)  # generation 1, its new link made now
    waiting = step_until(flows, flow_id, {FlowState.WAITING})
    link_id = reservation_link(waiting)
    key = flows.store.keys.flow(flow_id)
    wait = json.loads(flows.redis.hget(key, "wait"))
    wait.pop("since")  # as the previous release wrote it
    flows.redis.hset(key, "wait", json.dumps(wait, separators=(",", ":"), sort_keys=True))
    advance(flows, sim, waiting.due - flows.clock.now() + 0.001)  # its first read, five minutes on
    flows.run_step(flow_id, "payment")
    assert link_status(flows, link_id) == "ACTIVE", (
        f"the new link, made {flows.clock.now() - (waiting.due - 300):.0f}s ago with waitSeconds 600, was closed: "
        f"{flows.get(flow_id).summary()}"
    )
