"""``durapay bulk`` and ``durapay kinds`` against the test Valkey, the action run by a real Celery worker.

1,000 flows are made quickly (``tests.service.bulk_support.make_flows``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from durapay.config import load_settings
from durapay.service.runtime import Runtime, build_runtime
from durapay.workflows.engine.states import FlowState
from tests.service.bulk_support import make_flows
from tests.service.cli.conftest import invoke
from tests.waiting import wait_until

COUNT = 1000


@pytest.fixture
def worker(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """A real worker on the commands' broker, its bulk actions paced at 5,000 flows a second (the
    commands' setting too)."""
    monkeypatch.setenv("DURAPAY_BULK__RATE", "5000")
    built = build_runtime(load_settings(), redis_url=cli_env["DURAPAY_REDIS_URL"], rng=random.Random(43))
    with start_worker(built.celery, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10):
        yield built
    built.close()


def run_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_bulk_retry_of_1000_failed_flows_from_the_cli(worker: Runtime) -> None:
    engine = worker.engine
    failed = make_flows(worker, COUNT, FlowState.FAILED)
    # mit paused: the retried flows wait instead of calling a gateway this test does not run (the
    # retry itself is what is shown here; tests/workflows/test_pauses.py shows the resume)
    engine.pauses.pause("mit", "the gateway's maintenance", by="test")
    plan = run_json("bulk", "retry", "--kind", "mit", "--state", "failed", "--dry-run")
    assert (plan["count"], plan["would_skip"]) == (COUNT, 0) and len(plan["sample"]) == 20
    assert engine.get(failed[0]).state is FlowState.FAILED, "a dry run changes nothing"
    posted = run_json("bulk", "retry", "--kind", "mit", "--state", "failed", "--yes", "--by", "ops", "--plan", plan["plan"])
    assert posted["total"] == COUNT
    assert worker.bulk is not None
    bulk = worker.bulk
    wait_until(lambda: bulk.get(posted["id"])["status"] == "done", 60, "the bulk retry")
    done = run_json("bulk", "retry", "--kind", "mit", "--state", "failed", "--yes", "--plan", plan["plan"])
    assert done["id"] == posted["id"] and (done["done"], done["skipped"]) == (COUNT, 0), (
        "the dry run confirmed again: the same action"
    )
    later = run_json("bulk", "retry", "--kind", "mit", "--state", "failed", "--yes")
    assert later["id"] != posted["id"] and later["total"] == 0, "a new dry run: a new action, on the flows failed now (none)"
    assert all(record.state is FlowState.READY for record in engine.store.many(failed))
    # each retried flow's step was sent and met the pause on the worker: held, once each (and the
    # broker left empty for the next test)
    wait_until(lambda: engine.pauses.held_counts(["mit"])["mit"] == COUNT, 60, "every retried flow's step to be held")
    assert f"bulk:{posted['id']} cli:ops" in {entry.get("by") for entry in engine.history(failed[0])}
    show = invoke("bulk", "show", posted["id"])
    assert f"done, {COUNT}/{COUNT} ({COUNT} done, 0 skipped)" in show.stdout


def test_bulk_cancel_of_1000_waiting_flows_from_the_cli(worker: Runtime) -> None:
    engine = worker.engine
    waiting = make_flows(worker, COUNT, FlowState.WAITING)
    engine.cancel(waiting[0], "by hand")  # ended before the action: the engine refuses it, the action skips it
    plan = run_json("bulk", "cancel", "--kind", "mit", "--state", "waiting", "--since", "1h", "--dry-run")
    assert plan["count"] == COUNT - 1
    posted = run_json("bulk", "cancel", "--kind", "mit", "--state", "waiting", "--since", "1h", "--yes", "--key", "maint-1")
    again = run_json("bulk", "cancel", "--kind", "mit", "--state", "waiting", "--since", "1h", "--yes", "--key", "maint-1")
    assert again["id"] == posted["id"], "the same key: the same action"
    assert worker.bulk is not None
    bulk = worker.bulk
    wait_until(lambda: bulk.get(posted["id"])["status"] == "done", 60, "the bulk cancel")
    record = bulk.get(posted["id"])
    assert (record["total"], record["done"], record["skipped"]) == (COUNT - 1, COUNT - 1, 0)
    assert all(flow.state is FlowState.CANCELLED for flow in engine.store.many(waiting))
    listed = invoke("bulk", "ls")
    assert posted["id"] in listed.stdout


def test_kinds_pause_and_resume_from_the_cli(engine_side: Runtime) -> None:
    paused = run_json("kinds", "pause", "moto", "--reason", "acquirer maintenance", "--by", "ops")
    assert paused["paused"] and paused["pause"]["by"] == "cli:ops"
    assert "moto" in {view["kind"] for view in run_json("kinds", "ls") if view["paused"]}
    typo = invoke("kinds", "pause", "mtoo", "--reason", "x")
    assert typo.exit_code == 2 and "did you mean `moto`" in typo.output
    assert run_json("kinds", "resume", "moto")["released"] == 0
    refused = invoke("kinds", "resume", "moto")
    assert refused.exit_code == 1 and "not paused" in refused.output
    assert [entry["action"] for entry in run_json("kinds", "log")][:2] == ["resume", "pause"]
    paused_again = invoke("kinds", "pause", "moto", "--reason", "window")
    assert paused_again.exit_code == 0 and "paused moto (by cli:" in paused_again.stdout
    table = invoke("kinds", "ls")
    assert table.exit_code == 0 and any(line.split()[:2] == ["moto", "paused"] for line in table.stdout.splitlines())
    log = invoke("kinds", "log")
    assert log.exit_code == 0 and "window" in log.stdout
    resumed = invoke("kinds", "resume", "moto")
    assert resumed.exit_code == 0 and "resumed moto: 0 flow(s) released" in resumed.stdout


def test_a_human_dry_run_and_a_question_before_acting(engine_side: Runtime) -> None:
    ids = make_flows(engine_side, 3, FlowState.WAITING)
    look = invoke("bulk", "cancel", "--kind", "mit", "--state", "waiting", "--dry-run")
    assert look.exit_code == 0 and "cancel: 3 flow(s) match; 0 would be skipped" in look.stdout
    assert "at stake (the 3 flow(s) it would act on): 21.00 EUR" in look.stdout, look.stdout
    assert look.stdout.count("7.00 EUR") == 3, "each listed flow's amount"
    declined = invoke("bulk", "cancel", "--kind", "mit", "--state", "waiting", stdin="n\n")
    assert declined.exit_code != 0 and "cancel 3 flow(s)?" in declined.stdout
    assert all(flow.state is FlowState.WAITING for flow in engine_side.engine.store.many(ids)), "nothing done"
    wrong = invoke("bulk", "cancel", "--kind", "mtoo", "--dry-run")
    assert wrong.exit_code == 2 and "did you mean `moto`" in wrong.output
    token = invoke("bulk", "cancel", "--kind", "mit", "--yes", "--plan", "not-a-plan")
    assert token.exit_code == 2 and "--plan" in token.output and "32 hex digits" in token.output


def test_a_plan_confirmed_for_another_filter_or_action_is_refused(worker: Runtime) -> None:
    """``--plan`` names its dry run's action and filter: confirmed with another filter or action it is
    refused (exit 1, nothing posted; before, a plan for another filter was a new action on what that filter
    matched); with its own, the dry run is shown as it was made and the action is on the flows it listed,
    not on one that came to match after it."""
    ids = make_flows(worker, 2, FlowState.WAITING)
    plan = run_json("bulk", "cancel", "--kind", "mit", "--state", "waiting", "--since", "1h", "--dry-run")
    assert plan["totals"] == {"EUR": 1400} and plan["asked"] == {"kind": "mit", "state": "waiting", "since": "1h"}
    wider = invoke("bulk", "cancel", "--kind", "mit", "--yes", "--plan", plan["plan"])
    assert wider.exit_code == 1, wider.output
    assert "was made for cancel of kind=mit, state=waiting, since=1h, not for cancel of kind=mit" in wider.output
    other = invoke("bulk", "retry", "--kind", "mit", "--state", "waiting", "--since", "1h", "--yes", "--plan", plan["plan"])
    assert other.exit_code == 1 and "not for retry of" in other.output
    assert worker.bulk is not None
    bulk = worker.bulk
    assert bulk.list() == [], "nothing posted"
    [later] = make_flows(worker, 1, FlowState.WAITING)  # after the dry run: not in it
    args = ("bulk", "cancel", "--kind", "mit", "--state", "waiting", "--since", "1h", "--plan", plan["plan"])
    shown = invoke(*args, stdin="y\n")
    assert shown.exit_code == 0, shown.output
    assert "cancel: 2 flow(s) match" in shown.stdout and f"plan {plan['plan']}" in shown.stdout, "the dry run as it was made"
    [posted] = bulk.list()
    wait_until(lambda: bulk.get(posted["id"])["status"] == "done", 60, "the bulk cancel")
    assert (bulk.get(posted["id"])["total"], bulk.get(posted["id"])["done"]) == (2, 2)
    assert [flow.state for flow in worker.engine.store.many([*ids, later])] == [
        FlowState.CANCELLED,
        FlowState.CANCELLED,
        FlowState.WAITING,
    ]
