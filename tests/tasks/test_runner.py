"""The step runner without Celery or Redis: reconcile-first, the idempotency key, errors to outcomes."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from durapay.gateway import BadRequest, Catalogue, ErrorDetail, GatewayOperation, GatewayTimeout, GatewayUnreachable, ServerError
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome, Retry
from durapay.tasks.retry import RetryPolicy
from durapay.tasks.runner import NOT_COMMITTED, UNCLEAR, ReconcileResult, StepContext, run_step


class Client:
    """Records calls; raises the errors it is given, in order, then answers {}."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.keys: list[str | None] = []

    def call(self, op: GatewayOperation[Any], *path: str, request: Any = None, idempotency_key: str | None = None) -> Any:
        self.keys.append(idempotency_key)
        if self.errors:
            raise self.errors.pop(0)
        return None  # the steps here ignore the answer


@dataclass
class Step:
    name: str = "pay"
    operation: GatewayOperation[Any] | None = Catalogue.create_moto_order
    found: list[ReconcileResult] = field(default_factory=list)
    executed: int = 0

    def execute(self, ctx: StepContext) -> Outcome:
        self.executed += 1
        assert self.operation is not None
        ctx.call(self.operation, request={})
        return Advance({"paid": True})

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        return self.found.pop(0) if self.found else NOT_COMMITTED


def context(client: Client, attempt: int = 1) -> StepContext:
    policy = RetryPolicy(base_seconds=1, cap_seconds=10, max_attempts=4, reconcile_attempts=3, rng=random.Random(5))
    return StepContext(
        flow_id="f1",
        kind="demo",
        step="pay",
        input=None,
        outputs={},
        attempt=attempt,
        now=0.0,
        idempotency_key="f1.pay",
        order_id="ord-1",
        client=client,  # type: ignore[arg-type]
        retry=policy,
    )


def test_a_success_advances_and_sends_the_key_only_where_the_operation_takes_one() -> None:
    client = Client()
    assert run_step(Step(), context(client), must_reconcile=False, resend=False) == Advance({"paid": True})
    assert client.keys == [None], "MOTO takes no Idempotency-Key"
    keyed = Client()
    run_step(Step(operation=Catalogue.create_mit_order), context(keyed), must_reconcile=False, resend=False)
    assert keyed.keys == ["f1.pay"]


def test_a_retryable_error_becomes_a_retry_with_a_delay() -> None:
    outcome = run_step(Step(), context(Client(ServerError("503", status_code=503))), must_reconcile=False, resend=False)
    assert isinstance(outcome, Retry) and 0 <= outcome.after <= 1 and outcome.reconcile
    assert outcome.error["type"] == "ServerError"


def test_reconcile_first_adopts_what_the_gateway_did_without_calling_again() -> None:
    step = Step(found=[Advance({"adopted": True})])
    client = Client()
    assert run_step(step, context(client), must_reconcile=True, resend=True) == Advance({"adopted": True})
    assert step.executed == 0 and client.keys == []


def test_reconcile_that_finds_nothing_calls_again() -> None:
    step = Step(found=[NOT_COMMITTED])
    assert run_step(step, context(Client()), must_reconcile=True, resend=True) == Advance({"paid": True})
    assert step.executed == 1


def test_reconcile_that_cannot_tell_reads_again_then_needs_a_person() -> None:
    early = run_step(Step(found=[UNCLEAR]), context(Client(), attempt=1), must_reconcile=True, resend=True)
    assert isinstance(early, Retry) and early.reconcile
    late = run_step(Step(found=[UNCLEAR]), context(Client(), attempt=3), must_reconcile=True, resend=True)
    assert isinstance(late, Attention)


def test_a_retry_safe_operation_skips_the_reconcile_read() -> None:
    step = Step(operation=Catalogue.modify_paybylink_v3, found=[Advance({"adopted": True})])
    assert run_step(step, context(Client()), must_reconcile=True, resend=True) == Advance({"paid": True})


def test_a_defect_in_a_step_stops_for_a_person_instead_of_raising() -> None:
    class Broken(Step):
        def execute(self, ctx: StepContext) -> Outcome:
            ctx.call(Catalogue.create_moto_order, request={})
            raise KeyError("operationId")

    outcome = run_step(Broken(), context(Client()), must_reconcile=False, resend=False)
    assert isinstance(outcome, Attention) and outcome.error is not None
    assert outcome.error["type"] == "KeyError" and outcome.error["calls"] == ["create_moto_order"]


def test_a_timeout_after_sending_is_flagged_for_reconciliation() -> None:
    outcome = run_step(Step(), context(Client(GatewayTimeout("read", sent=True))), must_reconcile=False, resend=False)
    assert isinstance(outcome, Retry) and outcome.reconcile and outcome.error["ambiguous"] is True


@pytest.mark.parametrize(
    "answer",
    [Finish(True, "paid", output={"operationId": "op-1"}), Finish(False, "declined", error={"type": "PaymentDeclined"})],
    ids=["succeeded", "declined"],
)
def test_a_step_that_finishes_the_flow_is_passed_through(answer: Finish) -> None:
    class Ending(Step):
        def execute(self, ctx: StepContext) -> Outcome:
            ctx.call(Catalogue.create_moto_order, request={})
            return answer

    assert run_step(Ending(), context(Client()), must_reconcile=False, resend=False) == answer


def test_an_error_that_sent_nothing_retries_within_the_first_ceiling_without_reconciling() -> None:
    outcome = run_step(Step(), context(Client(GatewayUnreachable("refused"))), must_reconcile=False, resend=False)
    assert isinstance(outcome, Retry) and not outcome.reconcile
    assert 0 <= outcome.after <= 1, "base 1 s: the first retry waits at most 1 s"
    assert outcome.error["type"] == "GatewayUnreachable"


def test_later_attempts_wait_longer_at_most_and_the_last_one_ends_the_step() -> None:
    third = run_step(Step(), context(Client(GatewayUnreachable("refused")), attempt=3), must_reconcile=False, resend=False)
    assert isinstance(third, Retry) and 0 <= third.after <= 4, "base 1 s, third try: at most 4 s"
    last = run_step(Step(), context(Client(GatewayUnreachable("refused")), attempt=4), must_reconcile=False, resend=False)
    assert isinstance(last, Finish) and not last.succeeded, "max_attempts 4: nothing was sent, so it failed"


def test_a_step_not_marked_for_reconciliation_calls_without_reading_first() -> None:
    step = Step(found=[Advance({"adopted": True})])
    assert run_step(step, context(Client()), must_reconcile=False, resend=False) == Advance({"paid": True})
    assert step.executed == 1 and step.found == [Advance({"adopted": True})], "reconcile was not called"


def test_a_reconcile_read_that_fails_at_the_gateway_reads_again_later() -> None:
    class Unreadable(Step):
        def reconcile(self, ctx: StepContext) -> Any:
            raise GatewayTimeout("read", sent=True, operation="get_order")

    step = Unreadable()
    outcome = run_step(step, context(Client()), must_reconcile=True, resend=True)
    assert isinstance(outcome, Retry) and outcome.reconcile, "still unknown: read before paying again"
    assert step.executed == 0, "never pay again without knowing"


def test_a_defect_in_the_reconcile_read_stops_for_a_person() -> None:
    class Broken(Step):
        def reconcile(self, ctx: StepContext) -> Any:
            raise TypeError("bad answer")

    step = Broken()
    outcome = run_step(step, context(Client()), must_reconcile=True, resend=True)
    assert isinstance(outcome, Attention) and outcome.error is not None and outcome.error["type"] == "TypeError"
    assert step.executed == 0


def test_an_error_is_judged_by_the_operation_that_failed_not_the_steps_own() -> None:
    """A step that reads before it pays: a 5xx on the read (retry safe) needs no reconcile of the payment."""
    failed_read = ServerError("503", status_code=503, operation=Catalogue.get_order.name)
    outcome = run_step(Step(), context(Client(failed_read)), must_reconcile=False, resend=False)
    assert isinstance(outcome, Retry) and not outcome.reconcile
    failed_pay = ServerError("503", status_code=503, operation=Catalogue.create_moto_order.name)
    outcome = run_step(Step(), context(Client(failed_pay)), must_reconcile=False, resend=False)
    assert isinstance(outcome, Retry) and outcome.reconcile


def duplicate(description: str) -> BadRequest:
    return BadRequest("400", status_code=400, errors=[ErrorDetail("PS0026", description)], operation="create_moto_order")


@pytest.mark.parametrize(
    "description",
    ["Invalid order.orderId parameter: orderId already used", "Invalid operationId parameter: operation already completed"],
)
def test_an_already_done_answer_reads_the_gateway_and_adopts_even_on_a_first_try(description: str) -> None:
    """A duplicate answer means an earlier request (maybe one whose record Redis lost) reached the gateway."""
    adopted = Advance({"operation": {"operationId": "op-1"}})
    step = Step(found=[adopted])
    outcome = run_step(step, context(Client(duplicate(description))), must_reconcile=False, resend=False)
    assert outcome == adopted and step.executed == 1


def test_an_already_done_answer_the_gateway_cannot_show_yet_is_read_again_then_needs_a_person() -> None:
    outcome = run_step(Step(), context(Client(duplicate("orderId already used"))), must_reconcile=False, resend=False)
    assert isinstance(outcome, Retry) and outcome.reconcile
    last = run_step(Step(), context(Client(duplicate("orderId already used")), attempt=3), must_reconcile=False, resend=False)
    assert isinstance(last, Attention)


def test_a_plain_refusal_still_fails_the_flow() -> None:
    refused = BadRequest("400", status_code=400, errors=[ErrorDetail("PS0026", "Invalid order.amount parameter")])
    outcome = run_step(Step(), context(Client(refused)), must_reconcile=False, resend=False)
    assert isinstance(outcome, Finish) and not outcome.succeeded


def test_an_error_that_names_no_known_operation_is_bounded_and_reads_back_first() -> None:
    """Whether the failed call was safe to repeat is unknown: it is treated as not safe, and the
    retries end with a person instead of looping."""
    lost = ServerError("502", status_code=502, operation="not_a_catalogue_operation")
    first = run_step(Local(lost), context(Client()), must_reconcile=False, resend=False)
    assert isinstance(first, Retry) and first.reconcile
    last = run_step(Local(lost), context(Client(), attempt=4), must_reconcile=False, resend=False)
    assert isinstance(last, Attention)


@dataclass
class Local:
    """A step that calls no catalogue operation of its own and fails with an error naming none."""

    error: Exception
    name: str = "wait"
    operation: GatewayOperation[Any] | None = None

    def execute(self, ctx: StepContext) -> Outcome:
        raise self.error

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        return NOT_COMMITTED
