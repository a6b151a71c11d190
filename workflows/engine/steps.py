"""Kinds of step a flow is made of, and the flow definition that lists them.

* :class:`CallStep` calls one gateway operation (its Celery task is ``durapay.gateway.<operation>``),
  turns the answer into an outcome, and knows how to *reconcile*: read the gateway to learn whether
  a call whose answer was lost took effect.
* :class:`WaitStep` waits for the customer: a signal (a notification, a 3DS result, a completed form)
  or, at its deadline, a read of the gateway instead of a guess.
* :class:`SleepStep` is a durable timer on the ``due`` set (months if need be), never a Celery ETA.
* :class:`MerchantStep` runs the merchant's own Python function (``durapay.flows.step``): its return
  value is the step's output, its exceptions say whether to try again (``workflows.merchant``).

Steps may be conditional (``when``): the engine skips a step whose condition is false. A flow's steps
compile into a Celery chain, one task per step; the chain is only the fast path, the record decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from pydantic import BaseModel

from durapay.gateway import GatewayModel, GatewayOperation
from durapay.tasks.celery_tasks import ENGINE_STEP_TASK
from durapay.tasks.outcomes import Advance, Finish, Outcome, Retry, Sleep, Wait
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from durapay.workflows.engine.sensitive import scrub

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
    """The gateway target a money step acts on besides its own order (``workflows.engine.targets``: one
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
    #: The earlier steps whose outputs it reads: checked at load (a definition error when none makes it).
    reads: tuple[str, ...] = ()
    #: A step body of its own, ``body(ctx, send)``: checks before the call, another call of the catalogue in
    #: its place (a version's), or a refusal read back; ``send(ctx)`` makes the declared call (build, result).
    body: Callable[[StepContext, Callable[[StepContext], Outcome]], Outcome] | None = None
    #: Its lost answer is read back from the flow's gateway order (``durapay.flows.payment``): the flow
    #: must name one (``FlowDefinition.order_id``), else the read asks for order "" and finds nothing.
    needs_order: bool = False

    @property
    def operation(self) -> GatewayOperation[Any]:
        return self.op

    @property
    def task_name(self) -> str:
        return self.op.task_name

    def execute(self, ctx: StepContext) -> Outcome:
        return self.body(ctx, self.send) if self.body is not None else self.send(ctx)

    def send(self, ctx: StepContext) -> Outcome:
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
    reads: tuple[str, ...] = ()

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
        moved: Wait | None = None
        for signal_field, name, payload in ctx.signals:
            if name not in self.signals:
                continue
            ctx.consume(signal_field)
            outcome = self.on_signal(ctx, name, payload)
            if not isinstance(outcome, Wait):
                return outcome
            if outcome.deadline > ctx.now:  # what the gateway showed moves the deadline (a renewed link)
                moved = outcome
        if ctx.deadline_reached and moved is None:
            return self._listening(self.on_deadline(ctx))
        deadline = moved.deadline if moved else ctx.wait_deadline or ctx.now + self.timeout(ctx)
        return Wait(self.signals, deadline, note=f"waiting for {' or '.join(self.signals)}", ends=moved.ends if moved else None)

    def _listening(self, outcome: Outcome) -> Outcome:
        """A wait that goes on after a read waits for every signal of the step (a read never narrows it)."""
        return replace(outcome, signals=self.signals) if isinstance(outcome, Wait) else outcome


@dataclass(frozen=True)
class SleepStep(_LocalStep):
    """Do nothing until ``until(ctx)`` (POSIX seconds; None or past = go on at once)."""

    name: str
    until: Callable[[StepContext], float | None]
    when: Condition | None = None
    customer_url: Callable[[dict[str, Any]], str | None] | None = None
    reads: tuple[str, ...] = ()

    def execute(self, ctx: StepContext) -> Outcome:
        wake = self.until(ctx)
        if wake is None or wake <= ctx.now:
            return Advance({"wokeAt": ctx.now})
        return Sleep(wake, note="durable timer")


@dataclass(frozen=True)
class StepInput:
    """What a merchant's step function is given: the flow's input (its model), the outputs of the steps
    before it, and a key for its own side effects that is the same on every try, on any worker (derived
    from the flow's id and the step's name): a ledger posting sent with it twice is one posting."""

    flow_id: str
    kind: str
    step: str
    input: Any
    outputs: Mapping[str, dict[str, Any]]
    idempotency_key: str
    attempt: int


class StepRetry(Exception):
    """Raised by a merchant's step function: it failed for a reason that may pass (a timeout, a 503);
    try again with the engine's backoff, within the retry bounds (``durapay.flows.Retry``)."""

    retryable = True


class StepFinal(Exception):
    """Raised by a merchant's step function: the flow cannot go on (a fraud check said no). The flow ends
    ``failed`` with this reason (``durapay.flows.Final``)."""

    retryable = False


@dataclass(frozen=True)
class MerchantStep(_LocalStep):
    """A step of the merchant's own code: ``fn(StepInput)`` returns the step's output (a mapping, a
    pydantic model or None), recorded once by the step's completion; a step done is never run again
    (the claim of a step no longer current is refused). Its exceptions are classified by their
    ``retryable`` attribute (:class:`StepRetry`, :class:`StepFinal`, or the merchant's own): retried on
    the engine's backoff at most ``max_attempts`` tries (the retry settings' bound when None), or the
    flow ends failed with the reason. An exception that says neither is a defect: a person looks
    (``needs_attention``), as for a step body of durapay's own."""

    name: str
    fn: Callable[[StepInput], Any]
    max_attempts: int | None = None
    output_model: type[BaseModel] | None = None
    when: Condition | None = None
    customer_url: Callable[[dict[str, Any]], str | None] | None = None
    reads: tuple[str, ...] = ()

    def execute(self, ctx: StepContext) -> Outcome:
        if ctx.kept_output is not None:  # an earlier try's function returned this: its completion was lost
            return Advance(ctx.kept_output)
        given = StepInput(ctx.flow_id, ctx.kind, self.name, ctx.input, dict(ctx.outputs), ctx.idempotency_key, ctx.attempt)
        try:
            value = self.fn(given)
        except Exception as exc:
            retryable = getattr(exc, "retryable", None)
            if not isinstance(retryable, bool):
                raise  # tasks.runner: a defect, a person looks
            error = {"type": type(exc).__name__, "message": str(exc)[:500], "step": self.name, "retryable": retryable}
            if not retryable:
                return Finish(False, f"{self.name}: {exc}", error=error)
            bound = self.max_attempts or ctx.retry.max_attempts
            if ctx.attempt >= bound:
                return Finish(False, f"{self.name} failed {ctx.attempt} times: {exc}", error={**error, "retryable": False})
            return Retry(ctx.retry.delay(ctx.attempt), error)
        output = self._output(value)
        # Kept before the completion is written: a worker lost between the two leaves the output, and the
        # next try records it rather than calling the function again.
        return Advance(ctx.keep_output(output) if ctx.keep_output is not None else output)

    def _output(self, value: Any) -> dict[str, Any]:
        if self.output_model is not None:
            value = self.output_model.model_validate(value)
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", by_alias=True)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise TypeError(f"step {self.name} returned {type(value).__name__}; a step's output is a mapping or a model")
        recorded: dict[str, Any] = json.loads(json.dumps(dict(value)))  # JSON as recorded: a value JSON cannot hold fails here
        # Never a card number in the clear in Redis: a merchant's code may return anything (a risk service
        # echoing the card it was sent), and its output is kept and recorded as returned. Card data a
        # later step needs travels in the flow's input, sealed (workflows.engine.cards).
        masked: dict[str, Any] = scrub(recorded)
        return masked


Step = CallStep | WaitStep | SleepStep | MerchantStep


class DefinitionError(ValueError):
    """A flow definition refused at load: which flow, which step, and why (fix the definition)."""

    def __init__(self, kind: str, step: str, reason: str) -> None:
        where = ", ".join(([f"flow {kind!r}"] if kind else []) + ([f"step {step!r}"] if step else [])) or "flow"
        super().__init__(f"{where}: {reason}")
        self.kind, self.step, self.reason = kind, step, reason


def check_run_bound(definitions: Iterable[FlowDefinition], max_step_runs: int) -> None:
    """Refuse a merchant step whose ``retry`` reaches ``max_step_runs`` (``DURAPAY_ENGINE__MAX_STEP_RUNS``):
    each try is a claim of the step without moving on, and at that many claims the loop bound stops the
    flow for a person (``looping``) before the step's last try, where its definition said it fails."""
    for definition in definitions:
        for step in definition.steps:
            tries = getattr(step, "max_attempts", None)
            if isinstance(tries, int) and tries >= max_step_runs:
                raise DefinitionError(
                    definition.kind,
                    step.name,
                    f"retry={tries} tries reaches DURAPAY_ENGINE__MAX_STEP_RUNS ({max_step_runs}), the claims of one step "
                    "before the flow stops for a person: lower retry or raise max_step_runs above it",
                )


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
    #: (``orderId``): a change it made there (a renewed link) that flow must read (``Engine.tell_holder``),
    #: owed from its completion until told (``workflows.engine.holders``).
    tells_holder: str | None = None
    #: A name people give this version ("2026-12 fraud check"); the version itself is :attr:`version`.
    label: str = ""
    #: Earlier versions of this kind that this code still runs (flows started on them go on on them).
    previous: tuple[FlowDefinition, ...] = ()
    #: Earlier versions whose flows move onto this one, each while it has not reached a step that changed
    #: (``workflows.engine.versions.migration``); a flow that has is parked until a process holds its version.
    migrates: tuple[FlowDefinition, ...] = ()
    step_index: dict[str, int] = field(default_factory=dict, init=False, compare=False)

    def __post_init__(self) -> None:
        made: set[str] = set()
        for index, step in enumerate(self.steps):
            if step.name in made:
                raise DefinitionError(self.kind, step.name, "the step name repeats (each step of a flow has its own)")
            if getattr(step, "needs_order", False) and self.order_id is None:
                raise DefinitionError(
                    self.kind,
                    step.name,
                    "a payment's lost answer is read back from the flow's gateway order: give the Flow "
                    "order_id= (input_order_id for an input with order.orderId)",
                )
            missing = [read for read in getattr(step, "reads", ()) if read not in made]
            if missing:
                raise DefinitionError(self.kind, step.name, f"reads the output of {missing[0]!r}, which no earlier step makes")
            made.add(step.name)
            self.step_index[step.name] = index
        for earlier in (*self.previous, *self.migrates):
            if earlier.kind != self.kind:
                raise DefinitionError(self.kind, "", f"a previous version is of kind {earlier.kind!r}")

    @cached_property
    def version(self) -> str:
        """What a flow in flight depends on, hashed (``workflows.engine.versions``): its steps' names, kinds and
        order, the operations called, the input and output models' JSON schemas."""
        from durapay.workflows.engine.versions import version_of

        return version_of(self)

    def versions(self) -> dict[str, FlowDefinition]:
        """Every version this code runs, current first."""
        held: dict[str, FlowDefinition] = {self.version: self}
        for earlier in self.previous:
            held.setdefault(earlier.version, earlier)
        return held

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
