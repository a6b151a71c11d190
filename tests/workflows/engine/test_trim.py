"""Trimming the listing indexes: only the entries of expired records, never stalled, as fast as flows finish.
Trimming the event streams: to their retention by the server's clock, a bounded amount per pass."""

from __future__ import annotations

import json
from typing import Any

from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.trim import IndexTrimmer
from tests.workflows.engine_support import ScriptedStep, flow


def trimmer(engine: Any, batch: int = 1000) -> IndexTrimmer:
    return IndexTrimmer(engine.redis, engine.keys, engine.store.retention_seconds, batch=batch)


def test_trimming_drops_index_entries_only_of_expired_records(make_engine: Any, clock: ManualClock) -> None:
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    gone, kept = engine.start("demo", {"amount": 5}), engine.start("demo", {"amount": 7})
    engine.run_step(gone.id, "pay")
    engine.run_step(kept.id, "pay")
    alive = engine.start("demo", {"amount": 6})  # still ready, whatever its age
    engine.redis.delete(engine.keys.flow(gone.id))  # as if its retention had passed
    clock.advance(engine.store.retention_seconds + 1)  # a moved clock: ``kept`` still has its record
    assert trimmer(engine).run(now=clock.now(), kinds=["demo"]) == 2
    assert {flow_id for _, flow_id in engine.store.ids(kind="demo")} == {alive.id, kept.id}
    assert [flow_id for _, flow_id in engine.store.ids(state=FlowState.SUCCEEDED)] == [kept.id]


def old_entries(engine: Any, live: int, gone: int) -> None:
    """``live`` long-lived flows at the front of partition 0's kind index, then ``gone`` expired ones."""
    index = engine.keys.by_kind(0, "demo")
    pipe = engine.redis.pipeline(transaction=False)
    for n in range(live):
        flow_id = f"live{n}"
        pipe.zadd(index, {flow_id: n})
        pipe.hset(engine.keys.flow(flow_id), "id", flow_id)
    for n in range(gone):
        pipe.zadd(index, {f"gone{n}": live + n})
    pipe.execute()


def test_long_lived_flows_at_the_front_do_not_stall_it(make_engine: Any, clock: ManualClock) -> None:
    """A months-long timer or a flow waiting for a person sits first in its kind index: passes step over
    the live entries instead of reading the same batch of them forever."""
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    old_entries(engine, live=250, gone=600)
    cutter = trimmer(engine, batch=100)
    passes = 0
    while engine.redis.zcard(engine.keys.by_kind(0, "demo")) > 250:
        cutter.run(now=clock.now(), kinds=["demo"])
        passes += 1
        assert passes <= 20, "the trimmer is stuck behind the live entries"
    assert all(member.startswith(b"live") for member in engine.redis.zrange(engine.keys.by_kind(0, "demo"), 0, -1))


def test_a_backlog_is_trimmed_at_every_tick_until_it_is_gone(make_engine: Any, clock: ManualClock) -> None:
    """More flows finished than one pass can drop: the dispatcher passes again at the next tick instead of
    waiting minutes, so the indexes keep pace with any finishing rate."""
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    old_entries(engine, live=0, gone=2500)
    dispatcher = Dispatcher(engine, interval=0.01)
    dispatcher.trimmer.batch = 1000
    ticks = 0
    while engine.redis.zcard(engine.keys.by_kind(0, "demo")):
        dispatcher.tick()
        ticks += 1
        assert ticks <= 4
    assert ticks == 3 and not dispatcher.trimmer.backlog


DAY_MS = 86_400_000


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def write_at(client: Any, key: str, moments: list[int]) -> None:
    """Stream entries with explicit ids (``<ms>-0``): events written at those moments of the server's clock."""
    pipe = client.pipeline(transaction=False)
    for moment in moments:
        pipe.xadd(key, {"e": json.dumps({"type": "flow.created", "time": moment / 1000})}, id=f"{moment}-0")
    pipe.execute()


def stamps(client: Any, key: str) -> list[int]:
    return [int(entry_id.decode().split("-")[0]) for entry_id, _ in client.xrange(key)]


def test_events_are_trimmed_to_their_retention_a_bounded_amount_per_pass(make_engine: Any) -> None:
    """A backlog of old events (streams never trimmed before) goes in passes of at most ``limit`` entries
    per stream, at every tick while some is left (not every ten seconds); what is younger stays."""
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    retention_ms = int(engine.settings.events.retention * 1000)
    now = server_ms(engine.redis)
    key = engine.keys.events(0)
    old = [now - retention_ms - DAY_MS + n for n in range(2500)]
    young = [now - retention_ms + 3_600_000, now - 1000]
    write_at(engine.redis, key, old + young)
    dispatcher = Dispatcher(engine, interval=0.01)
    dispatcher.event_trimmer.limit = 1000
    ticks, left = 0, [len(old) + len(young)]
    while engine.redis.xlen(key) > len(young):
        dispatcher.tick()
        ticks += 1
        left.append(engine.redis.xlen(key))
        assert left[-2] - left[-1] <= 1000, left
        assert ticks <= 5, left
    assert ticks >= 3 and stamps(engine.redis, key) == young
    dispatcher.tick()
    assert not dispatcher.event_trimmer.backlog and stamps(engine.redis, key) == young
