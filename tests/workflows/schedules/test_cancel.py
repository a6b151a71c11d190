"""A schedule cancelled while its occurrence's charge has not been sent still charges afterwards.

Invariant 7 (a check holds when the money moves): the scheduler fires an occurrence only while its schedule
is active, and starts its ``mit`` flow; the flow's charge is sent later (a worker's queue, a 429's backoff,
the gateway gate's deferral during an outage: minutes to hours). ``Schedules.cancel`` (``policy.cancel``)
keeps every started attempt "in flight" and lets it "run to its end", whether or not its call was sent: the
schedule's state, checked before the wait, is not checked again in the step that calls the gateway, and
nothing cancels the flow that has sent nothing (``Engine.cancel`` would end it at once, no money in flight).

``policy.cancel``'s docstring chooses this ("charges already in flight run to their end"); the review contests
"in flight" for a charge whose call was never sent: the person's cancel is not what holds when the money moves.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from durapay.workflows.engine.states import FlowState
from durapay.workflows.schedules import ScheduleState
from tests.workflows.schedules.test_schedules import World, make_world, monthly, rome


@pytest.fixture
def world(redis_client: redis.Redis, key_prefix: str) -> Iterator[World]:
    yield make_world(redis_client, key_prefix)


def test_a_cancelled_schedule_never_charges_an_occurrence_whose_call_was_not_sent(world: World) -> None:
    """Moves: a monthly schedule fires its February occurrence (its ``mit`` flow is started, ready, nothing
    sent yet: no worker has taken it); the merchant cancels the schedule (the customer ended the
    subscription); then a worker runs the flow.

    What goes wrong: the flow charges the customer after the cancel (``schedule.charged`` for a cancelled
    schedule), though its call had not been sent when the cancel was confirmed and the flow could have been
    cancelled with nothing at the gateway."""
    created = world.schedules.create(monthly())
    world.at(rome(2, 1))
    assert world.schedules.tick() == 1
    (flow,) = world.flows()
    assert flow.state is FlowState.READY and not world.mit.calls, "started; nothing sent to the gateway yet"
    cancelled = world.schedules.cancel(created.id, "the customer ended the subscription")
    assert cancelled.state is ScheduleState.CANCELLED
    world.engine.run_step(flow.id, "pay")  # the worker takes the flow's message after the cancel
    world.schedules.tick()
    after = world.engine.get(flow.id)
    assert not world.mit.calls, (
        f"schedule {created.id} was cancelled before its February charge was sent, and the charge was sent "
        f"afterwards: {world.mit.calls}; the flow {after.id} is {after.state.value}, the schedule counts "
        f"{world.schedules.get(created.id).counts}"
    )
