"""Model test of the flows that wait for a customer: Hypothesis chooses the moves of people and clocks.

The whole-flow model (``test_flow_model.py``) explores every kind under faults; this one looks closely at
where people, clocks and money in flight meet on a page, a link or a form (issue 22): hosted pages,
pay-by-links (for a day or for 80 days, longer than the retention) and embedded forms run on the real
engine against the simulator over HTTP and a real Valkey (``flow_model.FlowWorld``). Each move is one of:
start a flow; workers run what is due; the customer pays (at once, or answered PENDING and settled later),
abandons, or comes back days or months later to pay a page they were given (after the flow ended, after
its record expired); the gateway's notification of it is delivered, or lost; the merchant cancels; the
merchant renews a link (through durapay's ``paybylink_renew``, or elsewhere while the flow still waits);
time moves by minutes, a day, 31 or 91 days, and Redis's TTLs age with it.

After every move (``model_checks.check_always``): no payment lands on the order of a flow whose record
expired (it would be answered 401 and found in no flow), no flow charges twice on one order. Once settled
(every notification the gateway made delivered, every PENDING payment settled, every flow run to its end):
every payment the gateway holds for a flow's order shows in that flow, however late (``succeeded`` naming
it, or ``needs_attention`` as a late payment), and no flow is ``failed`` or ``cancelled`` with it.

Run against the engine before waits had their rule (44e5771), its default budget finds: a pay-by-link for
80 days, the merchant cancels (the link is left open), 31 days later the customer pays it: the flow's record
has expired, the payment is in no flow. ``DURAPAY_WAIT_MODEL_EXAMPLES`` runs more examples.
"""

from __future__ import annotations

import contextlib
import itertools
import os

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from durapay.gateway import GatewayError
from durapay.simulator import SimulatorAdminError, SimulatorServer
from durapay.workflows.engine import NotFound, OperatorError
from durapay.workflows.engine.signals import SignalRefused
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld, model_settings
from tests.workflows.model_kinds import ModelFlow

EXAMPLES = int(os.environ.get("DURAPAY_WAIT_MODEL_EXAMPLES", "80"))
STEPS = int(os.environ.get("DURAPAY_WAIT_MODEL_STEPS", "25"))
WHICH = st.integers(0, 63)
KINDS = ["paybylink", "paybylink", "hpp", "build"]
VARIANTS = ["approve", "decline"]  # for a link: 80 days or one day
DAY = 86400.0


class WaitModel(RuleBasedStateMachine):
    parts: tuple[SimulatorServer, AofTail]
    examples = itertools.count(10_000)

    def __init__(self) -> None:
        super().__init__()
        self.world = FlowWorld(*self.parts, next(self.examples))

    def teardown(self) -> None:
        try:
            self.world.settle()
            unnamed = self.world.check_settled()
            if unnamed:
                self.world.check_retried(unnamed)
        finally:
            self.world.close()

    def flow(self, which: int, *, paying: bool = False) -> ModelFlow | None:
        flows = [f for f in self.world.flows if f.pages] if paying else [f for f in self.world.flows if not f.expired]
        return flows[which % len(flows)] if flows else None

    @initialize(kind=st.sampled_from(KINDS), variant=st.sampled_from(VARIANTS))
    def first(self, kind: str, variant: str) -> None:
        self.world.start(kind, variant)
        self.run()

    @rule(kind=st.sampled_from(KINDS), variant=st.sampled_from(VARIANTS))
    def start(self, kind: str, variant: str) -> None:
        if len(self.world.flows) < 3:
            self.world.start(kind, variant)

    @rule()
    def run(self) -> None:
        """Workers run what is due (the messages, then the dispatcher's due flows), as a live system would."""
        for _ in range(30):
            if self.world.messages.chains:
                self.world.deliver(0, follow=8)
            elif not self.world.engine.dispatch_due():
                return

    @rule(which=WHICH, other=WHICH, act=st.sampled_from(["pay", "pay", "abandon", "pay pending"]))
    def customer(self, which: int, other: int, act: str) -> None:
        flow = self.flow(which, paying=True)
        if flow is not None:
            pages = sorted(flow.pages)
            with contextlib.suppress(SimulatorAdminError, NotFound, SignalRefused):
                self.world.pay_page(flow, pages[other % len(pages)], abandon=act == "abandon", pending=act == "pay pending")

    @rule(which=WHICH, other=WHICH, days=st.sampled_from([2, 31, 91]))
    def customer_returns(self, which: int, other: int, days: int) -> None:
        """Days, months later, a customer pays a page they were given."""
        self.world.advance(days * DAY)
        self.customer(which, other, "pay")

    @rule(which=WHICH, other=WHICH)
    def notification(self, which: int, other: int) -> None:
        """The gateway's notification reaches the receiver (one of those it made for the flow's orders)."""
        flow = self.flow(which)
        sent = self.world.notifications(flow) if flow is not None else []
        if sent:
            self.world.notify(sent[other % len(sent)]["body"])

    @rule(which=WHICH)
    def cancel(self, which: int) -> None:
        flow = self.flow(which)
        if flow is not None:
            with contextlib.suppress(OperatorError, NotFound):
                self.world.engine.cancel(flow.flow_id, "the merchant cancels")

    @rule(which=WHICH, days=st.sampled_from([3, 40, 85]), own=st.booleans())
    def renew(self, which: int, days: int, own: bool) -> None:
        """The merchant renews a link: through durapay, or elsewhere while the flow still waits (durapay
        learns of a renewal made elsewhere after a flow ended only through its own paybylink_renew)."""
        flow = self.flow(which)
        record = self.world.record(flow) if flow is not None else None
        if flow is not None and (own or (record is not None and not record.finished)):
            with contextlib.suppress(GatewayError, OperatorError, NotFound):
                self.world.renew(flow, days, own=own)

    @rule(seconds=st.sampled_from([601.0, 3600.0, DAY, 31 * DAY, 91 * DAY]))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    @rule()
    def settle_pending(self) -> None:
        self.world.sim.admin.settle_pending()

    @invariant()
    def holds_after_every_move(self) -> None:
        self.world.check_always()


def test_waiting_flows_under_people_and_clocks(model_parts: tuple[SimulatorServer, AofTail]) -> None:
    WaitModel.parts = model_parts
    run_state_machine_as_test(
        WaitModel,
        settings=model_settings(EXAMPLES, STEPS),
    )
