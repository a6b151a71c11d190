"""A step of the merchant's own code (``durapay.flows.step``, ``workflows.engine.steps.MerchantStep``) on the real
engine and a real Valkey: its output recorded once, retried with backoff, final errors ending the flow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durapay.config import SettingsError, load_settings
from durapay.flows import DefinitionError, Final, Flow, Retry, StepInput, step
from durapay.tasks.runner import run_step
from durapay.workflows.engine import Claim
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
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


PAN = "4111111111111111"


def echo_card(given: StepInput) -> dict[str, Any]:
    """A merchant's risk step whose answer quotes the card (a risk service echoing what it was sent)."""
    return {"score": 1, "card": {"pan": PAN}, "note": f"checked card {PAN}"}


def test_a_finished_flow_keeps_no_card_number_of_a_merchant_steps_output(make_engine: Any) -> None:
    """The output lua/keep.lua keeps (``kept:<key>``) was never removed nor scrubbed (issue 38 money
    review, finding 5): now masked where it is made, and its kept copy goes with the completion.

    A merchant step's output is kept raw under ``kept:<idempotency key>`` before its completion; the
    completion writes ``out:<step>`` but leaves the kept copy, and the end of the flow scrubs only the
    change's own fields (``store._scrubbed_results``), not ``kept:*``. So a finished flow's record keeps a
    full card number for as long as the record lives. ``out:<step>`` too: written raw by a completion that
    does not end the flow (only its error is scrubbed then), never rewritten at the end. Durapay's own
    outputs are gateway answers; a merchant step's is anything its code returns (invariant, workflows/engine/sensitive.py: once
    the flow
    ends its record keeps only first six and last four digits)."""
    engine, _ = make_engine(Flow("demo", DemoInput, (step(echo_card, name="risk"), ScriptedStep("charge")), summary))
    record = engine.start("demo", {"amount": 3})
    assert engine.run_step(record.id, "risk") == "ready"
    assert engine.run_step(record.id, "charge") == "succeeded"
    assert engine.get(record.id).state is FlowState.SUCCEEDED
    raw = {key.decode(): value.decode() for key, value in engine.redis.hgetall(engine.keys.flow(record.id)).items()}
    holding = sorted(name for name, value in raw.items() if PAN in value)
    assert not holding, f"the finished flow's record keeps the full card number in {holding}"
    assert not [name for name in raw if name.startswith("kept:")], "the kept copy is gone with the completion"
    assert json.loads(raw["out:risk"])["card"] == {"pan": "411111******1111"}


def test_a_retry_reaching_the_loop_bound_is_refused_when_the_engine_is_built(make_engine: Any) -> None:
    """Each try is a claim of the step: a ``retry`` reaching ``max_step_runs`` would stop the flow for a
    person (looping) before its last try, where its definition says it fails; the engine refuses it, naming
    the flow, the step and both figures."""

    def flaky(_: StepInput) -> None:
        return None

    too_many = Flow("shop", DemoInput, (step(flaky, retry=20),), summary)
    with pytest.raises(
        DefinitionError, match=r"^flow 'shop', step 'flaky': retry=20 tries reaches DURAPAY_ENGINE__MAX_STEP_RUNS \(20\)"
    ):
        make_engine(too_many, engine={"max_step_runs": 20})
    engine, _ = make_engine(Flow("shop", DemoInput, (step(flaky, retry=19),), summary), engine={"max_step_runs": 20})
    assert "shop" in engine.registry


def test_the_engine_s_retry_bound_must_lie_below_the_loop_bound() -> None:
    with pytest.raises(SettingsError, match=r"retry.max_attempts \(10\) must be below engine.max_step_runs \(10\)"):
        load_settings({"retry": {"max_attempts": 10}, "engine": {"max_step_runs": 10}})
