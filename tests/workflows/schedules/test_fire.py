"""The fire in one script (issue 42): on a single server a schedule's change, its flows' creates and the
mark of those created are one ``schedules/lua/fire.lua`` call, the create being ``create_flow.lua``'s (the
one home ``create.lua`` runs too). What the three scripts guaranteed apart still holds: one flow per
occurrence, at most one when the fire is sent again or its answer lost, and a start whose gateway order id
another flow holds refused with nothing of it written."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from durapay.workflows.engine.scripts import RESEND_SAFE
from durapay.workflows.schedules.model import open_json
from durapay.workflows.schedules.store import ScheduleStore
from tests.workflows.schedules.test_schedules import World, make_world, monthly, rome


@pytest.fixture
def world(redis_client: redis.Redis, key_prefix: str) -> World:
    return make_world(redis_client, key_prefix)


def snapshot(client: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key of the test's prefix with its value (hashes, lists, sorted sets, streams' lengths)."""
    found: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        kind = client.type(key)
        if kind == b"hash":
            found[key] = client.hgetall(key)
        elif kind == b"list":
            found[key] = client.lrange(key, 0, -1)
        elif kind == b"zset":
            found[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            found[key] = client.xlen(key)
        else:
            found[key] = client.get(key)
    return found


def test_on_a_single_server_the_fire_is_one_script_per_schedule_with_the_flow_marked_created(world: World) -> None:
    assert world.schedules.store.fires_in_one
    record = world.schedules.create(monthly())
    world.at(rome(1))
    assert world.schedules.tick() == 1
    (flow,) = world.flows()
    fired = world.schedules.get(record.id)
    (attempt,) = fired.open
    assert attempt.flow_id == flow.id and attempt.started and attempt.created
    assert fired.version == record.version + 2  # the change and the mark, as the two scripts wrote them
    raw = world.engine.redis.hget(world.schedules.store.keys.record(record.id), "open")
    assert raw == open_json(fired.open).encode()  # joined by fire.lua from its items: as open_json writes it
    assert world.engine.orders.flow_for(flow.order_id) == flow.id
    assert [event["event"] for event in world.schedules.history(record.id)] == ["created", "fired"]


def test_the_fire_sent_again_after_a_lost_answer_writes_nothing(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run of the same call (as a resend after a lost answer would be) finds the schedule's
    version moved: it answers 'refused' and writes nothing, no second flow, no mark, no event. So it is
    classified not resend-safe (its answer differs), and the scheduler's next look is what recovers."""
    assert RESEND_SAFE["schedules/lua/fire.lua"][0] is False
    sent: list[tuple[Any, float]] = []
    real = ScheduleStore.fire_many

    def recording(store: ScheduleStore, fires: Any, now: float) -> Any:
        sent.append((fires, now))
        return real(store, fires, now)

    monkeypatch.setattr(ScheduleStore, "fire_many", recording)
    record = world.schedules.create(monthly())
    world.at(rome(1))
    assert world.schedules.tick() == 1
    before = snapshot(world.engine.redis, world.engine.keys.prefix)
    ((fires, now),) = sent
    assert real(world.schedules.store, fires, now) == [None]
    assert snapshot(world.engine.redis, world.engine.keys.prefix) == before
    assert len(world.flows()) == 1 and world.schedules.get(record.id).open[0].created


def test_a_fire_whose_answer_was_lost_starts_the_occurrence_once(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script ran, its answer did not come back (the connection dropped): the scheduler retries at its
    next look and finds the flow there; one flow, one charge."""
    real = ScheduleStore.fire_many
    lost = [True]

    def losing(store: ScheduleStore, fires: Any, now: float) -> Any:
        answer = real(store, fires, now)
        if lost and any(creates for *_, creates in fires):
            lost.pop()
            raise redis.ConnectionError("the answer was lost")
        return answer

    monkeypatch.setattr(ScheduleStore, "fire_many", losing)
    record = world.schedules.create(monthly())
    world.at(rome(1))
    assert world.schedules.tick() == 0 and not lost  # the start was reported failed
    assert len(world.flows()) == 1
    for _ in range(3):
        world.clock.advance(60)
        world.tick()
    assert len(world.flows()) == 1 and len(world.mit.calls) == 1
    assert world.schedules.get(record.id).counts["charged"] == 1


def test_an_order_id_another_flow_holds_refuses_the_start_inside_the_fire_with_nothing_written(world: World) -> None:
    """The occurrence's gateway order id is another flow's (its order lookup names that flow): the fire's
    create is refused as ``create.lua`` refuses it, nothing of the flow written; the schedule's change
    stands (the occurrence is recorded), its attempt is not marked created."""
    record = world.schedules.create(monthly())
    order_id = f"{record.id}00000"  # the first occurrence's (test_schedules: orderId of occurrence 0)
    lookup = world.engine.keys.order(order_id)
    world.engine.redis.hset(lookup, "flow", "f-another-flow")
    world.at(rome(1))
    assert world.schedules.tick() == 0
    assert world.flows() == []
    fired = world.schedules.get(record.id)
    (attempt,) = fired.open
    assert attempt.started and not attempt.created
    assert world.engine.store.get(attempt.flow_id) is None
    assert not world.engine.redis.exists(world.engine.keys.log(attempt.flow_id))
    assert world.engine.redis.hgetall(lookup) == {b"flow": b"f-another-flow"}
    assert world.schedules.store.history(record.id)[-1]["event"] == "fired"


def test_a_change_refused_creates_nothing(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer moved the schedule between the scheduler's read and its fire (an operator's pause):
    the fire's compare-and-set refuses, and no flow is created for the change that did not happen."""
    record = world.schedules.create(monthly())
    world.at(rome(1))
    real = ScheduleStore.fire_many

    def paused_meanwhile(store: ScheduleStore, fires: Any, now: float) -> Any:
        world.schedules.pause(record.id)
        return real(store, fires, now)

    monkeypatch.setattr(ScheduleStore, "fire_many", paused_meanwhile)
    assert world.schedules.tick() == 0
    assert world.flows() == []
    assert world.schedules.get(record.id).open == []
