"""A flow runs on the definition it started on (``workflows.engine.versions``, claim.lua): a process that does not
hold that version parks it, never fails it; one that holds it (current or kept previous) runs it."""

from __future__ import annotations

from typing import Any

from durapay.flows import Flow, step
from durapay.service.metrics import render
from durapay.workflows import deploys
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.versions import held_text, recorded
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary, wait_step


def fraud(given: Any) -> dict[str, Any]:
    return {"score": 1}


def build(*steps: Any, previous: tuple[Flow, ...] = (), migrates: tuple[Flow, ...] = ()) -> Flow:
    return Flow("demo", DemoInput, tuple(steps), summary, previous=previous, migrates=migrates)


def test_a_flow_records_its_version_and_a_process_without_it_parks_it(make_engine: Any, clock: ManualClock) -> None:
    first = build(step(fraud), ScriptedStep("charge"))
    renamed = build(step(fraud, name="risk"), ScriptedStep("charge"), ScriptedStep("ledger"))
    old, _ = make_engine(first, engine={"park_seconds": 5})
    new, sent = make_engine(renamed, engine={"park_seconds": 5})
    record = old.start("demo", {"amount": 3})
    assert record.fields["definition"] == f"demo@{first.version}"
    assert new.run_step(record.id, "fraud") == "parked"
    parked = new.get(record.id)
    assert parked.state is FlowState.PARKED and parked.attempt == 0 and parked.due == clock.now() + 5
    assert parked.outputs == {} and parked.error is None, "nothing ran, nothing failed"
    assert "no process here holds definition demo@" + first.version in new.history(record.id)[-1]["what"]
    assert [listed.id for listed in new.list(state=FlowState.PARKED)] == [record.id], "listed as parked"
    assert any(line.startswith('durapay_flows{kind="demo",state="parked"} 1') for line in render(new).splitlines())
    assert new.run_step(record.id, "fraud") == "early", "offered again after park_seconds only"
    clock.advance(5)
    sent.chains.clear()
    assert new.dispatch_due() == 1, "the due set offers it again"
    assert new.run_step(record.id, "fraud") == "parked", "still no code for it here"
    clock.advance(5)
    assert old.run_step(record.id, "fraud") == "ready", "a process that holds its version takes it on"
    assert old.run_step(record.id, "charge") == "succeeded"
    done = old.get(record.id)
    assert set(done.outputs) == {"fraud", "charge"}


def test_a_kept_previous_version_runs_old_flows_on_it_and_new_ones_on_the_new(make_engine: Any) -> None:
    first = build(step(fraud), ScriptedStep("charge"))
    second = build(step(fraud, name="risk"), ScriptedStep("charge"), ScriptedStep("ledger"), previous=(first,))
    old, _ = make_engine(first)
    both, _ = make_engine(second)
    early = old.start("demo", {"amount": 3})
    late = both.start("demo", {"amount": 4})
    assert late.fields["definition"] == f"demo@{second.version}"
    assert both.run_step(early.id, "fraud") == "ready"
    assert both.run_step(early.id, "charge") == "succeeded", "the old flow ends on its own steps"
    assert set(both.get(early.id).outputs) == {"fraud", "charge"}
    assert both.run_step(late.id, "risk") == "ready"
    assert both.run_step(late.id, "charge") == "ready"
    assert both.run_step(late.id, "ledger") == "succeeded"
    assert old.run_step(late.id, "ledger") == "stopped"
    assert both.definition_for(both.get(early.id)) is first


def test_a_record_of_an_earlier_release_is_on_the_kinds_first_version(make_engine: Any) -> None:
    first = build(step(fraud), ScriptedStep("charge"))
    second = build(step(fraud), ScriptedStep("charge"), ScriptedStep("ledger"), previous=(first,))
    engine, _ = make_engine(second)
    record = engine.start("demo", {"amount": 3})
    engine.redis.hdel(engine.keys.flow(record.id), "definition")  # as an earlier release wrote it
    legacy = engine.get(record.id)
    assert recorded("demo", legacy.fields, engine.registry) == ("demo", first.version)
    assert engine.run_step(record.id, "fraud") == "ready"
    assert engine.run_step(record.id, "charge") == "succeeded", "it ran the first version's two steps"
    assert f" demo={'demo@' + first.version} " in held_text(engine.registry)


def test_a_signal_is_judged_by_the_flows_own_version(make_engine: Any) -> None:
    """A previous version waits for a signal the current one no longer takes: it is still delivered."""
    first = build(wait_step("customer"), ScriptedStep("charge"))
    second = build(step(fraud), ScriptedStep("charge"), previous=(first,))
    old, _ = make_engine(first)
    both, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert both.run_step(record.id, "customer") == "waiting"
    assert both.signal(record.id, "paid", {"ok": True}) == "resumed"
    assert both.run_step(record.id, "customer") == "ready"
    assert both.run_step(record.id, "charge") == "succeeded"


def test_a_declared_migration_moves_flows_that_have_not_reached_a_changed_step(make_engine: Any) -> None:
    """Build 2 drops build 1's version but declares a migration from it: a flow still at an unchanged step
    moves onto build 2's version; one past the change (its done steps differ) is parked, never failed."""
    first = build(step(fraud), ScriptedStep("charge"), ScriptedStep("ledger"))
    second = build(step(fraud), ScriptedStep("charge"), step(fraud, name="notify"), migrates=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    early = old.start("demo", {"amount": 3})  # at fraud: unchanged in the new version
    late = old.start("demo", {"amount": 4})
    assert old.run_step(late.id, "fraud") == "ready" and old.run_step(late.id, "charge") == "ready"  # at ledger
    assert new.run_step(early.id, "fraud") == "ready"
    assert new.get(early.id).fields["definition"] == f"demo@{second.version}", "moved with the step's completion"
    assert new.run_step(early.id, "charge") == "ready"
    assert new.run_step(early.id, "notify") == "succeeded", "on the new version's steps"
    assert new.run_step(late.id, "ledger") == "parked"
    parked = new.get(late.id)
    assert parked.state is FlowState.PARKED and parked.fields["definition"] == f"demo@{first.version}"
    assert "no migration to demo@" in new.history(late.id)[-1]["what"] and parked.attempt == 0
    # deploy check judges the migration per flow as the claim does: only the flow past the change is left.
    groups = deploys.check(deploys.in_flight(new), deploys.manifest(new.registry)["kinds"])
    assert deploys.stranded(groups) == [late.id]
    assert deploys.manifest(new.registry)["kinds"]["demo"][0]["migrates"][0]["version"] == first.version
