"""Endpoint health: when an endpoint's failing streak starts and ends (the rule: ``endpoints``' docstring).

Issue 23, item 4: the streak was ended only by a successful delivery, so an endpoint re-enabled, or
passing a test, or quiet after its deliveries were given up, was disabled by its next single failure
as if it had been failing all along. A real receiver over HTTP; the clock is manual, delivery inline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench._webhook_receiver import WebhookReceiver
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.webhooks import SCHEDULE, Webhooks
from tests.workflows.webhooks.test_delivery import finish, tick

HOUR = 3600.0
DAY = 86400.0


def statuses(*first: int) -> Callable[[dict[str, Any]], tuple[int, dict[str, str]]]:
    """A receiver's answers: ``first`` in turn, then 200 for good (a transient failure, then fixed)."""
    queue = iter(first)
    return lambda body: (next(queue, 200), {})


def hourly(webhooks: Webhooks, clock: ManualClock, hours: int, until: Callable[[], bool] = lambda: False) -> None:
    """Tick once an hour of the manual clock, for ``hours`` hours or until ``until()`` holds."""
    for _ in range(hours):
        if until():
            return
        tick(webhooks)
        clock.advance(HOUR)


def enabled(webhooks: Webhooks, endpoint_id: str) -> bool:
    held = webhooks.endpoints.get(endpoint_id)
    assert held is not None
    return held.enabled


def reason(webhooks: Webhooks, endpoint_id: str) -> str:
    held = webhooks.endpoints.get(endpoint_id)
    assert held is not None
    return held.disabled_reason


def latest(webhooks: Webhooks, endpoint_id: str) -> str:
    """The outcome of the endpoint's latest attempt (delivery or test); empty before the first."""
    attempts = webhooks.attempts(endpoint_id, limit=1)
    return str(attempts[0]["outcome"]) if attempts else ""


def test_an_operators_enable_ends_the_failing_streak(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    """Disabled after two days of failures, fixed, enabled: its next single 503 is a new streak's first
    failure (retried), not the old streak's (disabled at once, "failing for 2.0 days")."""
    engine, webhooks = hooks(disable_after_days=2.0)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = lambda body: (503, {})
    finish(engine, 1)
    hourly(webhooks, clock, 72, until=lambda: not enabled(webhooks, endpoint.id))
    assert "failing for 2" in reason(webhooks, endpoint.id)
    receiver.answer = statuses(503)  # fixed; one transient failure to come
    webhooks.endpoints.enable(endpoint.id)
    finish(engine, 1)
    tick(webhooks)
    assert enabled(webhooks, endpoint.id), reason(webhooks, endpoint.id)
    assert latest(webhooks, endpoint.id) == "retry"
    clock.advance(SCHEDULE[1] * 1.25)
    tick(webhooks)
    assert latest(webhooks, endpoint.id) == "delivered" and enabled(webhooks, endpoint.id)


def test_a_successful_test_delivery_ends_the_failing_streak(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    """Failing for 47 hours (disabled at 48), then fixed and tested: a short outage after the test does
    not reach back to the failures before it. The delivery still pending retries through it (its
    retries come at most 12 hours apart, so one of them fails past the 48th hour) and the endpoint
    stays enabled."""
    engine, webhooks = hooks(disable_after_days=2.0)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    start = clock.now()
    failed_at: list[float] = []

    def outage(body: dict[str, Any]) -> tuple[int, dict[str, str]]:
        failed_at.append(clock.now())
        return 503, {}

    receiver.answer = outage
    finish(engine, 1)
    hourly(webhooks, clock, 47)
    assert enabled(webhooks, endpoint.id) and webhooks.pending() == 1
    receiver.answer = lambda body: (200, {})
    tested = webhooks.test(endpoint.id)
    assert tested is not None and tested["ok"]
    receiver.answer = outage  # a short outage right after
    hourly(webhooks, clock, 14)
    assert any(moment - start >= 2 * DAY for moment in failed_at)  # a failure past two days since the first
    assert enabled(webhooks, endpoint.id), reason(webhooks, endpoint.id)
    assert latest(webhooks, endpoint.id) == "retry"
    receiver.answer = lambda body: (200, {})
    hourly(webhooks, clock, 13, until=lambda: webhooks.pending() == 0)
    assert webhooks.pending() == 0 and latest(webhooks, endpoint.id) == "delivered"


def test_a_streak_lapses_once_its_deliveries_are_given_up(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    """Down until its only delivery was given up (a day), then back and quiet for two days: its first
    failure after is a new streak's (retried), not the end of a three-day one (disabled for good)."""
    engine, webhooks = hooks(retry_days=1.0, disable_after_days=2.0)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = lambda body: (503, {})
    finish(engine, 1)
    hourly(webhooks, clock, 40, until=lambda: latest(webhooks, endpoint.id) == "given up")
    assert latest(webhooks, endpoint.id) == "given up" and webhooks.pending() == 0 and enabled(webhooks, endpoint.id)
    clock.advance(2 * DAY)  # back, and nothing to send for two days
    receiver.answer = statuses(503)
    finish(engine, 1)
    tick(webhooks)
    assert enabled(webhooks, endpoint.id), reason(webhooks, endpoint.id)
    assert latest(webhooks, endpoint.id) == "retry"
    clock.advance(SCHEDULE[1] * 1.25)
    tick(webhooks)
    assert latest(webhooks, endpoint.id) == "delivered"


def test_a_failed_test_neither_starts_nor_prolongs_a_streak(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    """An operator's failing probes do not bring an endpoint nearer to being disabled: tests failing for
    three days, then one failed delivery, is a streak of one failure (retried)."""
    engine, webhooks = hooks(disable_after_days=2.0)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = lambda body: (503, {})
    for _ in range(4):
        tested = webhooks.test(endpoint.id)
        assert tested is not None and tested["outcome"] == "test failed"
        clock.advance(DAY)
    finish(engine, 1)
    tick(webhooks)
    assert enabled(webhooks, endpoint.id) and latest(webhooks, endpoint.id) == "retry"
