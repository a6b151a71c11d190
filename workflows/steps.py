"""Kinds of step a flow is made of, and the flow definition that lists them.

* :class:`CallStep` calls one gateway operation (its Celery task is ``durapay.gateway.<operation>``),
  turns the answer into an outcome, and knows how to *reconcile*: read the gateway to learn whether
  a call whose answer was lost took effect.
* :class:`WaitStep` waits for the customer: a signal (a notification, a 3DS result, a completed form)
  or, at its deadline, a read of the gateway instead of a guess.
* :class:`SleepStep` is a durable timer on the ``due`` set (months if need be), never a Celery ETA.

Steps may be conditional (``when``): the engine skips a step whose condition is false. A flow's steps
compile into a Celery chain, one task per step; the chain is only the fast path, the record decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from durapay.gateway import GatewayModel, GatewayOperation
from durapay.tasks.celery_tasks import ENGINE_STEP_TASK
from durapay.tasks.outcomes import Advance, Finish, Outcome, Sleep, Wait
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext

Condition = Callable[[StepContext], bool]
RequestBuilder = Callable[[StepContext], "Call"]


@dataclass(frozen=True)
class Call:
    """What a call step sends: path arguments in order, and the body or query."""

    path: tuple[str, ...] = ()
    request: BaseModel | Mapping[str, Any] | None = None


def advance_with_answer(ctx: StepContext, answer: GatewayModel) -> Outcome:
    return Advance(answer.wire())


def never_committed(ctx: StepContext) -> ReconcileResult:
    """For calls that cannot have an effect worth adopting: call again. (A keyed call with this default
    is read back by asking again with its key: ``CallStep.reconcile``.)"""
    return NOT_COMMITTED


@dataclass(frozen=True)
class Target:
    """The gateway target a money step acts on besides its own order (``workflows.targets``: one
    unresolved money call per target): ``of`` names its gateway order (it may read the gateway: a refund
    knows its payment's operation, not its order), ``operations`` reads the ids of the operations the
    target holds now (the snapshot; it may keep what it read in ``ctx.target_read`` for the step body's
    checks), ``what`` names the target in what a waiting flow says ("the payment's order")."""

    of: Callable[[StepContext], str]
    operations: Callable[[StepContext, str], Sequence[str]]
    what: str


@dataclass(frozen=True)
class CallStep:
    name: str
    op: GatewayOperation[Any]
    build: RequestBuilder
    result: Callable[[StepContext, Any], Outcome] = advance_with_answer
    adopt: Callable[[StepContext], ReconcileResult] = never_committed
    when: Condition | None = None
    customer_url: Callable[[dict[str, Any]], str | None] | None = None
    #: The shared gateway target its money call acts on (a payment's order, a reservation), or None.
    target: Target | None = None

    @property
    def operation(self) -> GatewayOperation[Any]:
        return self.op

    @property
    def task_name(self) -> str:
        return self.op.task_name

    def execute(self, ctx: StepContext) -> Outcome:
        call = self.build(ctx)
        answer = ctx.call(self.op, *call.path, request=call.request)
        return self.result(ctx, answer)

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        """Read back what an earlier try did. A call keyed by an ``Idempotency-Key`` with no read of its
        own is read by asking again with the same key: the gateway answers what it did (docs/gateway.md)."""
        if self.adopt is never_committed and self.op.idempotency_key:
            return self.execute(ctx)
        return self.adopt(ctx)


def _paid_elsewhere(ctx: StepContext, payload: dict[str, Any]) -> bool:
    """A notification of a payment taken on another order than the flow's current one (an order it left):
    the read of the flow's own order does not answer it, so it stays kept for money.lua to show."""
    operation = payload.get("operation")
    if not isinstance(operation, dict) or operation.get("operationResult") not in {"AUTHORIZED", "EXECUTED"}:
        return False
    return bool(operation.get("orderId")) and operation.get("orderId") != ctx.order_id


SignalHandler = Callable[[StepContext, str, dict[str, Any]], Outcome]


class _LocalStep:
    """A step that calls no gateway operation: run by ``durapay.engine.step``, nothing to reconcile."""

    @property
    def operation(self) -> None:
        return None

    @property
    def task_name(self) -> str:
        return ENGINE_STEP_TASK

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        return NOT_COMMITTED


@dataclass(frozen=True)
class WaitStep(_LocalStep):
    """Wait for one of ``signals``; at the deadline run ``on_deadline`` (a gateway read).

    A wait for a customer holds something the customer can pay on (``workflows.flows.waits``): ``close``
    closes it at the gateway before a cancel ends the flow (a link's cancel, a form's cancel; None where
    the gateway has none), and ``on_settle`` (default ``on_deadline``) reads what the customer did."""

    name: str
    signals: tuple[str, ...]
    on_signal: SignalHandler
    on_deadline: Callable[[StepContext], Outcome]
    timeout: Callable[[StepContext], float]
    when: Condition | None = None
    customer_url: Callable[[dict[str, Any]], str | None] | None = None
    close: Callable[[StepContext], None] | None = None
    on_settle: Callable[[StepContext], Outcome] | None = None

    def settle_wait(self, ctx: StepContext, *, cancelling: bool) -> Outcome | None:
        """The flow is to end (a cancel, or a failure owed) while its customer may still pay: on a cancel
        close what the gateway lets the merchant close, then read. None: the gateway shows no payment and
        nothing left to wait for (the end may be taken); else what it shows (paid, PENDING, still open)."""
        for signal_field, name, payload in ctx.signals:
            if name in self.signals and not _paid_elsewhere(ctx, payload):
                ctx.consume(signal_field)  # the read below tells what they would: they are answered by it
        if cancelling and self.close is not None:
            self.close(ctx)
        outcome = (self.on_settle or self.on_deadline)(ctx)
        if isinstance(outcome, Finish) and not outcome.succeeded:
            return None
        return self._listening(outcome)

    def execute(self, ctx: StepContext) -> Outcome:
        moved: float | None = None
        for signal_field, name, payload in ctx.signals:
            if name not in self.signals:
                continue
            ctx.consume(signal_field)
            outcome = self.on_signal(ctx, name, payload)
            if not isinstance(outcome, Wait):
                return outcome
            if outcome.deadline > ctx.now:  # what the gateway showed moves the deadline (a renewed link)
                moved = outcome.deadline
        if ctx.deadline_reached and moved is None:
            return self._listening(self.on_deadline(ctx))
        deadline = moved or ctx.wait_deadline or ctx.now + self.timeout(ctx)
        return Wait(self.signals, deadline, note=f"waiting for {' or '.join(self.signals)}")

    def _listening(self, outcome: Outcome) -> Outcome:
        """A wait that goes on after a read waits for every signal of the step (a read never narrows it)."""
        return Wait(self.signals, outcome.deadline, outcome.note) if isinstance(outcome, Wait) else outcome


@dataclass(frozen=True)
class SleepStep(_LocalStep):
    """Do nothing until ``until(ctx)`` (POSIX seconds; None or past = go on at once)."""

    name: str
    until: Callable[[StepContext], float | None]
    when: Condition | None = None
    customer_url: Callable[[dict[str, Any]], str | None] | None = None

    def execute(self, ctx: StepContext) -> Outcome:
        wake = self.until(ctx)
        if wake is None or wake <= ctx.now:
            return Advance({"wokeAt": ctx.now})
        return Sleep(wake, note="durable timer")


Step = CallStep | WaitStep | SleepStep


@dataclass(frozen=True)
class FlowDefinition:
    """A kind of flow: its input model, its steps in order, and how to summarise what happened."""

    kind: str
    input_model: type[BaseModel]
    steps: tuple[Step, ...]
    summary: Callable[[Any, Mapping[str, dict[str, Any]]], dict[str, Any]]
    order_id: Callable[[Any], str] | None = None
    description: str = ""
    #: Where ``order_id`` reads the gateway order id in the input (named when a start is refused for it).
    order_field: str = "order.orderId"
    #: The gateway order id is the merchant object's own (a reservation's id: the gateway makes the order
    #: with it and notifies under it), so durapay never derives another: a retry goes on on the same order.
    order_fixed: bool = False
    #: The start key of a start that gives none: what may happen only once per merchant object (a no-show
    #: per reservation), so that two starts of it are one flow, or a StartConflict naming the key.
    start_key: Callable[[Any], str] | None = None
    #: A signal its success sends to the flow holding the gateway order its last output names
    #: (``orderId``): a change it made there (a renewed link) that flow must read (``Engine.tell_holder``).
    tells_holder: str | None = None
    step_index: dict[str, int] = field(default_factory=dict, init=False, compare=False)

    def __post_init__(self) -> None:
        names = [step.name for step in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"flow {self.kind}: step names repeat: {names}")
        self.step_index.update({name: index for index, name in enumerate(names)})

    def step(self, name: str) -> Step:
        return self.steps[self.step_index[name]]

    def first_step(self, ctx: StepContext) -> Step | None:
        return self._from(0, ctx)

    def next_step(self, after: str, ctx: StepContext) -> Step | None:
        return self._from(self.step_index[after] + 1, ctx)

    def _from(self, start: int, ctx: StepContext) -> Step | None:
        for step in self.steps[start:]:
            if step.when is None or step.when(ctx):
                return step
        return None

    def segment(self, name: str) -> tuple[Step, ...]:
        """``name`` and the unconditional steps right after it: the links one Celery chain can carry.

        A conditional step ends the segment: whether it runs is known only when the step before it
        is done, and a link sent for a skipped step would be a wasted task.
        """
        start = self.step_index[name]
        links = [self.steps[start]]
        for step in self.steps[start + 1 :]:
            if step.when is not None:
                break
            links.append(step)
        return tuple(links)
