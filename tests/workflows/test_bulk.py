"""Bulk retry and cancel (``workflows.bulk``) on a real Valkey, scripted steps, a manual clock; the runner
is called here as its Celery task would (tests/service/cli/test_bulk_cmd.py runs it on a real worker)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from pydantic import Field

from durapay.config.settings import BulkSettings
from durapay.gateway import GatewayModel
from durapay.tasks.outcomes import Finish
from durapay.workflows import bulk as bulk_module
from durapay.workflows.bulk import BulkActions, BulkFilter, KeyReused, PlanNotKept, TooMany
from durapay.workflows.bulk_plan import KEPT_SECONDS
from durapay.workflows.engine.compact import Compactor
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition
from tests.workflows.engine_support import ScriptedStep, flow, summary, wait_step


class MoneyInput(GatewayModel):
    amount: int = Field(ge=1)
    currency: str | None = None


def failed_flows(engine: Any, count: int) -> list[str]:
    ids = []
    for index in range(count):
        record = engine.start("demo", {"amount": 5 + index})
        assert engine.run_step(record.id, "first") == "failed"
        ids.append(record.id)
    return ids


def test_a_dry_run_counts_and_the_action_retries_each_flow_once(make_engine: Any) -> None:
    first = ScriptedStep("first", outcomes=[Finish(False, "declined")] * 6)
    engine, _ = make_engine(flow(first, wait_step()))
    failed = failed_flows(engine, 6)
    waiting = engine.start("demo", {"amount": 99})
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    wanted = BulkFilter(kind="demo", state=FlowState.FAILED)
    plan = bulk.plan("retry", wanted)
    assert sorted(plan.ids) == sorted(failed) and plan.view()["count"] == 6 and plan.view()["would_skip"] == 0
    assert waiting.id not in plan.ids
    given = {"kind": "demo", "state": "failed"}
    posted = bulk.post("retry", wanted, by="cli:ops", given=given, plan=plan.token)
    assert posted["status"] == "running" and posted["total"] == 6 and posted["done"] == 0
    assert bulk.post("retry", wanted, by="cli:ops", given=given, plan=plan.token)["id"] == posted["id"]
    assert bulk.run(posted["id"]) is False, "all done in one run"
    done = bulk.get(posted["id"])
    assert (done["status"], done["done"], done["skipped"]) == ("done", 6, 0)
    for flow_id in failed:
        assert engine.get(flow_id).state is FlowState.READY
        bys = [entry.get("by") for entry in engine.history(flow_id)]
        assert f"bulk:{posted['id']} cli:ops" in bys, "the flow's history names the bulk action and who"
    again = bulk.post("retry", wanted, by="cli:ops", given=given, plan=plan.token)
    assert again == done, "the same dry run confirmed again answers the same record; nothing is acted on twice"


def test_the_same_filter_after_a_new_dry_run_acts_on_the_flows_it_matches_now(make_engine: Any, clock: Any) -> None:
    """Idempotency covers a confirmation of one dry run, not every later request: 'retry kind=demo
    state=failed' after Monday's outage, asked again (a new dry run) after Wednesday's, is a new action
    on Wednesday's failed flows (before, its id came from the filter's text and answered Monday's record,
    done, for the week the record was kept)."""
    first = ScriptedStep("first", outcomes=[Finish(False, "gateway down")] * 4)
    engine, _ = make_engine(flow(first, wait_step()))
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    wanted = BulkFilter(kind="demo", state=FlowState.FAILED)
    given = {"kind": "demo", "state": "failed"}
    failed_flows(engine, 2)
    monday = bulk.post("retry", wanted, by="console", given=given, plan=bulk.plan("retry", wanted).token)
    bulk.run(monday["id"])
    clock.advance(2 * 86400)
    wednesday = failed_flows(engine, 2)
    plan = bulk.plan("retry", wanted)
    assert sorted(plan.ids) == sorted(wednesday)
    again = bulk.post("retry", wanted, by="console", given=given, plan=plan.token)
    assert again["id"] != monday["id"] and again["total"] == 2
    bulk.run(again["id"])
    assert [engine.get(flow_id).state for flow_id in wednesday] == [FlowState.READY, FlowState.READY]
    unkeyed = bulk.post("retry", wanted, by="api", given=given)
    assert unkeyed["id"] not in (monday["id"], again["id"]), "neither key nor dry run: a new action"
    with pytest.raises(KeyReused, match="the dry run"):
        bulk.post("cancel", wanted, by="console", given=given, plan=plan.token)


def test_flows_the_engine_refuses_are_skipped_with_its_reason(make_engine: Any) -> None:
    """A flow the dry run showed ended is skipped with the engine's reason; one that ended after the dry run
    is skipped as changed since (the person confirmed a cancel of a waiting flow, not of this one)."""
    engine, _ = make_engine(flow(wait_step()))
    ids = [engine.start("demo", {"amount": 5 + index}).id for index in range(4)]
    for flow_id in ids:
        assert engine.run_step(flow_id, "customer") == "waiting"
    engine.cancel(ids[0], "by hand")  # ended before the dry run: the engine refuses the bulk's cancel
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    plan = bulk.plan("cancel", BulkFilter(kind="demo"))
    assert plan.view()["would_skip"] == 1
    posted = bulk.post("cancel", BulkFilter(kind="demo"), by="api", plan=plan.token)
    engine.cancel(ids[1], "by hand")  # ended after it
    bulk.run(posted["id"])
    done = bulk.get(posted["id"])
    assert (done["done"], done["skipped"], done["changed"]) == (2, 2, 1)
    reasons = {entry["id"]: entry["reason"] for entry in done["skipped_sample"]}
    assert "already ended" in reasons[ids[0]]
    assert "changed since the dry run (it was waiting, it is cancelled now)" in reasons[ids[1]]
    assert all(engine.get(flow_id).state is FlowState.CANCELLED for flow_id in ids)


def test_a_flow_that_fails_after_the_dry_run_is_not_retried_by_its_confirmation(make_engine: Any) -> None:
    """'retry 1 flow(s)?' confirmed: a flow the dry run showed ready (not retried), failed since, is not
    restarted (a charge attempt nobody confirmed), nor one that failed after the dry run and was never
    shown; each listed flow is re-checked at its turn and counted as changed (before, the post walked the
    filter again and retried all three)."""
    first = ScriptedStep("first", outcomes=[Finish(False, "declined")] * 3)
    engine, _ = make_engine(flow(first, wait_step()))
    [shown_failed] = failed_flows(engine, 1)
    ready = engine.start("demo", {"amount": 50}).id
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    plan = bulk.plan("retry", BulkFilter(kind="demo"))
    assert sorted(plan.ids) == sorted([shown_failed, ready]) and plan.view()["would_skip"] == 1
    kept = bulk.plans.ids_key(plan.token)
    assert 0 < engine.redis.ttl(kept) <= KEPT_SECONDS, "a dry run is kept for its confirmation, not for ever"
    assert engine.run_step(ready, "first") == "failed", "failed after the dry run"
    [unseen] = failed_flows(engine, 1)
    posted = bulk.post("retry", BulkFilter(kind="demo"), by="console", given={"kind": "demo"}, plan=plan.token)
    assert posted["total"] == 2, "the flows the dry run listed, not the filter walked again"
    assert engine.redis.exists(kept) == 0 and engine.redis.ttl(bulk._ids_key(posted["id"])) > 86400, (
        "once confirmed, its flows are kept with the action's record, for its retention"
    )
    bulk.run(posted["id"])
    done = bulk.get(posted["id"])
    assert (done["done"], done["skipped"], done["changed"]) == (1, 1, 1), done
    assert done["skipped_sample"] == [
        {"id": ready, "reason": f"flow {ready} changed since the dry run (it was ready, it is failed now)"}
    ]
    assert [engine.get(flow_id).state for flow_id in (shown_failed, ready, unseen)] == [
        FlowState.READY,
        FlowState.FAILED,
        FlowState.FAILED,
    ]


def test_a_flow_acted_on_since_the_dry_run_is_skipped_and_one_only_packed_is_not(make_engine: Any, clock: Any) -> None:
    """Same state, another version: a failed flow retried by hand and failed again since the dry run is
    skipped; a flow only packed since (the packing pass moves the version, and nothing else) is retried."""
    first = ScriptedStep("first", outcomes=[Finish(False, "declined")] * 4)
    engine, _ = make_engine(flow(first, wait_step()))
    again, packed = failed_flows(engine, 2)
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    wanted = BulkFilter(kind="demo", state=FlowState.FAILED)
    plan = bulk.plan("retry", wanted)
    engine.retry(again, by="ops")
    assert engine.run_step(again, "first") == "failed"
    before = engine.get(packed).version
    clock.advance(5)
    assert Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder, delay=0.0).run(now=clock.now()) >= 1
    assert engine.get(packed).packed and engine.get(packed).version == before + 1
    posted = bulk.post("retry", wanted, by="api", plan=plan.token)
    bulk.run(posted["id"])
    done = bulk.get(posted["id"])
    assert (done["done"], done["skipped"], done["changed"]) == (1, 1, 1), done
    assert done["skipped_sample"][0]["id"] == again
    assert "changed since the dry run (still failed" in done["skipped_sample"][0]["reason"]
    assert (engine.get(again).state, engine.get(packed).state) == (FlowState.FAILED, FlowState.READY)


def test_a_dry_runs_token_is_refused_for_another_filter_or_action_and_once_gone(make_engine: Any) -> None:
    """The token names its dry run's action and filter (as asked): confirmed for another of either, or not
    kept (never made, or confirmed already under another key), it is refused (a 409 on every surface)."""
    engine, _ = make_engine(flow(wait_step()))
    engine.start("demo", {"amount": 5})
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    plan = bulk.plan("cancel", BulkFilter(kind="demo", state=FlowState.READY), asked={"kind": "demo", "state": "ready"})
    with pytest.raises(KeyReused, match=r"made for cancel of kind=demo, state=ready, not for cancel of kind=demo: make a dry"):
        bulk.post("cancel", BulkFilter(kind="demo"), by="api", given={"kind": "demo"}, plan=plan.token)
    with pytest.raises(KeyReused, match="made for cancel of kind=demo, state=ready, not for retry of"):
        bulk.post("retry", BulkFilter(kind="demo"), by="api", given={"kind": "demo", "state": "ready"}, plan=plan.token)
    assert bulk.list() == [], "nothing posted"
    given = {"kind": "demo", "state": "ready"}
    posted = bulk.post("cancel", BulkFilter(kind="demo", state=FlowState.READY), by="api", given=given, plan=plan.token)
    assert bulk.post("cancel", BulkFilter(), by="api", given=given, plan=plan.token)["id"] == posted["id"]
    with pytest.raises(PlanNotKept, match="is not kept"):
        bulk.post("cancel", BulkFilter(), by="api", given=given, plan=plan.token, key="another")
    with pytest.raises(PlanNotKept, match="make a new dry run"):
        bulk.post("cancel", BulkFilter(), by="api", given=given, plan="0" * 32)


def test_relative_times_are_fixed_at_the_dry_run(make_engine: Any, clock: Any) -> None:
    """``since=1h`` means the hour before the dry run: confirmed two hours later, the action acts on the
    flows it listed and records the window as the dry run resolved it (before, the post resolved it again
    and found none)."""
    engine, _ = make_engine(flow(wait_step()))
    ids = [engine.start("demo", {"amount": 5 + index}).id for index in range(2)]
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    given = {"kind": "demo", "since": "1h"}
    at_dry_run = clock.now()
    plan = bulk.plan("cancel", BulkFilter(kind="demo", since=at_dry_run - 3600), asked=given)
    clock.advance(2 * 3600)
    resolved_now = BulkFilter(kind="demo", since=clock.now() - 3600)  # what the API resolves "1h" to at the post
    posted = bulk.post("cancel", resolved_now, by="api", given=given, plan=plan.token)
    assert posted["total"] == 2 and posted["filter"]["since"] == at_dry_run - 3600
    bulk.run(posted["id"])
    assert [engine.get(flow_id).state for flow_id in ids] == [FlowState.CANCELLED] * 2


def test_a_dry_run_shows_the_money_at_stake_and_keeps_little(make_engine: Any, clock: Any) -> None:
    """Each listed flow's amount and currency (the request's until an outcome names an operation) and the
    total per currency of the flows the action would act on (a flow it would skip is not at stake). What a
    dry run keeps per flow is a few dozen bytes (docs/operations.md states it)."""
    first = ScriptedStep("first", outcomes=[Finish(False, "declined")] * 60)
    engine, _ = make_engine(FlowDefinition("demo", MoneyInput, (first, wait_step()), summary))
    failed_flows(engine, 57)  # no currency: totalled apart
    clock.advance(1)  # the sample shows the newest
    amounts = [(1500, "EUR"), (250, "EUR"), (3000, "JPY")]
    for amount, currency in amounts:
        record = engine.start("demo", {"amount": amount, "currency": currency})
        assert engine.run_step(record.id, "first") == "failed"
    engine.start("demo", {"amount": 99_999, "currency": "EUR"})  # ready: a retry skips it
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    view = bulk.plan("retry", BulkFilter(kind="demo")).view()
    assert view["count"] == 61 and view["would_skip"] == 1
    assert view["totals"] == {"": sum(5 + index for index in range(57)), "EUR": 1750, "JPY": 3000}
    shown = {(flow["amount"], flow["currency"]) for flow in view["sample"]}
    assert {(1500, "EUR"), (250, "EUR"), (3000, "JPY"), (99_999, "EUR")} <= shown
    assert all(flow["version"] >= 1 for flow in view["sample"])
    kept = bulk.plans.ids_key(view["plan"])
    per_flow = int(engine.redis.memory_usage(kept, samples=0)) / 61
    assert per_flow < 48, f"{per_flow:.1f} bytes a flow"


def test_a_key_names_one_action_and_is_refused_for_another(make_engine: Any) -> None:
    engine, _ = make_engine(flow(wait_step()))
    engine.start("demo", {"amount": 5})
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    first = bulk.post("cancel", BulkFilter(kind="demo"), by="api", given={"kind": "demo"}, key="k-1")
    assert bulk.post("cancel", BulkFilter(kind="demo"), by="cli", given={"kind": "demo"}, key="k-1")["id"] == first["id"]
    with pytest.raises(KeyReused, match="was used for another bulk action"):
        bulk.post("retry", BulkFilter(kind="demo"), by="api", given={"kind": "demo"}, key="k-1")


def test_a_filter_matching_too_many_is_refused(make_engine: Any) -> None:
    engine, _ = make_engine(flow(wait_step()))
    for index in range(3):
        engine.start("demo", {"amount": 5 + index})
    with pytest.raises(TooMany, match="more than 2 flows match") as refused:
        BulkActions(engine, BulkSettings(max_flows=2)).plan("cancel", BulkFilter(kind="demo"))
    assert "keeps at most 2 (DURAPAY_BULK__MAX_FLOWS); narrow the filter" in str(refused.value)
    assert not list(engine.redis.scan_iter(match=f"{engine.keys.prefix}:*bulk_plan*")), "a dry run refused keeps nothing"


def test_a_cancel_with_money_in_flight_is_a_request_the_engine_ends(make_engine: Any) -> None:
    """A flow whose step is at the gateway (money may move): the bulk cancel asks, as a cancel by hand
    would; the flow ends only as the engine allows (after its step reads the gateway)."""
    engine, _ = make_engine(flow(ScriptedStep("first"), wait_step()))
    record = engine.start("demo", {"amount": 5})
    claim = engine.claim(record.id, "first")
    assert not isinstance(claim, str) and claim.record.unsettled, "the step's call may move money"
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    posted = bulk.post("cancel", BulkFilter(kind="demo"), by="api", given={"kind": "demo"})
    bulk.run(posted["id"])
    assert bulk.get(posted["id"])["done"] == 1
    asked = engine.get(record.id)
    assert asked.cancel_requested and asked.state is FlowState.RUNNING, "asked to cancel, not ended"


def test_a_runner_that_lost_its_lease_acts_on_nothing_more(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner stalled past its lease (a Redis failover waited out, a slow flow) while the dispatcher's
    revive sent another: the stalled one, back, finds the lease not its own and stops, counting nothing;
    the other acts on each flow once (before, both acted on every flow, each counting its own progress)."""
    first = ScriptedStep("first", outcomes=[Finish(False, "declined")] * 4)
    engine, _ = make_engine(flow(first, wait_step()))
    failed_flows(engine, 4)
    monkeypatch.setattr(bulk_module, "LEASE_MS", 300)
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    posted = bulk.post("retry", BulkFilter(kind="demo", state=FlowState.FAILED), by="ops", given={"kind": "demo"})
    stalled, release = threading.Event(), threading.Event()
    act = bulk._act

    def stall_first_runner(action: Any, flow_id: str, by: str, seen: Any) -> Any:
        if threading.current_thread().name == "stalled" and not stalled.is_set():
            stalled.set()
            assert release.wait(10)
        return act(action, flow_id, by, seen)

    monkeypatch.setattr(bulk, "_act", stall_first_runner)
    runner = threading.Thread(target=bulk.run, args=(posted["id"],), name="stalled")
    runner.start()
    assert stalled.wait(10)
    lease = bulk._lease_key(posted["id"])
    deadline = time.monotonic() + 10
    while engine.redis.exists(lease) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bulk.run(posted["id"]) is False, "the revived runner ends the action"
    release.set()
    runner.join(10)
    done = bulk.get(posted["id"])
    assert (done["done"], done["skipped"], done["total"], done["status"]) == (4, 0, 4, "done"), done


def test_a_runner_paces_itself_within_its_run_and_keeps_its_lease(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a slow rate the pause before the next flow is cut at the run's end (the task hands over), and the
    lease is renewed while the runner waits (a pause longer than the lease does not give the action away)."""
    first = ScriptedStep("first", outcomes=[Finish(False, "declined")] * 2)
    engine, _ = make_engine(flow(first, wait_step()))
    failed_flows(engine, 2)
    monkeypatch.setattr(bulk_module, "LEASE_MS", 300)
    bulk = BulkActions(engine, BulkSettings(rate=1))
    posted = bulk.post("retry", BulkFilter(kind="demo", state=FlowState.FAILED), by="ops", given={"kind": "demo"})
    started = time.monotonic()
    assert bulk.run(posted["id"], seconds=0.5) is True, "work left after one flow"
    assert time.monotonic() - started < 0.9, "the pause of a second was cut at the run's end"
    assert bulk.get(posted["id"])["done"] == 1
    assert bulk.run(posted["id"], seconds=5) is False  # paced a second, past the lease of 0.3 s
    assert bulk.get(posted["id"])["done"] == 2


def test_a_post_cut_after_its_claim_does_not_block_the_action(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A post cut between its claim of the record and the record written whole (its process killed, a
    Redis error): the claim goes after CLAIM_SECONDS and the action can be posted again (before, a record
    with only its id and no expiry made every later post wait and fail with UnknownBulk, for ever)."""
    engine, _ = make_engine(flow(wait_step()))
    engine.start("demo", {"amount": 5})
    monkeypatch.setattr(bulk_module, "CLAIM_SECONDS", 1)
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    given = {"kind": "demo"}

    def cut(*args: Any) -> None:
        raise redis.ConnectionError("the post's process is gone")

    with monkeypatch.context() as patch:
        patch.setattr(bulk, "_write", cut)
        with pytest.raises(redis.ConnectionError):
            bulk.post("cancel", BulkFilter(kind="demo"), by="ops", given=given, key="k1")
    record = bulk._record_key(bulk.bulk_id("k1"))
    assert 0 < engine.redis.ttl(record) <= 1, "the claim is short-lived"
    posted = bulk.post("cancel", BulkFilter(kind="demo"), by="ops", given=given, key="k1")
    assert posted["status"] in ("running", "done") and posted["total"] == 1
    assert engine.redis.ttl(record) > 3600, "the whole record is kept for the retention"


def test_a_claim_left_without_an_expiry_is_taken_over(make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim left by a post before claims expired (only ``id``, no expiry) gets one from the next post."""
    engine, _ = make_engine(flow(wait_step()))
    engine.start("demo", {"amount": 5})
    monkeypatch.setattr(bulk_module, "CLAIM_SECONDS", 1)
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    given = {"kind": "demo"}
    bulk_id = bulk.bulk_id("k2")
    engine.redis.hsetnx(bulk._record_key(bulk_id), "id", bulk_id)
    posted = bulk.post("cancel", BulkFilter(kind="demo"), by="ops", given=given, key="k2")
    assert posted["id"] == bulk_id and posted["total"] == 1


def test_a_bulk_filter_may_name_a_terminal_and_an_unknown_one_is_refused(make_engine: Any) -> None:
    """After one terminal's outage its failed flows are retried alone: the filter's terminal."""
    from durapay.workflows.engine import InputError

    first = ScriptedStep("first", outcomes=[Finish(False, "gateway down")] * 4)
    engine, _ = make_engine(flow(first, wait_step()), terminals={"it": {"api_key": "key-of-it"}})
    on_it = []
    for index in range(4):
        record = engine.start("demo", {"amount": 5 + index}, terminal="it" if index % 2 else None)
        assert engine.run_step(record.id, "first") == "failed"
        if index % 2:
            on_it.append(record.id)
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    plan = bulk.plan("retry", BulkFilter(state=FlowState.FAILED, terminal="it"))
    assert sorted(plan.ids) == sorted(on_it) and plan.view()["filter"]["terminal"] == "it"
    with pytest.raises(InputError, match="unknown terminal 'fr'; known terminals: default, it"):
        bulk.plan("retry", BulkFilter(state=FlowState.FAILED, terminal="fr"))
