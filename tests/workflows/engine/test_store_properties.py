"""Property test of the claim/complete protocol on a real Valkey.

Hypothesis drives random interleavings of: starting flows, step deliveries (several workers may hold
claims at once, deliveries repeat), completions in any order with any outcome, time moving past
leases and deadlines, the dispatcher, signals and cancels. Whatever the order:

* no step of a flow is ever completed twice (a stale or duplicate worker's write is refused);
* a flow that is not finished (or stopped for a person) always has an entry on the ``due`` set, so
  the dispatcher will move it on: nothing is stuck, nothing is lost.

Deterministic (derandomized): 100 runs of up to 60 moves each for both machines in the suite;
``DURAPAY_PROPERTY_EXAMPLES=2000`` runs a longer hunt.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from durapay.config import load_settings
from durapay.gateway import Catalogue, GatewayModel
from durapay.tasks.outcomes import Advance, Finish, Outcome, Poll, Retry
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext, run_step
from durapay.workflows.engine import Claim, Engine, OperatorError
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import STOPPED
from durapay.workflows.engine.steps import FlowDefinition, WaitStep

LEASE = 10.0
EXAMPLES = int(os.environ.get("DURAPAY_PROPERTY_EXAMPLES", "100"))


class Input(GatewayModel):
    n: int


class CallLike:
    """A step on a non-retry-safe operation; its outcome is chosen by the test at completion time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.when = None
        self.customer_url = None
        self.operation = Catalogue.create_moto_order
        self.task_name = "test.step"

    def execute(self, ctx: StepContext) -> Outcome:
        return Advance({"step": self.name})

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        return NOT_COMMITTED


WAIT = WaitStep(
    "w",
    ("go",),
    on_signal=lambda ctx, name, payload: Advance({"signal": name}),
    on_deadline=lambda ctx: Finish(False, "deadline"),
    timeout=lambda ctx: 30.0,
)
DEFINITION = FlowDefinition("prop", Input, (CallLike("a"), WAIT, CallLike("b")), lambda data, outputs: {})  # type: ignore[arg-type]

OUTCOMES = st.sampled_from(["advance", "advance", "advance", "retry", "retry-reconcile", "poll", "fail"])


def outcome_of(choice: str) -> Outcome:
    outcomes: dict[str, Outcome] = {
        "advance": Advance({"done": True}),
        "retry": Retry(1.0, {"type": "ServerError"}),
        "retry-reconcile": Retry(2.0, {"type": "GatewayTimeout"}, reconcile=True),
        "poll": Poll(3.0),
        "fail": Finish(False, "declined"),
    }
    return outcomes[choice]


class Messages:
    """Stands in for Celery: the chains the engine sends, delivered (or not) when the test says."""

    def __init__(self) -> None:
        self.in_flight: list[tuple[str, str]] = []

    def send(self, task_name: str, flow_id: str, step: str) -> None:
        self.in_flight.append((flow_id, step))

    def send_chain(self, flow_id: str, links: list[tuple[str, str]]) -> None:
        self.in_flight.append((flow_id, links[0][1]))


class ClaimProtocol(RuleBasedStateMachine):
    #: With a sender the engine takes the fast path (it sends each step itself, and the due entry is
    #: only the safety net a lease away); without one, only the dispatcher moves flows.
    WITH_SENDER = False

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1_900_000_000.0)
        settings_ = load_settings(
            {
                "gateway": {"timeout": 5.0, "connect_timeout": 1.0},
                "engine": {"key_prefix": "p" + uuid.uuid4().hex[:10], "lease_seconds": LEASE, "partitions": 2},
            }
        )
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.messages = Messages()
        sender = self.messages if self.WITH_SENDER else None
        self.engine = Engine(settings_, self.redis, {"prop": DEFINITION}, clock=self.clock, sender=sender)
        self.flows: list[str] = []
        self.claims: list[Claim] = []
        self.completed: Counter[tuple[str, str, int]] = Counter()

    def teardown(self) -> None:
        self.redis.close()

    @precondition(lambda self: len(self.flows) < 3)
    @rule()
    def start(self) -> None:
        self.flows.append(self.engine.start("prop", {"n": len(self.flows)}).id)

    @precondition(lambda self: self.flows)
    @rule(data=st.data(), step=st.sampled_from(["current", "current", "a", "w", "b"]), worker=st.sampled_from(["w1", "w2"]))
    def deliver(self, data: Any, step: str, worker: str) -> None:
        """A delivery of the flow's current step (most often) or of any step (late or duplicate)."""
        flow_id = data.draw(st.sampled_from(self.flows))
        if step == "current":
            record = self.engine.store.get(flow_id)
            step = record.step if record else "a"
        claim = self.engine.claim(flow_id, step, worker=worker)
        if isinstance(claim, Claim):
            self.same_as_stored(claim.record)
            self.claims.append(claim)

    def same_as_stored(self, record: Any) -> None:
        """The record the engine rebuilt after a write is the record Redis holds."""
        stored = self.engine.store.get(record.id)
        assert stored is not None and stored.summary() == record.summary()

    @precondition(lambda self: self.messages.in_flight)
    @rule(data=st.data(), worker=st.sampled_from(["w1", "w2"]), lost=st.integers(0, 5))
    def deliver_a_sent_message(self, data: Any, worker: str, lost: int) -> None:
        """Celery delivers a message the engine sent (in any order), or loses it (the broker died)."""
        # Pick by the flow's place in self.flows: flow ids are random, and the dispatcher sends in
        # partition order, so the list's own order would differ between Hypothesis replays.
        waiting = [flow_id for flow_id in self.flows if any(sent == flow_id for sent, _ in self.messages.in_flight)]
        chosen = data.draw(st.sampled_from(waiting))
        flow_id, step = self.messages.in_flight.pop(
            next(i for i, (sent, _) in enumerate(self.messages.in_flight) if sent == chosen)
        )
        if not lost:
            return
        claim = self.engine.claim(flow_id, step, worker=worker)
        if isinstance(claim, Claim):
            self.same_as_stored(claim.record)
            self.claims.append(claim)

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def lease_expires_and_another_worker_claims(self, data: Any) -> None:
        """The holder of a claim stalls past its lease; a second worker takes the step over."""
        held = data.draw(st.sampled_from(self.claims))
        self.clock.advance(LEASE + 1)
        claim = self.engine.claim(held.record.id, held.step.name, worker="late")
        if isinstance(claim, Claim):
            self.claims.append(claim)

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), choice=OUTCOMES)
    def complete(self, data: Any, choice: str) -> None:
        claim = self.claims.pop(data.draw(st.integers(0, len(self.claims) - 1)))
        if claim.step.name == "w":
            outcome = run_step(claim.step, claim.ctx, must_reconcile=False, resend=False)
        else:
            outcome = outcome_of(choice)
        result = self.engine.complete(claim, outcome)
        if result != "stale" and isinstance(outcome, Advance):
            self.completed[(claim.record.id, claim.step.name, claim.record.generation)] += 1

    @rule(seconds=st.sampled_from([0.5, 3.0, LEASE + 1, 31.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def dispatch(self) -> None:
        self.engine.dispatch_due()

    @precondition(lambda self: self.flows)
    @rule(data=st.data())
    def signal(self, data: Any) -> None:
        self.engine.signal(data.draw(st.sampled_from(self.flows)), "go", {})

    @precondition(lambda self: self.flows)
    @rule(data=st.data(), rarely=st.integers(0, 4))
    def cancel(self, data: Any, rarely: int) -> None:
        if rarely:
            return  # cancels end flows; keep them rare so long interleavings get explored
        with contextlib.suppress(OperatorError):
            self.engine.cancel(data.draw(st.sampled_from(self.flows)))

    @precondition(lambda self: self.flows)
    @rule(data=st.data(), rarely=st.integers(0, 2))
    def operator_retry(self, data: Any, rarely: int) -> None:
        if rarely:
            return
        with contextlib.suppress(OperatorError):
            self.engine.retry(data.draw(st.sampled_from(self.flows)))

    @invariant()
    def no_step_completes_twice(self) -> None:
        twice = {key: count for key, count in self.completed.items() if count > 1}
        assert not twice, f"steps completed more than once: {twice}"

    @invariant()
    def every_unfinished_flow_is_due(self) -> None:
        for flow_id in self.flows:
            record = self.engine.store.get(flow_id)
            assert record is not None
            score = self.redis.zscore(self.engine.keys.due_of(flow_id), flow_id)
            if record.state in STOPPED:
                assert score is None, f"{flow_id} is {record.state} but still due"
            else:
                assert score is not None, f"{flow_id} is {record.state} at {record.step} with no due entry"


REDIS_URL = ""


class ClaimProtocolWithSender(ClaimProtocol):
    WITH_SENDER = True


@pytest.mark.parametrize("machine", [ClaimProtocol, ClaimProtocolWithSender], ids=["dispatcher-only", "with-sender"])
def test_claim_protocol_properties(redis_url: str, machine: type[ClaimProtocol]) -> None:
    global REDIS_URL
    REDIS_URL = redis_url
    runner = machine.TestCase
    runner.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=60,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    runner().runTest()
