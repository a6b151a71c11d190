"""The technical retry policy: full-jitter backoff, and what each gateway error means for a step."""

from __future__ import annotations

import random

import pytest

from durapay.config.settings import RetrySettings
from durapay.gateway import (
    BadRequest,
    Catalogue,
    ConnectionDropped,
    GatewayTimeout,
    GatewayUnreachable,
    NotFound,
    RateLimited,
    RequestInvalid,
    ServerError,
    Unauthorized,
)
from durapay.gateway._errors import InvalidResponse, UnexpectedStatus
from durapay.tasks.outcomes import Attention, Finish, Retry
from durapay.tasks.retry import RetryPolicy

PAY = Catalogue.create_moto_order  # not retry safe: no idempotency key at the gateway
KEYED = Catalogue.create_mit_order  # takes an Idempotency-Key, but the gateway may have forgotten it
READ = Catalogue.get_order


def policy(**values: float) -> RetryPolicy:
    return RetryPolicy(
        base_seconds=values.get("base", 1.0),
        cap_seconds=values.get("cap", 60.0),
        max_attempts=int(values.get("attempts", 5)),
        reconcile_attempts=int(values.get("reconcile", 3)),
        rng=random.Random(1234),
    )


def test_delays_stay_within_the_exponential_ceiling_and_the_cap() -> None:
    backoff = policy(base=0.5, cap=30)
    for attempt in range(1, 15):
        ceiling = min(30.0, 0.5 * 2 ** (attempt - 1))
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(0.0 <= delay <= ceiling for delay in delays), attempt
    assert max(backoff.delay(40) for _ in range(200)) <= 30.0, "the cap holds however many attempts"


def test_the_first_retry_waits_at_most_base_and_each_attempt_doubles_the_ceiling() -> None:
    backoff = policy(base=2, cap=1000)
    for attempt, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0)]:
        delays = [backoff.delay(attempt) for _ in range(500)]
        assert max(delays) <= ceiling, attempt
        assert max(delays) > ceiling * 0.9, f"attempt {attempt} reaches up to {ceiling}, not a smaller ceiling"


def test_the_cap_holds_at_any_attempt_number() -> None:
    backoff = policy(base=1.0, cap=30.0)  # floats, as RetrySettings gives them
    assert 0.0 <= backoff.delay(1025) <= 30.0
    assert 0.0 <= backoff.delay(10_000) <= 30.0


def test_full_jitter_spreads_the_delays_over_the_whole_range() -> None:
    backoff = policy(base=1, cap=60)
    delays = [backoff.delay(6) for _ in range(1000)]  # ceiling 32 s
    assert len({round(delay, 6) for delay in delays}) > 900, "not one fixed delay: retries do not stampede"
    assert min(delays) < 32 * 0.1 and max(delays) > 32 * 0.9, "from near zero to near the ceiling"


def test_the_same_seed_gives_the_same_delays() -> None:
    assert [policy().delay(n) for n in range(1, 8)] == [policy().delay(n) for n in range(1, 8)]


def test_a_retry_after_hint_is_a_floor() -> None:
    backoff = policy(base=0.01, cap=0.01)
    outcome = backoff.on_error(RateLimited("429", retry_after=7.0), PAY, 1, resend=False)
    assert isinstance(outcome, Retry) and outcome.after == 7.0 and not outcome.reconcile


@pytest.mark.parametrize(
    "error",
    [GatewayUnreachable("refused"), GatewayTimeout("connect", sent=False), RateLimited("429")],
    ids=["unreachable", "timeout-before-sending", "429"],
)
def test_errors_that_never_reached_the_gateway_retry_without_reading_it(error: Exception) -> None:
    outcome = policy().on_error(error, PAY, 1, resend=False)  # type: ignore[arg-type]
    assert isinstance(outcome, Retry) and not outcome.reconcile


@pytest.mark.parametrize(
    "error",
    [GatewayTimeout("read", sent=True), ConnectionDropped("reset"), ServerError("502", status_code=502), InvalidResponse("x")],
    ids=["timeout-after-sending", "dropped", "5xx", "bad-body"],
)
def test_ambiguous_errors_reconcile_first_unless_a_resend_is_safe(error: Exception) -> None:
    unsafe = policy().on_error(error, PAY, 1, resend=False)  # type: ignore[arg-type]
    assert isinstance(unsafe, Retry) and unsafe.reconcile, "read the gateway before paying again"
    keyed = policy().on_error(error, KEYED, 1, resend=False)  # type: ignore[arg-type]
    assert isinstance(keyed, Retry) and keyed.reconcile, "a keyed money call is read back first too (issue 23, item 10)"
    safe = policy().on_error(error, Catalogue.modify_paybylink_v3, 1, resend=False)  # type: ignore[arg-type]
    assert isinstance(safe, Retry) and not safe.reconcile, "a resend that cannot make a second effect"


def test_exhausted_retries_fail_only_when_nothing_can_have_happened() -> None:
    backoff = policy(attempts=3)
    lost = backoff.on_error(GatewayUnreachable("refused"), PAY, 3, resend=False)
    assert isinstance(lost, Finish) and not lost.succeeded and lost.error is not None
    assert lost.error["type"] == "GatewayUnreachable"
    unknown = backoff.on_error(GatewayTimeout("read", sent=True), PAY, 3, resend=False)
    assert isinstance(unknown, Attention), "a timeout is not a failure: a person decides"


@pytest.mark.parametrize(
    ("error", "op", "last"),
    [
        (GatewayUnreachable("refused"), PAY, Finish),
        (RateLimited("429", retry_after=0.5), PAY, Finish),
        (ServerError("503", status_code=503), PAY, Attention),
        (ServerError("503", status_code=503), KEYED, Attention),
        (ConnectionDropped("reset"), READ, Attention),
    ],
    ids=["unreachable", "429", "5xx", "5xx-keyed", "dropped-read"],
)
def test_every_try_before_the_last_retries_and_the_last_ends_the_step(error: Exception, op: object, last: type) -> None:
    backoff = policy(attempts=4)
    for attempt in range(1, 4):
        outcome = backoff.on_error(error, op, attempt, resend=False)  # type: ignore[arg-type]
        assert isinstance(outcome, Retry), attempt
        assert outcome.after >= 0 and outcome.error["type"] == type(error).__name__
    final = backoff.on_error(error, op, 4, resend=False)  # type: ignore[arg-type]
    assert isinstance(final, last) and isinstance(final, Finish | Attention), "ambiguous: a person decides; nothing sent: failed"
    assert final.error is not None and final.error["type"] == type(error).__name__, "the last error is kept"
    if isinstance(final, Finish):
        assert not final.succeeded and "failed 4 times" in final.reason


def test_a_timeout_after_sending_asks_to_reconcile_with_the_error_marked_ambiguous() -> None:
    outcome = policy().on_error(GatewayTimeout("read timed out", sent=True), PAY, 1, resend=False)
    assert isinstance(outcome, Retry) and outcome.reconcile
    assert (outcome.error["type"], outcome.error["ambiguous"], outcome.error["retryable"]) == ("GatewayTimeout", True, True)


def test_settings_give_the_policy_its_numbers_and_a_seeded_rng_its_delays() -> None:
    settings = RetrySettings(base_seconds=0.25, cap_seconds=4.0, max_attempts=3, reconcile_attempts=2)
    made = RetryPolicy.from_settings(settings, random.Random(99))
    assert (made.base_seconds, made.cap_seconds, made.max_attempts, made.reconcile_attempts) == (0.25, 4.0, 3, 2)
    again = RetryPolicy.from_settings(settings, random.Random(99))
    assert [made.delay(n) for n in range(1, 6)] == [again.delay(n) for n in range(1, 6)]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (BadRequest("400", status_code=400), Finish),
        (NotFound("404", status_code=404), Finish),
        (Unauthorized("401", status_code=401), Attention),
        (RequestInvalid("bad", field="order.amount", reason="must be positive"), Finish),
    ],
    ids=["400", "404", "401", "refused-before-sending"],
)
def test_final_errors_are_not_retried(error: Exception, expected: type) -> None:
    outcome = policy().on_error(error, PAY, 1, resend=False)  # type: ignore[arg-type]
    assert isinstance(outcome, expected) and isinstance(outcome, Finish | Attention)
    assert outcome.error is not None and outcome.error["type"] == type(error).__name__, "the error is kept"


def test_a_request_refused_before_sending_names_the_field() -> None:
    outcome = policy().on_error(RequestInvalid("bad", field="order.amount", reason="must be positive"), PAY, 1, resend=False)
    assert isinstance(outcome, Finish) and "order.amount: must be positive" in outcome.reason


def test_a_400_after_an_ambiguous_try_may_mean_already_done_so_it_reconciles() -> None:
    backoff = policy(reconcile=3)
    again = backoff.on_error(BadRequest("orderId exists", status_code=400), PAY, 1, resend=True)
    assert isinstance(again, Retry) and again.reconcile
    stuck = backoff.on_error(BadRequest("orderId exists", status_code=400), PAY, 3, resend=True)
    assert isinstance(stuck, Attention)


def test_an_unexpected_status_is_read_back_never_taken_for_a_failure() -> None:
    backoff = policy(reconcile=3)
    odd = UnexpectedStatus("HTTP 418", status_code=418)
    first = backoff.on_error(odd, PAY, 1, resend=False)
    assert isinstance(first, Retry) and first.reconcile, "the payment may have happened: read the gateway"
    assert isinstance(backoff.on_error(odd, PAY, 3, resend=False), Attention)
    assert isinstance(backoff.on_error(odd, READ, 1, resend=False), Attention), "a read that answers oddly: a person looks"
