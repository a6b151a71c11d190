"""The operator on call: at moments drawn from the seed, cancels a flow in flight, retries a stopped one,
or closes a late payment, as a person would from the console while everything else breaks.

* **cancel**: any flow not ended (``ready``, ``running``, ``retrying``, ``waiting``, ``sleeping``,
  ``needs_attention``), of any kind, picked among those there are at that moment (but not one whose
  cancel is already requested). ``Engine.cancel``
  answers ``cancelled``, or the flow goes on with ``cancel_requested`` (a step in flight, or money in
  flight: its step reads the gateway and the flow ends ``cancelled`` if no money moved, ``succeeded`` if
  it did, ``needs_attention`` naming the operation if the gateway cannot tell). When the flow was waiting
  for its customer on a hosted page or a link, the customer (drawn) sometimes pays anyway: the page was
  open. The gateway takes that money and the flow stops in ``needs_attention`` (``LatePayment``).
* **resolve**: what a person does with the console's "needs a person" list, late payments first: a
  ``LatePayment`` is refunded (``refund_late_payment``, which starts a refund flow, followed by the
  run like any other) or kept (``keep_late_payment`` beside a succeeded payment; ``retry``, which takes the
  payment as the outcome, for a flow that had ended failed or cancelled); else a ``needs_attention`` or
  ``failed`` flow is retried. A schedule's charge is never picked: ``retry`` refuses those (the schedule
  retries declined charges itself), and they are not among the run's flows anyway.

The schedule's contract payment and the reservation set-up are left alone: the rest of the mix builds on
them. An action the engine refuses (``OperatorError``: already ended, changed meanwhile, a card payment
whose card was erased) is counted as refused: a person meets that too. One that meets Redis away is made
again a little later, as a person would.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from durapay.service.chaos.customer import Customer
from durapay.service.chaos.workload import Planned, Workload
from durapay.workflows.engine import TERMINAL, Engine, FlowRecord, FlowState, NotFound, OperatorError, derived_id

CANCEL, RESOLVE = "cancel", "resolve"
#: Kinds whose customer pays on a page or link the gateway keeps open after a cancel.
OPEN_PAGES = frozenset({"hpp", "paybylink"})
#: The follow-ups the rest of the mix needs: never touched by the operator.
FOUNDATIONS = frozenset({"schedule", "hotel"})
#: How long an action that meets Redis away is tried again.
PATIENCE = 60.0
#: How long an action that finds nothing to act on looks again, as a person on call watches the list for
#: a while: short runs have few flows in flight at any one moment. A cancel looks at every turn of the
#: run's loop (only at the flows not seen ended), a resolve every LOOK_EVERY s (at every flow).
LOOK_FOR = 10.0
LOOK_EVERY = 0.5
#: How often a cancel reads the flows seen ended too (a late payment brings one back to needs_attention).
FULL_EVERY = 2.0


class _NothingYet(Exception):
    """No flow qualifies for the action yet: look again a little later."""


BY = "chaos-operator"


@dataclass(frozen=True)
class Action:
    """One planned action: ``pick`` chooses among the flows that qualify at that moment."""

    at: float
    what: str
    pick: float
    #: For a late payment: refund it (else keep it).
    refund: bool = False
    #: After the cancel of a flow waiting on an open page: the customer pays anyway.
    pays_anyway: bool = False


def plan_operator(rng: random.Random, duration: float) -> list[Action]:
    """Operator actions between 10% and 85% of ``duration``, in time order (``rng`` is theirs alone)."""
    counts = {CANCEL: max(2, int(duration // 12)), RESOLVE: max(2, int(duration // 30))}
    actions = []
    for what, count in counts.items():
        for _ in range(count):
            at = rng.uniform(0.1 * duration, 0.85 * duration)
            actions.append(Action(at, what, rng.random(), refund=rng.random() < 0.5, pays_anyway=rng.random() < 0.5))
    return sorted(actions, key=lambda action: action.at)


@dataclass
class Taken:
    """One action as it went: what, on which flow, and what the engine answered."""

    at: float
    what: str
    flow_id: str = ""
    kind: str = ""
    state: str = ""
    result: str = ""


@dataclass
class OperatorCounts:
    cancels: int = 0
    retries: int = 0
    late_refunded: int = 0
    late_kept: int = 0
    refused: int = 0
    #: Nothing qualified for the action in the seconds it looked (no flow in flight; nothing stopped).
    idle: int = 0
    #: Customers who paid a page or link after its flow was cancelled.
    paid_after_cancel: int = 0
    #: What a cancel answered: ``cancelled``, ``requested`` (``cancel_requested``), or the state the flow kept.
    cancel_answers: dict[str, int] = field(default_factory=dict)
    #: How the flows whose cancel was a request ended (filled in at the end of the run).
    requests_ended: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.cancels + self.retries + self.late_refunded + self.late_kept + self.refused


class Operator:
    """Runs the planned actions on time from the run's main loop (:meth:`act`)."""

    def __init__(self, engine: Engine, workload: Workload, customer: Customer, actions: list[Action]) -> None:
        self.engine = engine
        self.workload = workload
        self.customer = customer
        self.actions = list(actions)
        self.counts = OperatorCounts()
        self.taken: list[Taken] = []
        self.problems: list[str] = []
        #: The flows whose cancel became a request: how they end is the point of asking.
        self.requested: list[str] = []
        self._transient_since: dict[int, float] = {}
        self._next_look = 0.0
        #: Flows seen ended (succeeded, failed, cancelled): a cancel's quick look skips them.
        self._ended: set[str] = set()
        self._full_at = 0.0
        #: The flow an action picked, kept when Redis was away so that the action is made again on it.
        self._chosen: dict[int, str] = {}

    @property
    def pending(self) -> int:
        return len(self.actions)

    def act(self, elapsed: float, *, transient: tuple[type[BaseException], ...]) -> None:
        """Take every action whose time has come, each on its own: one that finds nothing to act on yet
        looks again at the next turns (a resolve every LOOK_EVERY s), one that meets Redis away is made
        again later (and the others wait with it: Redis is away for them too)."""
        for action in [action for action in self.actions if action.at <= elapsed]:
            if action.what == RESOLVE and time.monotonic() < self._next_look:
                continue
            try:
                taken = self._take(action, elapsed)
            except _NothingYet:
                if action.what == RESOLVE:
                    self._next_look = time.monotonic() + LOOK_EVERY
                continue
            except transient as exc:
                first = self._transient_since.setdefault(id(action), time.monotonic())
                if time.monotonic() - first < PATIENCE:
                    return  # Redis away: the same action, on the same flow, at the next turn
                self.problems.append(f"operator {action.what} at {action.at:.1f}s: not made ({type(exc).__name__}: {exc})")
            else:
                self.taken.append(taken)
            self.actions.remove(action)

    def drop(self) -> None:
        """The run is over: an action never taken is a campaign step that did not run."""
        for action in self.actions:
            self.problems.append(f"operator {action.what} at {action.at:.1f}s: never taken")
        self.actions = []

    def close(self) -> None:
        """How the flows whose cancel was a request ended."""
        for flow_id in self.requested:
            try:
                state = self.engine.get(flow_id).state.value
            except NotFound:
                state = "gone"
            self.counts.requests_ended[state] = self.counts.requests_ended.get(state, 0) + 1

    # -- the actions --------------------------------------------------------------------------------------

    def _records(self, *, full: bool) -> list[tuple[Planned, FlowRecord]]:
        """The run's flows as they are now (the foundations left out), in start order; without ``full``,
        not those seen ended at the last full read."""
        found = []
        for planned in list(self.workload.started):
            if planned.follow in FOUNDATIONS or (not full and planned.flow_id in self._ended):
                continue
            record = self.engine.store.get(planned.flow_id)
            if record is None:
                continue
            found.append((planned, record))
            if record.state in TERMINAL:
                self._ended.add(planned.flow_id)
            else:
                self._ended.discard(planned.flow_id)
        return found

    def _take(self, action: Action, elapsed: float) -> Taken:
        chosen = self._chosen.get(id(action))
        full = action.what == RESOLVE or chosen is not None or time.monotonic() >= self._full_at
        if full:
            self._full_at = time.monotonic() + FULL_EVERY
        records = self._records(full=full)
        if chosen is not None:  # made again after Redis was away: on the flow it picked then
            records = [(p, r) for p, r in records if p.flow_id == chosen]
        if action.what == CANCEL:
            # A flow whose cancel is already requested is left to it: the actions spread over the flows.
            in_flight = [(p, r) for p, r in records if r.state not in TERMINAL and not r.cancel_requested]
            return self._cancel(action, elapsed, in_flight)
        return self._resolve(action, elapsed, records)

    def _pick(self, action: Action, among: list[tuple[Planned, FlowRecord]]) -> tuple[Planned, FlowRecord]:
        planned, record = among[min(len(among) - 1, int(action.pick * len(among)))]
        self._chosen[id(action)] = planned.flow_id
        return planned, record

    def _nothing_yet(self, action: Action, elapsed: float) -> None:
        """Nothing to act on: look again (raises) for a while, then count the action as idle."""
        if elapsed < action.at + LOOK_FOR:
            raise _NothingYet
        self.counts.idle += 1

    def _refused(self, taken: Taken, exc: Exception, action: Action) -> Taken:
        self.counts.refused += 1
        again = " (made again after Redis was away: perhaps its own first try)" if id(action) in self._transient_since else ""
        taken.result = f"refused: {exc}{again}"
        return taken

    def _cancel(self, action: Action, elapsed: float, candidates: list[tuple[Planned, FlowRecord]]) -> Taken:
        if not candidates:
            self._nothing_yet(action, elapsed)
            return Taken(elapsed, CANCEL, result="nothing in flight")
        planned, before = self._pick(action, candidates)
        taken = Taken(elapsed, CANCEL, planned.flow_id, planned.kind, before.state.value)
        try:
            after = self.engine.cancel(planned.flow_id, "chaos: the operator cancels", by=BY)
        except (OperatorError, NotFound) as exc:
            return self._refused(taken, exc, action)
        self.counts.cancels += 1
        if after.state is FlowState.CANCELLED:
            answer = "cancelled"
        elif after.cancel_requested:
            answer = "requested"
            self.requested.append(planned.flow_id)
        else:
            answer = after.state.value  # say, a late payment's flow stays needs_attention
        taken.result = answer
        self.counts.cancel_answers[answer] = self.counts.cancel_answers.get(answer, 0) + 1
        if (
            action.pays_anyway
            and after.state is FlowState.CANCELLED
            and before.state is FlowState.WAITING
            and planned.kind in OPEN_PAGES
            and before.customer_url
            and self.customer.pay_now(planned.flow_id, planned.kind, before)
        ):
            self.counts.paid_after_cancel += 1
            taken.result += "; the customer paid anyway"
        return taken

    def _resolve(self, action: Action, elapsed: float, records: list[tuple[Planned, FlowRecord]]) -> Taken:
        late = [
            (p, r) for p, r in records if r.state is FlowState.NEEDS_ATTENTION and (r.error or {}).get("type") == "LatePayment"
        ]
        if late:
            return self._late_payment(action, elapsed, *self._pick(action, late))
        stopped = [
            (p, r) for p, r in records if r.state in (FlowState.NEEDS_ATTENTION, FlowState.FAILED) and not r.fields.get("owner")
        ]
        if not stopped:
            self._nothing_yet(action, elapsed)
            return Taken(elapsed, RESOLVE, result="nothing stopped for a person")
        planned, before = self._pick(action, stopped)
        taken = Taken(elapsed, "retry", planned.flow_id, planned.kind, before.state.value)
        try:
            self.engine.retry(planned.flow_id, by=BY)
        except (OperatorError, NotFound) as exc:
            return self._refused(taken, exc, action)
        self.counts.retries += 1
        taken.result = "retried"
        self.customer.expect_again(planned.flow_id, _customer_kind(planned), new_order=before.state is FlowState.FAILED)
        return taken

    def _late_payment(self, action: Action, elapsed: float, planned: Planned, record: FlowRecord) -> Taken:
        error = record.error or {}
        operation_id = str((error.get("operation") or {}).get("operationId") or "")
        ended_as = str(error.get("endedAs") or "")
        taken = Taken(elapsed, "late payment", planned.flow_id, planned.kind, f"{record.state.value} ({ended_as})")
        try:
            if action.refund:
                try:
                    self.engine.refund_late_payment(planned.flow_id, "chaos: the operator refunds", by=BY)
                finally:  # the refund flow stands even when the close was refused: follow it
                    self._follow_refund(planned, operation_id)
                self.counts.late_refunded += 1
                taken.result = f"refunded {operation_id}"
            elif ended_as == FlowState.SUCCEEDED.value:
                self.engine.keep_late_payment(planned.flow_id, by=BY)
                self.counts.late_kept += 1
                taken.result = f"kept {operation_id} beside the first payment"
            else:  # the flow takes the payment as its outcome
                self.engine.retry(planned.flow_id, by=BY)
                self.counts.late_kept += 1
                taken.result = f"kept {operation_id} (retry: the flow takes it)"
        except (OperatorError, NotFound) as exc:
            return self._refused(taken, exc, action)
        return taken

    def _follow_refund(self, parent: Planned, operation_id: str) -> None:
        """Add the refund flow ``refund_late_payment`` started (its id derives from its start key) to the
        run's flows: it is reconciled, its events checked and waited for like the others."""
        if not operation_id:
            return
        flow_id = derived_id("f", "refund", f"late-payment-refund:{parent.flow_id}:{operation_id}")
        if any(p.flow_id == flow_id for p in self.workload.started):
            return
        if self.engine.store.get(flow_id) is None:
            return
        number = 20_000 + len(self.workload.started)
        refund = Planned(number, "refund", {"operationId": operation_id}, 0.0, parent=parent, flow_id=flow_id)
        refund.acked_at = time.time()
        self.workload.started.append(refund)


def _customer_kind(planned: Planned) -> str:
    return "challenge" if planned.challenge else planned.kind
