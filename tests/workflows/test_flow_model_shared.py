"""Model test of flows that share a gateway target: Hypothesis chooses the interleaving, the money
invariants over every flow of a target together must hold (identity, and a check that holds when the
money moves: docs/durability.md, "One money call at a time per target").

Each example makes one sale and one paid reservation outside any flow, and starts two or three flows on
each (``model_shared.py``): partial refunds and a cancel of the capture on the sale; no-show, incremental
and delayed charges on the reservation. The real engine runs them against the simulator over HTTP and a
Valkey of its own (``flow_model.FlowWorld``). Each move is one of: start another flow on a target;
deliver a step message (once, again, or followed by the worker's next steps), lose one; run the
dispatcher; move time (past backoffs, leases, the late window, a delayed charge's hour and the check-out);
a slow worker (a step run now, completed later); a worker killed after its gateway call; a gateway fault
for the next matching request (commit then fail or drop, 429, 503, a 500 that never acted, a request that
acts late), on the money calls and on the reads of the targets; a money call answered PENDING and settled
later; the last N Redis writes lost; an operator's cancel or retry at any moment; the hotel moving the
check-out three days on, or cancelling the reservation.

After every move no flow names an operation another flow's call made, no operation is two flows', no flow
is failed or cancelled over money its call moved, and what the gateway took on each target stays within
durapay's bounds (the reservation's amount, one no-show, nothing after a cancel, no delayed charge before
the check-out in force). Once settled, every operation a flow's call made is named by that flow (a
person's retry names it where a read could not tell). Deterministic (derandomized);
``DURAPAY_SHARED_MODEL_EXAMPLES`` runs a longer hunt.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from durapay.simulator import SimulatorServer
from durapay.workflows.engine import NotFound, OperatorError
from durapay.workflows.engine.states import FlowState
from tests.workflows import model_shared
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld, model_settings
from tests.workflows.model_kinds import ModelFlow
from tests.workflows.model_shared import SharedTargets

EXAMPLES = int(os.environ.get("DURAPAY_SHARED_MODEL_EXAMPLES", "12"))
STEPS = int(os.environ.get("DURAPAY_SHARED_MODEL_STEPS", "30"))
WHICH = st.integers(0, 63)
FAULT_OPERATIONS = [
    "refund_operation",
    "refund_operation",
    "cancel_operation",
    "create_no_show",
    "create_incremental",
    "create_incremental",
    "create_delay_charge",
    "get_order",
    "get_operation",
    "get_reservation",
]
FAULTS: dict[str, dict[str, Any]] = {
    "commit_then_fail": {"mode": "commit_then_fail"},
    "commit_then_drop": {"mode": "commit_then_fail", "drop": True},
    "500": {"mode": "error", "status": 500},
    "429": {"mode": "error", "status": 429, "retry_after": 2},
    "503": {"mode": "error", "status": 503},
    "late": {"mode": "late"},
}
PENDING = ["refund_operation", "create_no_show", "create_incremental", "create_delay_charge"]
MONEY_CALLS = [
    "refund_operation",
    "refund_operation",
    "cancel_operation",
    "create_no_show",
    "create_incremental",
    "create_delay_charge",
]


class SharedTargetModel(RuleBasedStateMachine):
    parts: tuple[SimulatorServer, AofTail]
    examples = itertools.count(500)

    def __init__(self) -> None:
        super().__init__()
        sim, tail = self.parts
        self.world = FlowWorld(sim, tail, next(self.examples))
        self.targets = SharedTargets.make(self.world)

    def teardown(self) -> None:
        world = self.world
        try:
            model_shared.settle(world)  # a flow waiting for a holder a person must look at: they do
            unnamed = model_shared.check_settled(world, self.targets)
            if unnamed:  # a person retries what could not be told, the gateway answering again
                world.sim.admin.clear_faults()
                world.sim.admin.settle_pending()
                for flow in unnamed:
                    world.engine.retry(flow.flow_id)
                model_shared.settle(world)
                assert not model_shared.check_settled(world, self.targets), [world.describe(flow) for flow in unnamed]
        finally:
            world.close()

    def pick(self, which: int) -> ModelFlow | None:
        flows = self.targets.flows
        return flows[which % len(flows)] if flows else None

    @initialize(
        draws=st.lists(WHICH, min_size=2, max_size=5),
        together=st.booleans(),
        lost=st.sampled_from([*MONEY_CALLS, ""]),
        mode=st.sampled_from(["commit_then_fail", "commit_then_drop", "500", "late"]),
    )
    def first_flows(self, draws: list[int], together: bool, lost: str, mode: str) -> None:
        """Flows on both targets (or, ``together``, all on the first one's), and (mostly) the first answer of
        one money call lost: the first flow on its target then holds it unresolved while the others reach
        theirs."""
        for which in draws:
            self.targets.start(self.world, which - which % 2 + draws[0] % 2 if together else which)
        if lost:
            self.world.sim.admin.set_faults(operation=lost, count=1, **FAULTS[mode])

    @rule(which=WHICH)
    def start(self, which: int) -> None:
        self.targets.start(self.world, which)

    @rule(which=WHICH, again=st.sampled_from([False, False, False, True]), follow=st.sampled_from([0, 0, 8]))
    def deliver(self, which: int, again: bool, follow: int) -> None:
        chains = self.world.messages.chains
        if chains:
            self.world.deliver(which % len(chains), again=again, follow=follow)

    @rule(which=WHICH, finish=st.booleans())
    def slow_worker(self, which: int, finish: bool) -> None:
        if finish and self.world.held:
            self.world.finish_step(which % len(self.world.held))
        elif (flow := self.pick(which)) is not None:
            # A worker of its own: two claims of one worker at one instant would share a lease token.
            self.world.begin_step(flow, worker=f"slow{self.world.steps}")

    @rule()
    def dispatch(self) -> None:
        self.world.engine.dispatch_due()

    @rule(seconds=st.sampled_from([1.0, 5.0, 31.0, 121.0, 601.0, 3700.0]))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    @rule(
        which=WHICH,
        fault=st.sampled_from(["gateway", "gateway", "gateway", "kill", "kill", "redis tail", "lost message", "late arrives"]),
        operation=st.sampled_from(FAULT_OPERATIONS),
        mode=st.sampled_from(sorted(FAULTS)),
    )
    def fault(self, which: int, fault: str, operation: str, mode: str) -> None:
        world = self.world
        if fault == "gateway":
            world.sim.admin.set_faults(operation=operation, count=1, **FAULTS[mode])
        elif fault == "kill" and (flow := self.pick(which)) is not None:
            world.kill_mid_step(flow)
        elif fault == "redis tail":
            world.lose_tail(1 + which % 12)
        elif fault == "lost message" and world.messages.chains:
            world.messages.chains.pop(which % len(world.messages.chains))
        elif fault == "late arrives":
            world.sim.admin.release_late()

    @rule(operation=st.sampled_from(MONEY_CALLS), mode=st.sampled_from(["commit_then_fail", "commit_then_drop", "500", "late"]))
    def lose_answer(self, operation: str, mode: str) -> None:
        """The next money call of ``operation`` loses its answer (acted or not, or acting later): what leaves
        a read-back to tell whose operation is whose, and makes the next flow on the target wait."""
        self.world.sim.admin.set_faults(operation=operation, count=1, **FAULTS[mode])

    @rule(operation=st.sampled_from(PENDING), final=st.sampled_from(["000", "000", "116"]), now=st.booleans())
    def pending(self, operation: str, final: str, now: bool) -> None:
        if now:
            self.world.sim.admin.settle_pending()
        else:
            self.world.sim.admin.pend(operation, final=final)

    @rule(which=WHICH, act=st.sampled_from(["cancel", "retry", "retry"]))
    def operator(self, which: int, act: str) -> None:
        flow = self.pick(which)
        if flow is None:
            return
        engine = self.world.engine
        with contextlib.suppress(OperatorError, NotFound):
            if act == "cancel":
                engine.cancel(flow.flow_id, "the merchant cancels")
            elif (record := self.world.record(flow)) is not None and record.state in {
                FlowState.FAILED,
                FlowState.NEEDS_ATTENTION,
            }:
                engine.retry(flow.flow_id)

    @rule(change=st.sampled_from(["check-out", "check-out", "cancel"]))
    def hotel(self, change: str) -> None:
        self.targets.change_reservation(self.world, change)

    @invariant()
    def money_by_identity_within_bounds(self) -> None:
        model_shared.check_always(self.world, self.targets)


def test_flows_sharing_a_target_under_random_interleavings_and_faults(model_parts: tuple[SimulatorServer, AofTail]) -> None:
    SharedTargetModel.parts = model_parts
    run_state_machine_as_test(SharedTargetModel, settings=model_settings(EXAMPLES, STEPS))
