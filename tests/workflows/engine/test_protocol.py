"""The worker's protocol at its limits: every loop ends, one clock for leases and due times, leases
held across a step's several gateway calls. A real Valkey, scripted steps, manual clocks."""

from __future__ import annotations

from typing import Any

from durapay.gateway import Catalogue, GatewayOperation, ServerError
from durapay.tasks.outcomes import Advance, Defer, Outcome, Retry, Wait
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from durapay.workflows.engine import Claim
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import STOPPED, FlowState
from durapay.workflows.engine.steps import WaitStep
from tests.workflows.engine_support import T0, ScriptedStep, flow


def failing_deadline_read() -> WaitStep:
    def read(ctx: StepContext) -> Outcome:
        raise ServerError("the gateway is down", status_code=503, operation="get_order")

    return WaitStep("customer", ("paid",), on_signal=lambda c, n, p: Advance({}), on_deadline=read, timeout=lambda c: 100.0)


def drive(engine: Any, clock: ManualClock, flow_id: str, *, limit: int = 500) -> int:
    """Run whatever is due until the flow stops or ``limit`` runs; returns the number of runs."""
    for runs in range(1, limit + 1):
        record = engine.get(flow_id)
        if record.state in STOPPED:
            return runs
        if record.due is not None and record.due > clock.now():
            clock.set(record.due)
        engine.run_step(flow_id, record.step)
    return limit + 1


def test_a_deadline_read_that_keeps_failing_ends_with_a_person(make_engine: Any, clock: ManualClock) -> None:
    engine, _ = make_engine(flow(failing_deadline_read()))
    record = engine.start("demo", {"amount": 5})
    runs = drive(engine, clock, record.id)
    stopped = engine.get(record.id)
    assert stopped.state is FlowState.NEEDS_ATTENTION, (runs, engine.history(record.id)[-3:])
    assert runs < 50


def test_a_step_that_never_makes_progress_is_stopped_for_a_person(make_engine: Any, clock: ManualClock) -> None:
    """The backstop under every loop: a step run without end (here: a wait whose signal handler keeps
    waiting, woken again and again) stops after ``max_step_runs`` claims."""
    keeps_waiting = WaitStep(
        "customer",
        ("ping",),
        on_signal=lambda ctx, name, payload: Advance({}) if payload.get("done") else _wait_again(ctx),
        on_deadline=lambda ctx: _wait_again(ctx),
        timeout=lambda ctx: 10.0,
    )
    engine, _ = make_engine(flow(keeps_waiting))
    record = engine.start("demo", {"amount": 5})
    runs = drive(engine, clock, record.id, limit=2000)
    stopped = engine.get(record.id)
    assert stopped.state is FlowState.NEEDS_ATTENTION, runs
    assert stopped.error is not None and stopped.error["type"] == "TooManyRuns"
    assert runs <= engine.settings.engine.max_step_runs + 2


def _wait_again(ctx: StepContext) -> Outcome:
    return Wait(("ping",), ctx.now + 10.0)


def test_a_worker_behind_the_dispatchers_clock_does_not_delay_the_step(make_engine: Any, clock: ManualClock) -> None:
    """The dispatcher takes a due entry (pushing it back by a lease so no other dispatcher sends it); a
    worker whose clock is 50 ms behind finds the step 'early'. The entry must be re-armed at its real
    due time, not left a lease later."""
    step = ScriptedStep("pay", outcomes=[Retry(1.0, {"type": "ServerError"}), Advance({})])
    engine, _ = make_engine(flow(step))
    behind = ManualClock(T0)
    worker, _ = make_engine(flow(step), clock=behind)
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "pay") == "retrying"
    due = engine.get(record.id).due
    assert due is not None
    clock.set(due)
    behind.set(due - 0.05)
    assert engine.dispatch_due() == 1
    assert worker.run_step(record.id, "pay") == "early"
    assert engine.redis.zscore(engine.keys.due_of(record.id), record.id) == due


class Client:
    """A gateway client that answers every call with ``{}`` and lets the test act between calls."""

    def __init__(self) -> None:
        self.between: list[Any] = []
        self.calls = 0

    def call(self, op: GatewayOperation[Any], *path: str, request: Any = None, idempotency_key: str | None = None) -> Any:
        self.calls += 1
        if self.between:
            self.between.pop(0)()
        return None


class TwoCalls:
    """A step that reads, then writes: two gateway calls under one claim."""

    name = "setup"
    operation = Catalogue.create_structure
    task_name = "test.step"
    when = None
    customer_url = None

    def __init__(self) -> None:
        self.runs = 0

    def execute(self, ctx: StepContext) -> Outcome:
        self.runs += 1
        ctx.call(Catalogue.list_structures)
        ctx.call(Catalogue.create_structure, request={})
        return Advance({"created": True})

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        return NOT_COMMITTED


def test_a_step_making_several_calls_keeps_its_lease_between_them(make_engine: Any, clock: ManualClock) -> None:
    client = Client()
    step = TwoCalls()
    engine, _ = make_engine(flow(step), client_factory=lambda: client)
    record = engine.start("demo", {"amount": 5})
    other: list[Any] = []

    def slow_first_call() -> None:
        clock.advance(31)  # the first call took longer than the lease (30 s)

    def second_call() -> None:
        other.append(engine.claim(record.id, "setup", worker="another"))

    client.between = [slow_first_call, second_call]
    assert engine.run_step(record.id, "setup", worker="first") == "succeeded"
    assert other == ["leased"], "the lease was renewed before the second call"
    assert step.runs == 1


def test_a_step_that_lost_its_lease_makes_no_further_call(make_engine: Any, clock: ManualClock) -> None:
    client = Client()
    step = TwoCalls()
    engine, _ = make_engine(flow(step), client_factory=lambda: client)
    record = engine.start("demo", {"amount": 5})
    taken: list[Any] = []

    def taken_over() -> None:
        clock.advance(31)
        engine.redis.hset(engine.keys.flow(record.id), "lease_until", repr(clock.now() - 1))
        taken.append(engine.claim(record.id, "setup", worker="another"))

    client.between = [taken_over]
    assert engine.run_step(record.id, "setup", worker="first") == "stale"
    assert isinstance(taken[0], Claim)
    assert client.calls == 1, "the write was not sent once another worker held the step"


def gateway_unavailable(after: float) -> Defer:
    return Defer(after, "gateway unavailable", {"type": "GatewayUnavailable", "message": "the gateway's circuit breaker is open"})


def test_unbroken_gateway_refusals_past_the_outage_bound_end_the_flow_failed(make_engine: Any, clock: ManualClock) -> None:
    """Each Defer taken up when the gate said: one outage, from the first; past ``outage_seconds`` (one
    hour) the next Defer ends the flow (nothing was sent, no money moved: failed)."""
    engine, _ = make_engine(flow(ScriptedStep("first", outcomes=[gateway_unavailable(600.0) for _ in range(20)])))
    record = engine.start("demo", {"amount": 5})
    runs = drive(engine, clock, record.id)
    ended = engine.get(record.id)
    assert ended.state is FlowState.FAILED, ended.summary()
    assert "gateway unavailable for more than 3600s" in (ended.outcome or {})["reason"]
    assert 3600 <= clock.now() - T0 < 3600 + 2 * 600 + 200 and runs <= 9


def test_a_pause_between_gateway_refusals_does_not_count_toward_the_outage_bound(make_engine: Any, clock: ManualClock) -> None:
    """A 5 s breaker blip, a two-hour pause of the kind (longer than the one-hour bound), then the breaker
    open a few seconds again: the flow ended ``failed`` "for more than 3600s" (issue 28 review), its
    ``gateway_since`` kept from the blip. A flow taken up later than a lease and a breaker period after the
    gate's due was kept by something else: its outage counts afresh (``StepProtocol._outage_since``)."""
    first = ScriptedStep("first", outcomes=[gateway_unavailable(5.0), gateway_unavailable(5.0)])
    engine, _ = make_engine(flow(first, ScriptedStep("second")))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "first") == "retrying"
    engine.pauses.pause("demo", "maintenance window", by="ops")
    clock.advance(2 * 3600)
    assert engine.run_step(record.id, "first") == "paused"
    engine.pauses.resume("demo", by="ops")
    clock.advance(1)
    assert engine.run_step(record.id, "first") == "retrying", "the breaker again: the flow waits"
    after = engine.get(record.id)
    assert after.fields["gateway_since"] == repr(clock.now()), "the outage counts from this Defer"
    assert len(first.runs) == 2


def test_a_stopped_dispatcher_between_gateway_refusals_does_not_count_toward_the_outage_bound(
    make_engine: Any, clock: ManualClock
) -> None:
    """The same with no pause: nothing took the flow up for two hours (every dispatcher stopped)."""
    first = ScriptedStep("first", outcomes=[gateway_unavailable(5.0), gateway_unavailable(5.0)])
    engine, _ = make_engine(flow(first, ScriptedStep("second")))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "first") == "retrying"
    clock.advance(2 * 3600)
    assert engine.run_step(record.id, "first") == "retrying"
    assert engine.get(record.id).fields["gateway_since"] == repr(clock.now()), "the outage counts from this Defer"
