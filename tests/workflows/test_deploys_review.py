"""``workflows.deploys`` (``durapay deploy check``) against what the engine then does, and ``Engine.retry`` of
a flow whose version a build dropped: the findings of issue 38's review, each test naming what was wrong
and the invariant it broke (invariant: deploy check exits 1 naming every flow and schedule the build it
judged would leave without code; a retry runs on one definition, the one it records)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from durapay.flows import Final, Flow, StepInput, step
from durapay.workflows import deploys
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.errors import OperatorError
from durapay.workflows.engine.states import FlowState
from tests.workflows.engine_support import DemoInput, HeldGateway, ScriptedStep, summary, wait_step


class DemoInputWithNote(DemoInput):
    note: str = ""


class Score(BaseModel):
    score: int


class ScoreAndReason(BaseModel):
    score: int
    reason: str = ""


def fraud(given: StepInput) -> dict[str, Any]:
    return {"score": 1}


def stranded_by(engine: Any, manifest_of: Any) -> list[str]:
    """What ``durapay deploy check --manifest`` (the new build's manifest) names against ``engine``'s store."""
    return deploys.stranded(deploys.check(deploys.in_flight(engine), deploys.manifest(manifest_of.registry)["kinds"]))


def test_deploy_check_judges_a_migration_by_the_input_schema_as_the_claim_does(make_engine: Any) -> None:
    """Finding 2: deploy check passed a migration the claim then refused, for a changed input model.

    Build 2 adds an optional field to the input model and declares ``migrates=(build 1,)``, dropping build
    1's version. deploy check (``deploys._migration``) compared only step names and steps, so it named no
    flow; the claim (``versions.migration``) refused every build-1 flow ("the input model changed") and
    parked it, and no process held build 1 any more: parked for ever after a check said safe. Both now ask
    ``versions.may_move``, the manifest carrying the input schema's digest."""
    first = Flow("demo", DemoInput, (step(fraud), ScriptedStep("charge")), summary)
    second = Flow("demo", DemoInputWithNote, (step(fraud), ScriptedStep("charge")), summary, migrates=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    said = stranded_by(old, new)
    ran = new.run_step(record.id, "fraud")
    assert not (ran == "parked" and said == []), (
        f"deploy check with build 2's manifest named {said}, then build 2 parked flow {record.id} "
        f"({new.history(record.id)[-1]['what']}) with no process holding its version"
    )
    assert said == [record.id] and ran == "parked"


def test_deploy_check_judges_a_migration_by_the_output_schemas_as_the_claim_does(make_engine: Any) -> None:
    """Finding 3: deploy check passed a migration the claim then refused, for a changed output model.

    Build 2 adds a field to the output model of a step the flow already did (``fraud``) and migrates from
    build 1. The manifest's steps left out their output schemas (``deploys._step``), so deploy check saw
    the steps the same and named no flow; the claim compared ``versions.describe_step`` (with the schema)
    and parked the flow at its next step, for ever (invariant: the check judges by the rule the claim
    applies, one home for "may this flow migrate": ``versions.may_move``; the manifest's steps carry their
    output schemas' digests)."""
    first = Flow("demo", DemoInput, (step(fraud, output=Score), ScriptedStep("charge")), summary)
    second = Flow("demo", DemoInput, (step(fraud, output=ScoreAndReason), ScriptedStep("charge")), summary, migrates=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "fraud") == "ready"  # at charge, past the step whose output changed
    said = stranded_by(old, new)
    ran = new.run_step(record.id, "charge")
    assert not (ran == "parked" and said == []), (
        f"deploy check with build 2's manifest named {said}, then build 2 parked flow {record.id} "
        f"({new.history(record.id)[-1]['what']}) with no process holding its version"
    )
    assert said == [record.id] and ran == "parked"


def test_deploy_check_passes_a_migration_the_claim_takes(make_engine: Any) -> None:
    """The same rule passes what it should: a build that changes only a step after the flow's (its output
    schema) and migrates from build 1 is judged safe, and the claim moves the flow."""
    first = Flow("demo", DemoInput, (step(fraud, output=Score), ScriptedStep("charge")), summary)
    second = Flow(
        "demo",
        DemoInput,
        (step(fraud, output=Score), step(fraud, name="charge", output=ScoreAndReason)),
        summary,
        migrates=(first,),
    )
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})  # at fraud: unchanged in build 2
    assert stranded_by(old, new) == []
    assert new.run_step(record.id, "fraud") == "ready"
    assert new.get(record.id).fields["definition"] == f"demo@{second.version}"


def test_deploy_check_judges_the_migration_of_every_flow_not_only_those_it_names(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    """The check names at most ``deploys.NAMED`` flows per group, and judged a migration on those only: a
    flow past the change beyond the first named was left out, the group passed, and the claim parked it
    after the deploy with no process holding its version."""
    monkeypatch.setattr(deploys, "NAMED", 1)
    first = Flow("demo", DemoInput, (step(fraud), step(fraud, name="risk", output=Score), ScriptedStep("charge")), summary)
    changed = step(fraud, name="risk", output=ScoreAndReason)
    second = Flow("demo", DemoInput, (step(fraud), changed, ScriptedStep("charge")), summary, migrates=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    at_fraud = [old.start("demo", {"amount": n}).id for n in range(1, 11)]  # before the change
    clock.advance(1)  # started last: read last (the kind index is in order of start)
    past = old.start("demo", {"amount": 11})
    assert old.run_step(past.id, "fraud") == "ready" and old.run_step(past.id, "risk") == "ready"  # at charge
    said = stranded_by(old, new)
    assert said == [past.id], f"named {said}; the 10 flows at fraud may move, {past.id} may not ({at_fraud[:2]}...)"


def refuse(given: StepInput) -> dict[str, Any]:
    raise Final("score too high")


def test_a_failed_flow_a_person_may_retry_is_judged_by_deploy_check(make_engine: Any, clock: ManualClock) -> None:
    """Finding 4: deploy check ignored failed flows, which ``retry`` restarts, and a retry of one whose
    version this process does not hold parked it for ever.

    ``deploys.IN_FLIGHT`` left out every TERMINAL state, failed included, though its docstring said a flow
    a person may retry needs its code too. Build 2 drops build 1's version; the check passed; an operator
    retried a build-1 flow that failed: ``Engine._retry_change`` restarted it at the first step of the
    *current* definition (``definition_for(record) or registry[kind]``) but left its ``definition`` field on
    build 1, so every claim parked it. Now the check names it, and the retry is refused naming the version
    (the flow stays failed, as it was)."""
    first = Flow("demo", DemoInput, (step(refuse, name="fraud"), ScriptedStep("charge")), summary)
    second = Flow("demo", DemoInput, (step(fraud, name="risk"), ScriptedStep("charge")), summary)
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "fraud") == "failed"
    assert stranded_by(old, new) == [record.id], "a failed flow a person may retry needs its code"
    with pytest.raises(OperatorError, match=f"runs on demo@{first.version}, which this code does not hold"):
        new.retry(record.id)
    kept = new.get(record.id)
    assert kept.state is FlowState.FAILED and kept.fields["definition"] == f"demo@{first.version}"


def test_a_packed_failed_flow_is_judged_by_its_own_version(make_engine: Any) -> None:
    """A finished flow is packed (``workflows.engine.compact``): its step and definition are in the packed value,
    which the check unpacks; read as plain fields, it would look like a record of an earlier release on
    the kind's first version."""
    from durapay.workflows.engine.compact import Compactor

    first = Flow("demo", DemoInput, (step(refuse, name="fraud"), ScriptedStep("charge")), summary)
    second = Flow("demo", DemoInput, (step(fraud, name="risk"), ScriptedStep("charge")), summary)
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "fraud") == "failed"
    assert Compactor(old.redis, old.keys, old.orders, tell=old.tell_holder, delay=0.0).run(now=old.clock.now()) == 1
    assert old.get(record.id).packed
    groups = deploys.check(deploys.in_flight(old), deploys.manifest(new.registry)["kinds"])
    assert [(group.version, group.states, group.steps) for group in groups] == [(first.version, {"failed": 1}, {"fraud": 1})]
    assert deploys.stranded(groups) == [record.id]


def test_a_retry_runs_a_failed_flow_on_its_own_version_when_held(make_engine: Any) -> None:
    """A build that keeps build 1 as a previous version restarts a build-1 flow on build 1's steps, the
    version it records."""
    first = Flow("demo", DemoInput, (step(refuse, name="fraud"), ScriptedStep("charge")), summary)
    second = Flow("demo", DemoInput, (step(fraud, name="risk"), ScriptedStep("charge")), summary, previous=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "fraud") == "failed"
    assert stranded_by(old, new) == []
    retried = new.retry(record.id)
    assert retried.step == "fraud" and retried.fields["definition"] == f"demo@{first.version}"


def test_a_retry_moves_a_failed_flow_where_the_migration_rule_allows(make_engine: Any) -> None:
    """A build that migrates from build 1 restarts a build-1 flow on its own version, recorded with the
    restart, where the migration rule allows it at the first step; where it does not, the retry is refused
    with the rule's reason."""
    first = Flow("demo", DemoInput, (step(refuse, name="fraud"), ScriptedStep("charge")), summary)
    moves = Flow("demo", DemoInput, (step(refuse, name="fraud"), step(fraud, name="charge")), summary, migrates=(first,))
    changed = Flow("demo", DemoInputWithNote, (step(refuse, name="fraud"), ScriptedStep("charge")), summary, migrates=(first,))
    old, _ = make_engine(first)
    moving, _ = make_engine(moves)
    refusing, _ = make_engine(changed)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "fraud") == "failed"
    with pytest.raises(OperatorError, match=r"may not move to .*the input model changed"):
        refusing.retry(record.id)
    retried = moving.retry(record.id)
    assert retried.step == "fraud" and retried.fields["definition"] == f"demo@{moves.version}", "recorded with the restart"
    assert moving.run_step(record.id, "fraud") == "failed", "run on the version it records, not parked"


def test_a_finished_flow_a_late_payment_reopens_is_judged_by_deploy_check(make_engine: Any) -> None:
    """Finding 8: deploy check ignored finished flows that a late payment brings back (same root as 4).

    A build-1 flow waiting for its customer is cancelled; build 2 drops build 1's version and deploy check
    named nothing (``deploys.IN_FLIGHT`` left out every TERMINAL state). Then the gateway reports the
    customer's payment on it: signal.lua moves it to needs_attention (a late payment) and the merchant
    accepted it (``retry``: the wait takes it), which needs build 1's wait step: the flow was parked with the
    customer's money taken and no process that can record it (invariant: every payment the gateway
    reports shows in a flow that can account for it; deploy check names the flows left without code). Now
    the check counts cancelled flows while kept, and build 2 refuses the accept naming the version (the
    payment stays shown: keep or refund it, or accept it from a build holding that version)."""
    from durapay.workflows.engine.signals import RECEIVER

    first = Flow("demo", DemoInput, (wait_step("customer"), ScriptedStep("charge")), summary)
    second = Flow("demo", DemoInput, (step(fraud), ScriptedStep("charge")), summary)
    old, _ = make_engine(first, client_factory=HeldGateway)
    new, _ = make_engine(second, client_factory=HeldGateway)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "customer") == "waiting"
    assert old.cancel(record.id, "customer left").state.value == "cancelled"
    said = stranded_by(old, new)
    paid = {
        "operationId": "800000000000000011",
        "operationType": "CAPTURE",
        "operationResult": "EXECUTED",
        "channel": "ECOMMERCE",
    }
    assert said == [record.id], "a cancelled flow a late payment reopens needs its code"
    assert new.signal(record.id, "notification", {"operation": paid}, by=RECEIVER) == "late_payment"
    with pytest.raises(OperatorError, match=f"runs on demo@{first.version}, which this code does not hold"):
        new.retry(record.id)
    assert new.get(record.id).state is FlowState.NEEDS_ATTENTION, "the late payment stays shown"


class _MovesDuringTheCheck:
    """The store's client as deploy check uses it, with one flow answered meanwhile: right after the check's
    first read of an index of the flow's partition (``tag``; the ready index, on the main the finding was
    written against, which read the state indexes in order), ``then()`` moves the flow."""

    def __init__(self, client: Any, tag: str, then: Any) -> None:
        self.client, self.tag, self.then, self.done = client, tag, then, False

    def _after(self, key: Any, page: Any) -> Any:
        if not self.done and str(key).startswith(self.tag + ":"):
            self.done = True
            self.then()
        return page

    def zrange(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        return self._after(key, self.client.zrange(key, *args, **kwargs))

    def zscan(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        return self._after(key, self.client.zscan(key, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_deploy_check_sees_a_flow_that_moves_while_it_reads(make_engine: Any) -> None:
    """Finding 9: deploy check read the state indexes one after another, so a flow that moved during
    the check into an index already read was never seen.

    ``deploys._flow_ids`` paged through ready, running, ..., waiting, ... per partition. A build-1 flow
    waits for its customer; the check read the ready index, the customer's signal then moved the flow
    waiting -> ready, and the check read the waiting index without it: build 2's manifest (no build-1
    version) was judged safe, and after the deploy the flow was parked with no process holding its version
    (invariant: deploy check names every flow in flight that the build would leave without code; a live
    store moves while it is read). The check now reads the kind indexes with ZSCAN, which a flow's moves
    do not leave."""
    from types import SimpleNamespace

    first = Flow("demo", DemoInput, (wait_step("customer"), ScriptedStep("charge")), summary)
    second = Flow("demo", DemoInput, (step(fraud, name="risk"), ScriptedStep("charge")), summary)
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "customer") == "waiting"
    tag = old.keys.tag(old.keys.partition(record.id))
    moving = _MovesDuringTheCheck(old.redis, tag, lambda: old.signal(record.id, "paid", {"ok": True}))
    store = SimpleNamespace(redis=moving, keys=old.keys, registry=old.registry)
    said = deploys.stranded(deploys.check(deploys.in_flight(store), deploys.manifest(new.registry)["kinds"]))
    assert moving.done, "the signal was delivered during the check"
    ran = new.run_step(record.id, "customer")
    assert not (ran == "parked" and said == []), (
        f"deploy check named {said} while flow {record.id} was in flight on build 1's version (it moved "
        f"waiting -> ready during the check); build 2 then parked it: {new.history(record.id)[-1]['what']}"
    )
    assert said == [record.id]


def test_deploy_check_fails_a_build_without_the_kind_its_schedules_charge_with(redis_client: Any, key_prefix: str) -> None:
    """Finding 11: a schedule whose charge kind the new build lacks was reported "NO" but the check passed.

    ``deploys.in_flight`` put the schedules in a group ``(kind, "*")`` with a count and no ids; ``check``
    marked it not runnable, but ``stranded`` (what ``durapay deploy check`` exits 1 on, and its JSON ``ok``)
    listed only flow ids, so with no charge in flight at that moment the check printed "ok" and exited 0:
    every schedule then fired into a kind no process has (invariant: deploy check exits 1 when a schedule
    would be left with no code for its charges). The group now names its schedules, and ``stranded``
    lists them."""
    from tests.workflows.schedules.test_schedules import make_world, monthly

    world = make_world(redis_client, key_prefix)
    world.schedules.create(monthly(), key="gym-42")
    groups = deploys.check(deploys.in_flight(world.engine, schedules=world.schedules), {"kinds": {}}["kinds"])
    refused = [group for group in groups if not group.runnable]
    assert refused and refused[0].schedules == 1, [group.shown() for group in groups]
    said = deploys.stranded(groups)
    assert said, (
        f"a build with no {world.schedules.flow_kind!r} kind would leave 1 schedule without code "
        f"({refused[0].reason}), yet deploy check's stranded list is {said}: it exits 0"
    )
    assert said == refused[0].schedule_ids and refused[0].shown()["schedule_ids"] == said


def test_deploy_check_sees_a_schedule_that_moves_while_it_reads(redis_client: Any, key_prefix: str) -> None:
    """The class of finding 9, for schedules: the check read the schedule state indexes one after
    another (active, dunning, paused, needs_attention), so a paused schedule resumed after the active
    index was read was in neither read, and a build without its charge kind passed."""
    from tests.workflows.schedules.test_schedules import make_world, monthly

    world = make_world(redis_client, key_prefix)
    schedule = world.schedules.create(monthly(), key="gym-43")
    world.schedules.pause(schedule.id)
    store = world.schedules.store
    # Read right after the active ones (every partition's), before the paused ones.
    after_active = {store.keys.by_state(partition, "dunning") for partition in range(store.partitions)}
    real = store.redis
    resumed: list[bool] = []

    class ResumesAfterActive:
        def __getattr__(self, name: str) -> Any:
            found = getattr(real, name)
            if name not in ("zrevrange", "zrange", "zscan"):
                return found

            def read(key: Any, *args: Any, **kwargs: Any) -> Any:
                page = found(key, *args, **kwargs)
                if not resumed and (str(key) in after_active or name == "zscan"):
                    resumed.append(True)
                    store.redis = real
                    world.schedules.resume(schedule.id)
                    store.redis = self  # type: ignore[assignment]
                return page

            return read

    store.redis = ResumesAfterActive()  # type: ignore[assignment]
    try:
        groups = deploys.check(deploys.in_flight(world.engine, schedules=world.schedules), {})
    finally:
        store.redis = real
    assert resumed, "the schedule was resumed during the check"
    assert deploys.stranded(groups) == [schedule.id], [group.shown() for group in groups]
