"""Bulk retry and cancel (``workflows.bulk``) on a real Valkey, scripted steps, a manual clock; the runner
is called here as its Celery task would (tests/service/cli/test_bulk_cmd.py runs it on a real worker)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from durapay.config.settings import BulkSettings
from durapay.tasks.outcomes import Finish
from durapay.workflows import bulk as bulk_module
from durapay.workflows.bulk import BulkActions, BulkFilter, KeyReused, TooMany
from durapay.workflows.states import FlowState
from tests.workflows.engine_support import ScriptedStep, flow, wait_step


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
    engine, _ = make_engine(flow(wait_step()))
    ids = [engine.start("demo", {"amount": 5 + index}).id for index in range(4)]
    for flow_id in ids:
        assert engine.run_step(flow_id, "customer") == "waiting"
    bulk = BulkActions(engine, BulkSettings(rate=1000))
    wanted = BulkFilter(kind="demo", state=FlowState.WAITING)
    posted = bulk.post("cancel", wanted, by="api", given={"state": "waiting"})
    engine.cancel(ids[0], "by hand")  # cancelled meanwhile: the engine refuses the bulk's cancel
    bulk.run(posted["id"])
    done = bulk.get(posted["id"])
    assert (done["done"], done["skipped"]) == (3, 1)
    assert done["skipped_sample"][0]["id"] == ids[0]
    assert "already ended" in done["skipped_sample"][0]["reason"]
    assert all(engine.get(flow_id).state is FlowState.CANCELLED for flow_id in ids)


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
    with pytest.raises(TooMany, match="more than 2 flows match"):
        BulkActions(engine, BulkSettings(max_flows=2)).plan("cancel", BulkFilter(kind="demo"))


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

    def stall_first_runner(action: Any, flow_id: str, by: str) -> str | None:
        if threading.current_thread().name == "stalled" and not stalled.is_set():
            stalled.set()
            assert release.wait(10)
        return act(action, flow_id, by)

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
