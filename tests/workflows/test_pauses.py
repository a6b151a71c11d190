"""Pause and resume of a flow kind (``workflows.pauses``) on a real Valkey, scripted steps, a manual clock."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.pauses import NotPaused, UnknownKind
from tests.workflows.engine_support import ScriptedStep, flow, wait_step
from tests.workflows.schedules.test_schedules import make_world, monthly, rome


def whats(engine: Any, flow_id: str) -> list[str]:
    return [str(entry.get("what")) for entry in engine.history(flow_id)]


def test_a_paused_kinds_flows_run_no_step_and_finish_after_the_resume(make_engine: Any, clock: ManualClock) -> None:
    first, second = ScriptedStep("first"), ScriptedStep("second")
    engine, sent = make_engine(flow(first, second))
    running = engine.start("demo", {"amount": 5})
    engine.pauses.pause("demo", "gateway maintenance", by="cli:ops")
    waiting = engine.start("demo", {"amount": 6})  # a start during the pause is recorded and waits
    assert engine.run_step(waiting.id, "first") == "paused"
    assert engine.run_step(running.id, "first") == "paused"
    assert first.runs == [], "no step of a paused kind runs"
    for _ in range(3):  # met again and again (worker and dispatcher): logged once
        clock.advance(31)
        engine.dispatch_due()
        assert engine.run_step(running.id, "first") == "paused"
    for flow_id in (running.id, waiting.id):
        record = engine.get(flow_id)
        assert record.state is FlowState.READY, "nothing ends, no state changes"
        held = [what for what in whats(engine, flow_id) if what.startswith("held:")]
        assert held == ["held: flow kind demo paused by cli:ops (gateway maintenance)"]
    sent.chains.clear()
    assert engine.pauses.resume("demo", by="cli:ops") == 2
    assert engine.dispatch_due() == 2, "due at once after the resume"
    for flow_id in (running.id, waiting.id):
        assert engine.run_step(flow_id, "first") == "ready"
        assert engine.run_step(flow_id, "second") == "succeeded"
        assert whats(engine, flow_id).count("released: flow kind demo resumed") == 1
        released = [entry for entry in engine.history(flow_id) if entry.get("what", "").startswith("released:")]
        assert released[0]["by"] == "cli:ops", "the history names who resumed"
    assert [entry["action"] for entry in engine.pauses.log()] == ["resume", "pause"]
    assert engine.pauses.log()[1]["by"] == "cli:ops" and engine.pauses.log()[1]["reason"] == "gateway maintenance"


def test_a_signal_during_the_pause_is_kept_and_read_after_the_resume(make_engine: Any, clock: ManualClock) -> None:
    after = ScriptedStep("after")
    engine, _ = make_engine(flow(wait_step(), after))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "customer") == "waiting"
    engine.pauses.pause("demo", "window", by="api")
    assert engine.signal(record.id, "paid", {"by": "card"}) == "resumed"
    assert engine.run_step(record.id, "customer") == "paused"
    assert engine.get(record.id).signals, "the signal is recorded"
    clock.advance(200)  # past the wait's deadline too: it is read after the resume, not timed out
    engine.dispatch_due()
    assert engine.get(record.id).state is FlowState.READY
    engine.pauses.resume("demo", by="api")
    assert engine.run_step(record.id, "customer") == "ready"
    assert engine.run_step(record.id, "after") == "succeeded"
    assert engine.get(record.id).outputs["customer"] == {"signal": "paid", "by": "card"}


def test_a_pause_or_resume_stopped_half_way_is_completed_by_the_sweep(make_engine: Any, clock: ManualClock) -> None:
    only = ScriptedStep("only")
    engine, _ = make_engine(flow(only))
    record = engine.start("demo", {"amount": 5})
    pause = engine.pauses.pause("demo", "window", by="api")
    for partition in range(engine.keys.partitions):  # a pause that stopped after the truth: no copy yet
        engine.redis.hdel(engine.keys.paused(partition), "demo")
    assert engine.pauses.sweep() == 0
    assert engine.run_step(record.id, "only") == "paused", "the sweep copied the pause to every partition"
    assert engine.pauses.paused() == {"demo": pause}
    engine.redis.hdel(engine.keys.pauses(), "demo")  # a resume that stopped after the truth: copies left
    assert engine.pauses.sweep() == 1, "the dispatcher's sweep copies the truth to every partition and releases"
    assert engine.run_step(record.id, "only") == "succeeded"
    assert whats(engine, record.id).count("released: flow kind demo resumed") == 1


def test_an_unknown_kind_is_refused_naming_the_closest(make_engine: Any) -> None:
    engine, _ = make_engine(flow(ScriptedStep("only")))
    with pytest.raises(UnknownKind, match="did you mean `demo`"):
        engine.pauses.pause("dem", "x", by="api")
    with pytest.raises(NotPaused):
        engine.pauses.resume("demo", by="api")
    first = engine.pauses.pause("demo", "one", by="api")
    assert engine.pauses.pause("demo", "two", by="api") == first, "a pause in force stands"
    assert [entry["action"] for entry in engine.pauses.log()] == ["pause"]


@pytest.mark.parametrize(("policy", "fired", "skipped", "coalesced"), [("each", 2, 0, 0), ("once", 1, 0, 1), ("skip", 0, 2, 0)])
def test_a_schedule_holds_its_occurrences_by_its_missed_policy(
    redis_client: Any, key_prefix: str, policy: str, fired: int, skipped: int, coalesced: int
) -> None:
    """Paused from January to March: as if no scheduler had run, February's and March's occurrences
    follow the schedule's ``missed`` policy at the resume."""
    world = make_world(redis_client, key_prefix)
    record = world.schedules.create(monthly(missed=policy))
    world.at(rome(1, 1))
    assert world.tick() == 1
    world.engine.pauses.pause("mit", "acquirer maintenance", by="api")
    for month in (2, 3):
        world.at(rome(month, 2))
        assert world.tick() == 0, "a paused kind's schedule fires nothing"
    world.engine.pauses.resume("mit", by="api")
    assert world.tick() == fired
    counts = world.schedules.get(record.id).counts
    assert (counts.get("fired", 0), counts.get("skipped", 0), counts.get("coalesced", 0)) == (1 + fired, skipped, coalesced)
    (missed,) = world.events(record.id, "missed")
    assert missed["occurrences"] == ["2026-02-01T08:00:00Z", "2026-03-01T08:00:00Z"]
