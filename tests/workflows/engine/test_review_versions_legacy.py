"""Review (deploys with flows in flight): which version a record of an earlier release (no ``definition``
field) runs on. ``versions.first_version`` looked at ``previous`` only (fixed: a migration's source
counts as the earliest version): a build that declares a *migration*
from the kind's earlier version (``migrates=``, the alternative docs/deploys.md offers to keeping it) puts
such a record on its new version directly, and ``versions.migration`` (the one rule, ``may_move``) is
never asked, so a flow past a changed step, money in flight at it, runs the new version's step.

Real Valkey, the engine's claim/complete scripts; steps scripted (``engine_support.ScriptedStep``)."""

from __future__ import annotations

from typing import Any

from durapay.flows import Flow, StepInput, step
from durapay.gateway import Catalogue
from durapay.tasks.outcomes import Retry
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary

LOST = {"type": "ConnectionDropped", "ambiguous": True, "operation": "create_moto_order", "message": "answer lost"}


def fraud(given: StepInput) -> dict[str, Any]:
    return {"score": 1}


def build(*steps: Any, previous: tuple[Flow, ...] = (), migrates: tuple[Flow, ...] = ()) -> Flow:
    return Flow("demo", DemoInput, tuple(steps), summary, previous=previous, migrates=migrates)


def _charge_lost(engine: Any) -> str:
    """A build-1 flow whose MOTO charge was sent and its answer lost: money in flight at ``charge``."""
    record = engine.start("demo", {"amount": 3})
    assert engine.run_step(record.id, "fraud") == "ready"
    assert engine.run_step(record.id, "charge") == "retrying"
    lost = engine.get(record.id)
    assert lost.unsettled is not None and lost.unsettled["step"] == "charge", lost.summary()
    return str(record.id)


def test_a_flow_with_its_definition_field_at_a_changed_money_step_is_parked(make_engine: Any) -> None:
    """The rule as it holds for a record that names its version (the control for the test below)."""
    first = build(step(fraud), ScriptedStep("charge", outcomes=[Retry(0.0, LOST, True)]))
    changed = ScriptedStep("charge", op=Catalogue.create_mit_order)
    second = build(step(fraud), changed, migrates=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    flow_id = _charge_lost(old)
    assert new.run_step(flow_id, "charge") == "parked"
    assert changed.runs == [], "build 2's charge never ran for a build-1 flow whose charge is unresolved"


def test_a_record_of_an_earlier_release_at_a_changed_money_step_is_not_run_on_the_migrated_version(
    make_engine: Any,
) -> None:
    first = build(step(fraud), ScriptedStep("charge", outcomes=[Retry(0.0, LOST, True)]))
    changed = ScriptedStep("charge", op=Catalogue.create_mit_order)
    second = build(step(fraud), changed, migrates=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    flow_id = _charge_lost(old)
    # As a release before versions were recorded wrote it: build 1 ran it on its (only) version, first.
    old.redis.hdel(old.keys.flow(flow_id), "definition")
    assert old.definition_for(old.get(flow_id)) is first
    ran = new.run_step(flow_id, "charge")
    after = new.get(flow_id)
    # docs/deploys.md, Migrating: a flow past a change (money unsettled at a step that changed) is not moved,
    # it is parked until a process holding its own version claims it.
    assert changed.runs == [] and ran == "parked", (ran, after.summary(), after.unsettled, new.history(flow_id)[-2:])
