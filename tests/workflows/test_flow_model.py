"""Model test of whole flows: Hypothesis chooses the interleaving, the invariants must hold.

Real flows (MOTO sale or decline, three steps frictionless or with a 3DS challenge, hosted payment page
with notifications) run on the real engine against the simulator over HTTP and a real Valkey
(``flow_model.py``). Each move is one of: start a flow; deliver a step message (once, or again: a
duplicate delivery), lose one; run the dispatcher; move time (past leases and deadlines); kill a worker
mid-step after its gateway call; set a gateway fault for the next matching request (commit then fail,
commit then drop the connection, 429, 503, or "late": answered 500 or dropped, the request acting at a
later move, at the latest before time moves on); lose the last N Redis writes (an AOF cut, never below what
the engine waited on); the customer pays or abandons a page, answers a 3DS challenge; notifications
(paid, failed, for an earlier order, repeated); cancels, operator retries, the retention running out.

After every move: no flow charged twice, no acknowledged flow lost, every unfinished flow on the due
set. At the end, the world is settled (bounded steps: every loop ends) and the money at the gateway
shows in its flow. Deterministic (derandomized, no example database); ``DURAPAY_MODEL_EXAMPLES`` runs
more examples (a longer hunt).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from simulator import SimulatorAdminError, SimulatorServer
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld, ModelFlow
from workflows.engine import NotFound, OperatorError
from workflows.signals import SignalRefused
from workflows.states import FlowState

EXAMPLES = int(os.environ.get("DURAPAY_MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("DURAPAY_MODEL_STEPS", "30"))
FAULT_OPERATIONS = [
    "create_moto_order",
    "three_steps_init",
    "three_steps_validation",
    "three_steps_payment",
    "create_hpp_order",
    "get_order",
    "get_operation",
]
WHICH = st.integers(0, 63)
#: What happens to a schedule (made by ``start``): ticked, paused, resumed, cancelled, its next charge declined
#: soft (116: dunning), hard (208: stops) or approved (000).
SCHEDULE_ACTS = ["tick", "tick", "tick", "pause", "resume", "cancel", "116", "116", "208", "000"]
CUSTOMER_ACTS = [
    "pay",
    "pay",
    "abandon",
    "approve 3ds",
    "approve 3ds",
    "fail 3ds",
    "notification",
    "notification",
    "notification",
]
FAULTS: dict[str, dict[str, Any]] = {
    "commit_then_fail": {"mode": "commit_then_fail"},
    "commit_then_drop": {"mode": "commit_then_fail", "drop": True},
    "429": {"mode": "error", "status": 429, "retry_after": 2},
    "503": {"mode": "error", "status": 503},
    "late": {"mode": "late"},  # answered 500, acts at a later move (the request was still on its way)
    "late_drop": {"mode": "late", "drop": True},
}


class FlowModel(RuleBasedStateMachine):
    parts: tuple[SimulatorServer, AofTail]
    examples = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        sim, tail = self.parts
        self.world = FlowWorld(sim, tail, next(self.examples))

    def teardown(self) -> None:
        try:
            self.world.settle()
            unnamed = self.world.check_settled()
            if unnamed:
                self.world.check_retried(unnamed)
        finally:
            self.world.close()

    def pick(self, which: int) -> ModelFlow | None:
        """A flow by a drawn number (modulo, and no preconditions: what exists depends on the world, the
        draws must not, or Hypothesis could not replay a case)."""
        flows = [flow for flow in self.world.flows if not flow.expired]
        return flows[which % len(flows)] if flows else None

    # -- starts and Celery -------------------------------------------------------------------

    @initialize(
        kinds=st.lists(st.sampled_from(["moto", "three_steps", "hpp", "schedule"]), min_size=2, max_size=3),
        variant=st.sampled_from(["approve", "approve", "decline", "challenge"]),
    )
    def first_flows(self, kinds: list[str], variant: str) -> None:
        """Every example starts with flows to act on (a run of moves without any would test nothing)."""
        for kind in kinds:
            self.start(kind, variant)

    @rule(
        kind=st.sampled_from(["moto", "three_steps", "hpp", "schedule"]),
        variant=st.sampled_from(["approve", "approve", "decline", "challenge"]),
    )
    def start(self, kind: str, variant: str) -> None:
        if len([flow for flow in self.world.flows if flow.kind != "mit"]) >= 4:
            return
        if kind != "schedule":
            self.world.start(kind, variant)
        elif not self.world.schedule_ids:
            self.world.create_schedule()

    @rule(which=WHICH, again=st.sampled_from([False, False, False, True]), follow=st.sampled_from([0, 0, 8]))
    def deliver(self, which: int, again: bool, follow: int) -> None:
        if self.world.messages.chains:
            self.world.deliver(which % len(self.world.messages.chains), again=again, follow=follow)

    @rule(which=WHICH, finish=st.booleans())
    def slow_worker(self, which: int, finish: bool) -> None:
        """A worker runs a step now and completes it at a later move (or completes one it ran earlier)."""
        if finish and self.world.held:
            self.world.finish_step(which % len(self.world.held))
        else:
            flow = self.pick(which)
            if flow is not None:
                self.world.begin_step(flow)

    @rule()
    def dispatch(self) -> None:
        self.world.engine.dispatch_due()

    @rule(seconds=st.sampled_from([1.0, 5.0, 31.0, 301.0, 601.0, 86400.0]))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    # -- faults: one rule, so that deliveries stay frequent --------------------------------------

    @rule(
        which=WHICH,
        fault=st.sampled_from(["gateway", "gateway", "kill", "kill", "redis tail", "lost message", "retention", "late arrives"]),
        operation=st.sampled_from(FAULT_OPERATIONS),
        mode=st.sampled_from(sorted(FAULTS)),
    )
    def fault(self, which: int, fault: str, operation: str, mode: str) -> None:
        world = self.world
        if fault == "gateway":
            world.sim.admin.set_faults(operation=operation, count=1, **FAULTS[mode])
        elif fault == "kill":
            flow = self.pick(which)
            if flow is not None:
                world.kill_mid_step(flow)
        elif fault == "redis tail":
            world.lose_tail(1 + which % 12)
        elif fault == "lost message" and world.messages.chains:
            world.messages.chains.pop(which % len(world.messages.chains))
        elif fault == "retention" and world.retention_runs < 1:
            world.expire_retention()
        elif fault == "late arrives":
            world.sim.admin.release_late()

    # -- customers and notifications ---------------------------------------------------------------

    @rule(which=WHICH, other=WHICH, act=st.sampled_from(CUSTOMER_ACTS), times=st.integers(1, 2))
    def customer(self, which: int, other: int, act: str, times: int) -> None:
        flow = self.pick(which)
        record = self.world.record(flow) if flow is not None else None
        if flow is None or record is None:
            return
        pages = [order_id for order_id in record.orders if order_id in self.world.shown]
        if act in {"pay", "abandon"} and flow.kind == "hpp" and pages:
            order_id = pages[other % len(pages)]  # a page the customer was given
            with contextlib.suppress(SimulatorAdminError):
                self.world.sim.admin.complete_hpp(order_id, cancel=act == "abandon")
        elif act.endswith("3ds") and flow.kind == "three_steps":
            self.challenge(flow, record.outputs.get("init") or {}, approve=act == "approve 3ds")
        elif act == "notification":
            sent = self.world.notifications(flow)
            if sent:
                body = sent[other % len(sent)]["body"]
                for _ in range(times):
                    self.world.notify(body)

    def challenge(self, flow: ModelFlow, init: dict[str, Any], *, approve: bool) -> None:
        if not init.get("threeDSAuthRequest"):
            return
        operation_id = str((init.get("operation") or {}).get("operationId"))
        try:
            pares = self.world.sim.admin.acs_challenge(operation_id, init["threeDSAuthRequest"], approve=approve)
        except SimulatorAdminError:
            return
        with contextlib.suppress(NotFound, SignalRefused):
            self.world.engine.signal(flow.flow_id, "3ds_result", {"PaRes": pares})

    # -- schedules -------------------------------------------------------------------------------

    @rule(act=st.sampled_from(SCHEDULE_ACTS))
    def schedule(self, act: str) -> None:
        world = self.world
        if act == "tick":
            world.schedules.tick()
            return
        if not world.schedule_ids:
            return
        schedule_id = world.schedule_ids[0]
        with contextlib.suppress(OperatorError, NotFound):
            if act == "pause":
                world.schedules.pause(schedule_id)
            elif act == "resume":
                world.schedules.resume(schedule_id)
            elif act == "cancel":
                world.schedules.cancel(schedule_id, "the merchant stops it")
            else:
                world.sim.admin.script_outcomes([act], contract_id=world.contract)

    # -- the merchant and operators ---------------------------------------------------------------

    @rule(which=WHICH, act=st.sampled_from(["cancel", "retry", "retry"]))
    def operator(self, which: int, act: str) -> None:
        flow = self.pick(which)
        if flow is None:
            return
        with contextlib.suppress(OperatorError, NotFound):
            if act == "cancel":
                self.world.engine.cancel(flow.flow_id, "the merchant cancels")
                return
            record = self.world.record(flow)
            if record is not None and record.state in {FlowState.FAILED, FlowState.NEEDS_ATTENTION}:
                self.world.engine.retry(flow.flow_id)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def holds_after_every_move(self) -> None:
        self.world.check_always()


def test_whole_flows_under_random_interleavings_and_faults(model_parts: tuple[SimulatorServer, AofTail]) -> None:
    FlowModel.parts = model_parts
    run_state_machine_as_test(
        FlowModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_a_cut_loses_the_last_writes_but_never_one_the_engine_waited_on(model_parts: tuple[SimulatorServer, AofTail]) -> None:
    """The model's Redis fault itself: a cut drops the newest commands, back to the last durability wait."""
    world = FlowWorld(*model_parts, example=-1)
    try:
        client = world.engine.redis
        client.set("m:a", "1")
        world.engine.store.sync("f-any", "a write the engine waits on")
        client.set("m:b", "1")
        client.set("m:c", "1")
        assert world.lose_tail(1) == 1
        assert (client.exists("m:a"), client.exists("m:b"), client.exists("m:c")) == (1, 1, 0)
        assert world.lose_tail(50) == 1, "only m:b is above the floor"
        assert (client.exists("m:a"), client.exists("m:b")) == (1, 0)
    finally:
        world.close()
