"""A reclaim records when the lost worker may have sent its call, whatever the claim's verdict (issue 36,
finding 6): ``claim.lua`` writes ``maybe_sent`` (the end of the lost lease) before it judges the claim, so
a flow stopped for a person by the loop bound (``looping``) or by its attempts (``lost``) right at a
reclaim tells a cancel's read when the late window starts; with nothing written, the read counted from
the attempt before and believed "nothing moved" a lease too early."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.workflows.engine import Claim
from durapay.workflows.engine.clock import ManualClock
from tests.workflows.engine_support import T0, ScriptedStep, flow

LEASE = 30.0  # tests/workflows/conftest.py's lease_seconds


@pytest.mark.parametrize("verdict", ["looping", "lost"])
def test_a_reclaim_that_stops_the_flow_records_when_the_lost_call_may_have_been_sent(
    make_engine: Any, clock: ManualClock, verdict: str
) -> None:
    step = ScriptedStep("pay")
    engine, _ = make_engine(flow(step), engine={"max_step_runs": 10})  # max_attempts = 3
    record = engine.start("demo", {"amount": 5})
    assert isinstance(engine.claim(record.id, "pay", worker="doomed"), Claim)  # then the worker dies
    if verdict == "looping":
        engine.redis.hset(engine.keys.flow(record.id), "runs", "10")  # the step claimed 10 times without moving on
    else:
        engine.redis.hset(engine.keys.flow(record.id), "attempt", "3")  # its last attempt
    clock.advance(LEASE + 1)
    assert engine.run_step(record.id, "pay", worker="next") == "needs_attention"
    stopped = engine.get(record.id)
    assert stopped.error is not None and stopped.error["type"] == ("TooManyRuns" if verdict == "looping" else "WorkerLost")
    assert stopped.maybe_sent == pytest.approx(T0 + LEASE, abs=0.01), "the lost worker may have sent up to its lease's end"
    assert step.runs == [], "nothing run once more"
    engine.cancel(record.id)  # the merchant cancels the stopped flow: its read counts the late window from there
    assert engine.run_step(record.id, "pay", worker="next") == "retrying"
    waiting = engine.get(record.id)
    assert waiting.due == pytest.approx(T0 + LEASE + engine.retry_policy.late_seconds, abs=0.01) and waiting.cancel_requested
    clock.advance(waiting.due - clock.now())
    assert engine.run_step(record.id, "pay", worker="next") == "cancelled"
    assert step.runs == [] and step.reconciled != [], "read back, never called again"
