"""A step of the merchant's own code (``durapay.flows.step``, ``workflows.steps.MerchantStep``) on the real
engine and a real Valkey: its output recorded once, retried with backoff, final errors ending the flow."""

from __future__ import annotations

from typing import Any

from durapay.flows import Final, Flow, Retry, StepInput, step
from durapay.tasks.runner import run_step
from durapay.workflows.clock import ManualClock
from durapay.workflows.engine import Claim
from durapay.workflows.states import FlowState
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary


class Fraud:
    """A merchant's function that records every call, and answers as scripted (an exception or not)."""

    def __init__(self, *raises: BaseException) -> None:
        self.raises = list(raises)
        self.calls: list[StepInput] = []

    def __call__(self, given: StepInput) -> dict[str, Any]:
        self.calls.append(given)
        if self.raises:
            raise self.raises.pop(0)
        return {"score": given.input.amount % 7, "key": given.idempotency_key}


def shop(fn: Fraud, **options: Any) -> Flow:
    return Flow("demo", DemoInput, (step(fn, name="fraud", **options), ScriptedStep("charge")), summary)


def test_its_output_is_recorded_once_and_never_run_again(make_engine: Any) -> None:
    fraud = Fraud()
    engine, _ = make_engine(shop(fraud))
    record = engine.start("demo", {"amount": 9})
    assert engine.run_step(record.id, "fraud") == "ready"
    assert engine.run_step(record.id, "fraud") == "not-current", "a delivery again of a step done does nothing"
    assert engine.run_step(record.id, "charge") == "succeeded"
    done = engine.get(record.id)
    assert done.outputs["fraud"] == {"score": 2, "key": f"{record.id}.fraud"}
    assert len(fraud.calls) == 1
    assert fraud.calls[0].outputs == {} and fraud.calls[0].input.amount == 9


def test_a_worker_lost_after_the_function_returned_replays_the_output(make_engine: Any, clock: ManualClock) -> None:
    fraud = Fraud()
    engine, _ = make_engine(shop(fraud))
    record = engine.start("demo", {"amount": 9})
    claim = engine.claim(record.id, "fraud", worker="lost")
    assert isinstance(claim, Claim)
    run_step(claim.step, claim.ctx, must_reconcile=False, resend=False)  # returned; the worker dies here
    assert len(fraud.calls) == 1
    clock.advance(31)  # past the lost worker's lease
    engine.dispatch_due()
    assert engine.run_step(record.id, "fraud", worker="next") == "ready"
    assert len(fraud.calls) == 1, "the output kept was recorded, the function not called again"
    assert engine.get(record.id).outputs["fraud"] == {"score": 2, "key": f"{record.id}.fraud"}


def test_retryable_errors_are_retried_with_backoff_under_one_key(make_engine: Any, clock: ManualClock) -> None:
    fraud = Fraud(Retry("risk service 503"), TimeoutError("read timed out"))
    fraud.raises[1].retryable = True  # type: ignore[attr-defined]  # the merchant's own exception, marked
    engine, _ = make_engine(shop(fraud))
    record = engine.start("demo", {"amount": 9})
    assert engine.run_step(record.id, "fraud") == "retrying"
    waiting = engine.get(record.id)
    assert waiting.error is not None and waiting.error["type"] == "StepRetry" and waiting.error["retryable"]
    assert waiting.due is not None and waiting.due >= clock.now()
    clock.advance(waiting.due - clock.now() + 0.01)
    assert engine.run_step(record.id, "fraud", worker="other") == "retrying"
    clock.advance(20)
    assert engine.run_step(record.id, "fraud") == "ready"
    assert [given.attempt for given in fraud.calls] == [1, 2, 3]
    assert {given.idempotency_key for given in fraud.calls} == {f"{record.id}.fraud"}


def test_retryable_errors_past_the_bound_end_the_flow_failed(make_engine: Any, clock: ManualClock) -> None:
    fraud = Fraud(*(Retry(f"down {n}") for n in range(5)))
    engine, _ = make_engine(shop(fraud, retry=2))
    record = engine.start("demo", {"amount": 9})
    assert engine.run_step(record.id, "fraud") == "retrying"
    clock.advance(20)
    assert engine.run_step(record.id, "fraud") == "failed"
    failed = engine.get(record.id)
    assert "fraud failed 2 times: down 1" in str(failed.outcome) + str(failed.error)
    assert len(fraud.calls) == 2


def test_a_final_error_ends_the_flow_with_its_reason(make_engine: Any) -> None:
    fraud = Fraud(Final("score 97: refused by the risk rules"))
    engine, _ = make_engine(shop(fraud))
    record = engine.start("demo", {"amount": 9})
    assert engine.run_step(record.id, "fraud") == "failed"
    failed = engine.get(record.id)
    assert failed.state is FlowState.FAILED
    assert failed.error is not None and failed.error["message"] == "score 97: refused by the risk rules"
    assert any("refused by the risk rules" in str(entry) for entry in engine.history(record.id))
    assert "charge" not in failed.outputs


def test_an_exception_that_says_neither_stops_for_a_person(make_engine: Any) -> None:
    engine, _ = make_engine(shop(Fraud(KeyError("score"))))
    record = engine.start("demo", {"amount": 9})
    assert engine.run_step(record.id, "fraud") == "needs_attention"
