"""Bulk retry and cancel (``workflows.bulk``) on a real Valkey, scripted steps, a manual clock; the runner
is called here as its Celery task would (tests/service/cli/test_bulk_cmd.py runs it on a real worker)."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.config.settings import BulkSettings
from durapay.tasks.outcomes import Finish
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
    posted = bulk.post("retry", wanted, by="cli:ops", given={"kind": "demo", "state": "failed"})
    assert posted["status"] == "running" and posted["total"] == 6 and posted["done"] == 0
    assert bulk.post("retry", wanted, by="cli:ops", given={"kind": "demo", "state": "failed"})["id"] == posted["id"]
    assert bulk.run(posted["id"]) is False, "all done in one run"
    done = bulk.get(posted["id"])
    assert (done["status"], done["done"], done["skipped"]) == ("done", 6, 0)
    for flow_id in failed:
        assert engine.get(flow_id).state is FlowState.READY
        bys = [entry.get("by") for entry in engine.history(flow_id)]
        assert f"bulk:{posted['id']} cli:ops" in bys, "the flow's history names the bulk action and who"
    again = bulk.post("retry", wanted, by="cli:ops", given={"kind": "demo", "state": "failed"})
    assert again == done, "posting it again answers the same record; nothing is acted on twice"


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
