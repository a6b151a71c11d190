"""The runner's side of the gateway gate (``StepContext.call`` with ``workflows.engine.gate.Gate`` on the session's
Valkey, injected time, a client that raises the errors it is given): what each verdict and each error
makes of the step's outcome."""

from __future__ import annotations

from typing import Any

import redis

from durapay.gateway import GatewayOperation, RateLimited, ServerError
from durapay.tasks.outcomes import Advance, Defer, Outcome, Retry
from durapay.tasks.runner import GATE_UNREACHABLE, UNAVAILABLE, run_step
from durapay.workflows.engine.gate import Gate
from tests.tasks.test_runner import Client, Step, context
from tests.workflows.engine.test_gate import Time, make_gate


def run(client: Client, gate: Gate, slot: float | None = None) -> Outcome:
    ctx = context(client)
    ctx.gate, ctx.slot = gate, slot
    return run_step(Step(), ctx, must_reconcile=False, resend=False)


def down() -> ServerError:
    return ServerError("create_moto_order: HTTP 503", status_code=503, operation="create_moto_order")


def test_the_failure_that_opens_the_breaker_and_the_calls_after_it_are_deferred(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    gate = make_gate(redis_client, key_prefix, Time(), failures=2)
    assert isinstance(run(Client(down()), gate), Retry)  # the first failure: the flow's own retry
    opened = run(Client(down()), gate)
    assert isinstance(opened, Defer) and opened.reason == UNAVAILABLE
    assert opened.reconcile  # a 5xx on a money call: it may have acted, read it back first
    client = Client()
    kept = run(client, gate)
    assert isinstance(kept, Defer) and not kept.reconcile and kept.error["type"] == "GatewayUnavailable"
    assert client.keys == []  # no call was sent


def test_a_429_is_an_answer_it_ends_a_run_of_failures(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, failures=2)
    assert isinstance(run(Client(down()), gate), Retry)
    limited = run(Client(RateLimited("HTTP 429", retry_after=2, status_code=429, operation="create_moto_order")), gate)
    assert isinstance(limited, Defer) and limited.slot is not None and limited.after >= 2.0
    assert gate.status().failures == 0
    time.t += 3.0  # past the hold every caller met
    assert isinstance(run(Client(down()), gate), Retry)  # one failure again, not the second in a row


def test_a_deferred_step_uses_its_reserved_slot(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, burst=1, rate_per_second=0.5, wait_seconds=0)
    assert isinstance(run(Client(), gate), Advance)
    later = run(Client(), gate)
    assert isinstance(later, Defer) and later.slot is not None and later.after == 2.0
    time.t += 2.0
    assert isinstance(run(Client(), gate, slot=later.slot), Advance)


class PausingClient(Client):
    """Pauses Redis's writes while the call is at the gateway: the answer comes, the gate cannot be told."""

    def __init__(self, admin: redis.Redis) -> None:
        super().__init__()
        self.admin = admin

    def call(self, op: GatewayOperation[Any], *path: str, request: Any = None, idempotency_key: str | None = None) -> Any:
        self.admin.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
        return super().call(op, *path, request=request, idempotency_key=idempotency_key)


def test_with_redis_writes_paused_no_call_leaves_and_no_answer_is_lost(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Fail closed before the call: the step is deferred (no attempt used), nothing sent. After the call, a
    gate that cannot be told what the call met does not turn the gateway's answer into an error."""
    gate = make_gate(redis.Redis.from_url(redis_url, socket_timeout=0.3), key_prefix, Time(), failures=2)
    assert isinstance(run(Client(down()), gate), Retry)  # a failure counted: the next call reports its outcome
    redis_client.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
    try:
        client = Client()
        kept = run(client, gate)
        assert isinstance(kept, Defer) and kept.reason == GATE_UNREACHABLE and kept.error["type"] == "RedisUnreachable"
        assert client.keys == []  # no call was sent
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
    try:
        assert isinstance(run(PausingClient(redis_client), gate), Advance)  # the answer, though the report was lost
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
