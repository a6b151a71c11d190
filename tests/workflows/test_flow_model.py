"""Model test of whole flows: Hypothesis chooses the interleaving, the invariants must hold.

Real flows of every money kind (MOTO, MIT, three steps frictionless or with a 3DS challenge, hosted page,
pay-by-link, embedded form, refund, capture, cancel of a capture, no-show and delayed reservation charges;
order ids at the gateway's 18-character limit that share 16 characters) run on the real engine against
the simulator over HTTP and a real Valkey (``flow_model.py``, ``model_kinds.py``). Each move is one of:
start a flow; deliver a step message (once, or again: a duplicate delivery), lose one; run the
dispatcher; move time (past leases, deadlines, the late window); kill a worker mid-step after its gateway
call; set a gateway fault for the next matching request (commit then fail, commit then drop the
connection, 429, 503, or "late": answered 500 or dropped, the request acting at a later move, at the
latest before time moves on), keyed money calls included; make the next money call of a kind answer
PENDING and settle it later (approved or declined); lose the last N Redis writes (an AOF cut, never below
what the engine waited on); pack finished flows; the customer pays or abandons a page, a link or a form,
answers a 3DS challenge (pages paid whenever the customer likes: after the flow ended or its record
expired; a page payment answered PENDING, settled later); the merchant renews a link (with durapay's
``paybylink_renew`` or elsewhere); time moves by up to 91 days, and Redis's TTLs age with it;
notifications (paid, failed, for an earlier order, repeated) and forged ones (a real token, an invented
operation); operators cancel, retry, refund or keep a late payment, resume a
schedule, at any moment; the retention running out.

After every move (``model_checks``): no payment on the order of a flow whose record expired (a flow is kept
while its customer can pay), no flow moves money twice, no flow whose money only its own calls
make is failed or cancelled with that money at the gateway, no acknowledged flow lost, every unfinished
flow on the due set. At the end, the world is settled (bounded steps: every loop ends), the money at the
gateway shows in its flow, every outcome names an operation the gateway holds, and every merchant event
matches a transition. Deterministic (derandomized, no example database); ``DURAPAY_MODEL_EXAMPLES`` runs
more examples (a longer hunt).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from durapay.gateway import GatewayError
from durapay.simulator import SimulatorAdminError, SimulatorServer
from durapay.workflows.engine import NotFound, OperatorError
from durapay.workflows.engine.signals import SignalRefused
from durapay.workflows.engine.states import FlowState
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld, model_settings
from tests.workflows.model_kinds import KINDS, ModelFlow

EXAMPLES = int(os.environ.get("DURAPAY_MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("DURAPAY_MODEL_STEPS", "30"))
FAULT_OPERATIONS = [
    "create_moto_order",
    "create_mit_order",
    "three_steps_init",
    "three_steps_validation",
    "three_steps_payment",
    "create_hpp_order",
    "create_paybylink_v3",
    "create_build_order",
    "build_finalize_payment",
    "refund_operation",
    "capture_operation",
    "cancel_operation",
    "create_no_show",
    "create_delay_charge",
    "get_order",
    "get_operation",
]
#: Money calls the gateway may answer PENDING (settled at a later move, approved or declined).
PENDING_OPERATIONS = [
    "create_moto_order",
    "create_mit_order",
    "three_steps_payment",
    "build_finalize_payment",
    "refund_operation",
    "capture_operation",
    "create_no_show",
    "create_delay_charge",
]
WHICH = st.integers(0, 63)
#: What happens to a schedule (made by ``start``): ticked, paused, resumed, cancelled, its next charge declined
#: soft (116: dunning), hard (208: stops) or approved (000).
SCHEDULE_ACTS = ["tick", "tick", "tick", "pause", "resume", "cancel", "116", "116", "208", "000"]
CUSTOMER_ACTS = [
    "pay",
    "pay",
    "pay pending",
    "abandon",
    "approve 3ds",
    "approve 3ds",
    "fail 3ds",
    "notification",
    "notification",
    "notification",
    "forged notification",
]
STARTS = [*KINDS, "schedule"]
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
        kinds=st.lists(st.sampled_from(STARTS), min_size=2, max_size=3),
        variant=st.sampled_from(["approve", "approve", "decline", "challenge"]),
    )
    def first_flows(self, kinds: list[str], variant: str) -> None:
        """Every example starts with flows to act on (a run of moves without any would test nothing)."""
        for kind in kinds:
            self.start(kind, variant)

    @rule(
        kind=st.sampled_from(STARTS),
        variant=st.sampled_from(["approve", "approve", "decline", "challenge"]),
    )
    def start(self, kind: str, variant: str) -> None:
        if len([flow for flow in self.world.flows if not flow.scheduled]) >= 4:
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

    @rule(seconds=st.sampled_from([1.0, 5.0, 31.0, 301.0, 601.0, 86400.0, 86400.0 * 31, 86400.0 * 91]))
    def advance(self, seconds: float) -> None:
        """Time passes; a day or more ages what Redis keeps (``FlowWorld.age_redis``): months past the
        retention, and past a link's 90 days."""
        self.world.advance(seconds)

    # -- faults: one rule, so that deliveries stay frequent --------------------------------------

    @rule(
        which=WHICH,
        fault=st.sampled_from(
            ["gateway", "gateway", "kill", "kill", "redis tail", "lost message", "retention", "late arrives", "pack"]
        ),
        operation=st.sampled_from(FAULT_OPERATIONS),
        mode=st.sampled_from(sorted(FAULTS)),
    )
    def fault(self, which: int, fault: str, operation: str, mode: str) -> None:
        world = self.world
        if fault == "pack":
            world.compact()
        elif fault == "gateway":
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

    @rule(operation=st.sampled_from(PENDING_OPERATIONS), final=st.sampled_from(["000", "000", "116"]), now=st.booleans())
    def pending(self, operation: str, final: str, now: bool) -> None:
        """The gateway answers the next such call PENDING (settled at a later move), or settles those now."""
        if now:
            self.world.sim.admin.settle_pending()
        else:
            self.world.sim.admin.pend(operation, final=final)

    # -- customers and notifications ---------------------------------------------------------------

    @rule(which=WHICH, other=WHICH, act=st.sampled_from(CUSTOMER_ACTS), times=st.integers(1, 2))
    def customer(self, which: int, other: int, act: str, times: int) -> None:
        if act in {"pay", "abandon", "pay pending"}:
            # Any page the customer was given, whenever: the flow may have ended, or its record expired.
            paying = [flow for flow in self.world.flows if flow.pages]
            if paying:
                payer = paying[which % len(paying)]
                pages = sorted(payer.pages)
                with contextlib.suppress(SimulatorAdminError, NotFound, SignalRefused):
                    self.world.pay_page(payer, pages[other % len(pages)], abandon=act == "abandon", pending=act == "pay pending")
            return
        flow = self.pick(which)
        record = self.world.record(flow) if flow is not None else None
        if flow is None or record is None:
            return
        if act.endswith("3ds") and flow.kind == "three_steps":
            self.challenge(flow, record.outputs.get("init") or {}, approve=act == "approve 3ds")
        elif act.endswith("notification"):
            sent = self.world.notifications(flow)
            if sent:
                body = sent[other % len(sent)]["body"]
                if act == "forged notification":  # the order's real token, an operation the gateway does not have
                    invented = {"operationId": f"55500000000000{other:04d}", "operationResult": "EXECUTED"}
                    body = {**body, "eventId": f"forged-{other}", "operation": {**body["operation"], **invented}}
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

    @rule(
        which=WHICH,
        act=st.sampled_from(["cancel", "cancel", "retry", "retry", "refund late", "keep late", "renew", "renew elsewhere"]),
        days=st.sampled_from([2, 40, 85]),
    )
    def operator(self, which: int, act: str, days: int) -> None:
        flow = self.pick(which)
        if flow is None:
            return
        engine = self.world.engine
        if act.startswith("renew"):
            # A renewal made elsewhere is seen by a flow still waiting (its reads), not by one that ended:
            # durapay is told of renewals through its own paybylink_renew (docs/operations.md).
            record = self.world.record(flow)
            elsewhere_seen = record is not None and not record.finished
            if act == "renew" or elsewhere_seen:
                with contextlib.suppress(GatewayError, OperatorError, NotFound):
                    self.world.renew(flow, days, own=act == "renew")
            return
        with contextlib.suppress(OperatorError, NotFound):
            if act == "cancel":
                engine.cancel(flow.flow_id, "the merchant cancels")
            elif act == "refund late":
                engine.refund_late_payment(flow.flow_id)
            elif act == "keep late":
                engine.keep_late_payment(flow.flow_id)
            elif (record := self.world.record(flow)) is not None and record.state in {
                FlowState.FAILED,
                FlowState.NEEDS_ATTENTION,
            }:
                engine.retry(flow.flow_id)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def holds_after_every_move(self) -> None:
        self.world.check_always()


def test_whole_flows_under_random_interleavings_and_faults(model_parts: tuple[SimulatorServer, AofTail]) -> None:
    FlowModel.parts = model_parts
    run_state_machine_as_test(
        FlowModel,
        settings=model_settings(EXAMPLES, STEPS),
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
