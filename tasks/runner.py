"""The step runner's gateway half: run one claimed step, call the gateway with the step's key, classify.

The engine (``workflows.engine``) claims a step, hands it here as a :class:`StepContext`, and writes
the :class:`~tasks.outcomes.Outcome` returned. This module owns what happens in between:

1. If the previous try of this step may have reached the gateway (an ambiguous error, or a worker that
   died holding the lease) and the operation is not retry safe, *reconcile first*: the step reads the
   gateway (its catalogue ``reconcile``) and either adopts the committed result, or learns that nothing
   happened and calls again, or cannot tell yet and retries the read on a bounded backoff.
2. Call the gateway with the step's idempotency key (one per flow and step, stable across tries).
3. Turn a gateway error into an outcome through the retry policy; a step body's own answer (say a
   decline) is already an outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from durapay.gateway import (
    BY_NAME,
    Area,
    BadRequest,
    GatewayClient,
    GatewayError,
    GatewayModel,
    GatewayOperation,
    RateLimited,
    ServerError,
    TransportError,
    same_act,
)
from durapay.tasks.outcomes import Attention, Defer, Finish, Outcome, Retry
from durapay.tasks.retry import RetryPolicy

log = logging.getLogger("durapay.runner")

Resp = TypeVar("Resp", bound=GatewayModel)


class LeaseLost(Exception):
    """The step's claim was taken over (its lease ran out) or ended meanwhile: make no further call.

    Raised by :meth:`StepContext.call` before a call when renewing the lease fails; the engine then
    drops the step's result (the completion would be refused as stale anyway)."""


class UndeclaredMoney(Exception):
    """A step's body sends an operation that moves money (or opens a page a customer pays on) while the
    step is not a call step declaring one (a call step of another operation, a wait's handler, a read).
    Only for a declared money operation is money in flight marked, the claim made durable and a lost
    answer read back, so such a call would be sent with none of that. Refused before it is sent (a
    defect of the definition: a person looks); make it a call step that declares the operation."""


class Deferred(Exception):
    """The gate (``workflows.engine.gate``) said not now: the breaker is open, or this call's slot is later. Not a
    GatewayError, so that no step body mistakes it for the gateway's answer; the runner turns it into
    its ``outcome`` wherever a step's call may raise it."""

    def __init__(self, outcome: Defer) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


class Admission(Protocol):
    """The gate's answer (``workflows.engine.gate.Admission``): go, wait ``after`` for ``slot``, or open."""

    @property
    def verdict(self) -> str: ...

    @property
    def after(self) -> float: ...

    @property
    def report(self) -> bool: ...

    @property
    def slot(self) -> float | None: ...


class Gate(Protocol):
    """What the runner needs of the shared gateway gate (``workflows.engine.gate.Gate``)."""

    @property
    def wait_seconds(self) -> float: ...

    def take(self, reservation: float | None = None) -> Admission: ...

    def failed(self, error: GatewayError) -> float | None: ...

    def succeeded(self) -> None: ...

    def limited(self, error: RateLimited) -> Admission | None: ...


#: The reason a flow waits while the breaker is open (docs/durability.md, "Gateway health").
UNAVAILABLE = "gateway unavailable"
#: The reason a flow waits when the gate could not be asked (Redis lost, or its writes paused): no call.
GATE_UNREACHABLE = "Redis unreachable before the gateway call"


@dataclass(frozen=True)
class TargetSnapshot:
    """What a money step's gateway target (a payment's order, a reservation) held when the step took it,
    before its call could be sent (``workflows.engine.targets``): the target, and the ids of its operations then
    (``before``; None when the hold was recorded but its call never sent). While a flow holds its target no
    other flow's money call acts there, so an operation of the call's type that ``before`` does not list,
    and that no other flow recorded, is this call's (``workflows.flows._adopt``)."""

    target: str
    before: frozenset[str] | None


class NotCommitted:
    """Reconcile found that the gateway did not act: call again."""


class Unclear:
    """Reconcile could not tell (yet): read again later."""


NOT_COMMITTED = NotCommitted()
UNCLEAR = Unclear()
ReconcileResult = Outcome | NotCommitted | Unclear

#: Stands for the call that failed when an error does not say which: judged as not safe to repeat.
UNKNOWN_OPERATION: GatewayOperation[Any] = GatewayOperation(
    "POST", "", None, GatewayModel, "an operation the error does not name", Area.PAYMENTS, retry_safe=False
)
object.__setattr__(UNKNOWN_OPERATION, "name", "an unknown operation")


@dataclass
class StepContext:
    """Everything a step body may use. ``call`` is the only way a step reaches the gateway."""

    flow_id: str
    kind: str
    step: str
    input: Any
    outputs: Mapping[str, dict[str, Any]]
    attempt: int
    now: float
    idempotency_key: str
    order_id: str
    client: GatewayClient
    orders: list[str] = field(default_factory=list)
    created: float = 0.0
    deadline_reached: bool = False
    wait_deadline: float | None = None
    #: When the wait this step is in began: its first wait of this generation (the record's ``wait.since``),
    #: so a flow restarted weeks after its start counts its new link's deadline and reads from the link's
    #: making, not from the flow's creation. The engine always gives it (the step's first run: now); None
    #: only for a context built without one (a step body's unit test): ``waits.began`` then takes ``created``.
    wait_since: float | None = None
    signals: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    polls: int = 0
    notification_url: str = ""
    #: The latest moment an earlier try of this step may have sent a call whose answer it never got
    #: (the record's ``maybe_sent``; the flow's creation when the record does not say).
    maybe_sent_at: float = 0.0
    calls: list[str] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    #: Called before every gateway call but the first: extends the claim's lease, or raises LeaseLost.
    renew_lease: Callable[[], None] | None = None
    #: The flow that holds a gateway order id in the order index (None: none), read only when a step must
    #: prove that what an order holds is its own (``workflows.flows._adopt``).
    order_holder: Callable[[str], str | None] | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: The gateway's shared gate (None: calls go straight out, as in unit tests of step bodies).
    gate: Gate | None = None
    #: The limiter slot reserved for this step when it was deferred to it (used by its first call).
    slot: float | None = None
    #: Takes the step's gateway target before it reconciles or calls (``workflows.engine.targets``): None once
    #: held (``snapshot`` then says what the target held), or the outcome of waiting for its holder. None
    #: for a step that acts on no shared target.
    hold_target: Callable[[], Outcome | None] | None = None
    #: The step's gateway target as it held it (see :class:`TargetSnapshot`), None when it holds none.
    snapshot: TargetSnapshot | None = None
    #: A person's decision on a call an earlier release sent with no hold on its target (the record's
    #: ``decided`` for this step: ``adopt``, the operation taken as the call's; ``none``, those taken as
    #: not its own: ``workflows.engine.operator_actions.decision``), or None.
    decided: Mapping[str, Any] | None = None
    #: This try ended before its money call could be sent: while it took its target (it waits for
    #: another flow's call, or a read of the target failed). What it marked in flight is then settled.
    kept_from_call: bool = False
    #: What a target's snapshot read (a reservation, an order), for the step body to check it again
    #: without a second read.
    target_read: Any = None
    #: The flow that recorded a gateway operation (its ``op:`` lookup; None: none), read only when a
    #: read-back must exclude another flow's operation (``workflows.flows._adopt``).
    operation_holder: Callable[[str], str | None] | None = None
    #: The gateway order of an operation a flow recorded, as the gateway answered it (None: durapay does not
    #: know it): a post-operation names its target without a read (``workflows.flows.backoffice``).
    operation_order: Callable[[str], str | None] | None = None

    #: A merchant step's output an earlier try kept before its completion was written (None: none), and
    #: how this try keeps its own (the output kept first is answered; LeaseLost once the claim is gone).
    kept_output: dict[str, Any] | None = None
    keep_output: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    #: A call step's declared operation (None: not a call step, which sends no money operation at all): an
    #: operation that moves money is sent only as it or another form of its act (``gateway.FORM_OF``), by a
    #: step whose declared one moves money.
    declared: GatewayOperation[Any] | None = None

    def _check_declared(self, op: GatewayOperation[Any]) -> None:
        """Refuse a money operation the step does not declare (UndeclaredMoney), before it is sent."""
        declared = self.declared
        if declared is not None and declared.declared_only and same_act(op, declared):
            return
        if declared is None:
            what = "is not a call step (a wait's handler, a read)"
        elif declared.declared_only:
            what = f"declares {declared.name}, another act,"
        else:
            what = f"declares {declared.name}, which moves no money and makes nothing payable,"
        raise UndeclaredMoney(
            f"step {self.step} {what} and its body sends {op.name}: make it a call step that declares {op.name}"
        )

    def call(
        self,
        op: GatewayOperation[Resp],
        *path_args: str,
        request: BaseModel | Mapping[str, Any] | None = None,
    ) -> Resp:
        """Call ``op``, sending this step's idempotency key where the operation takes one.

        A step may read, then write (reconcile, then call; reservation set-up): before every call after
        the first, the claim's lease is extended, so that no other worker takes the step over while
        it still calls, and a step whose claim is gone calls no more (LeaseLost)."""
        if op.declared_only:
            self._check_declared(op)
        if self.calls and self.renew_lease is not None:
            self.renew_lease()
        key = self.idempotency_key if op.idempotency_key else None
        gate = self.gate
        if gate is None:
            self.calls.append(op.name)
            return self.client.call(op, *path_args, request=request, idempotency_key=key)
        report = self._admit(gate, op)
        self.calls.append(op.name)
        try:
            answer = self.client.call(op, *path_args, request=request, idempotency_key=key)
        except GatewayError as error:
            self._judge(gate, op, error, report)
            raise
        if report:
            gate.succeeded()
        return answer

    def _admit(self, gate: Gate, op: GatewayOperation[Any]) -> bool:
        """Pass the gate or raise Deferred: wait in this worker for a slot that near, defer the flow to a
        later one (reserved for it), or to the breaker's end. Returns whether to report the outcome."""
        reservation, self.slot = self.slot, None
        admission = gate.take(reservation)
        if admission.verdict == "wait" and admission.after <= gate.wait_seconds:
            time.sleep(admission.after)
        elif admission.verdict == "wait":
            error = {
                "type": "RateLimit",
                "operation": op.name,
                "message": f"the shared rate limit's slot is in {admission.after:.2f}s",
            }
            raise Deferred(Defer(admission.after, "gateway rate limit", error, slot=admission.slot))
        elif admission.verdict == "open":
            error = {"type": "GatewayUnavailable", "operation": op.name, "message": "the gateway's circuit breaker is open"}
            raise Deferred(Defer(admission.after, UNAVAILABLE, error))
        elif admission.verdict == "unreachable":
            # Fail closed: a call whose answer Redis could not take is not made (docs/durability.md).
            error = {"type": "RedisUnreachable", "operation": op.name, "message": "the gate could not be asked; no call was sent"}
            raise Deferred(Defer(admission.after, GATE_UNREACHABLE, error))
        return admission.report

    def _judge(self, gate: Gate, op: GatewayOperation[Any], error: GatewayError, report: bool) -> None:
        """Tell the gate what the call's error says of the gateway; raise Deferred when every flow is to
        wait (the breaker open, or a 429's hold), so that this error uses no attempt of the flow's."""
        if isinstance(error, TransportError | ServerError):
            # No answer (a timeout, a connection refused or dropped) or a 5xx: against the gateway's
            # health. A 4xx or an answer we cannot read is the gateway answering.
            until = gate.failed(error)
            if until is not None:
                record = {**error.to_dict(), "breaker": "open"}
                raise Deferred(Defer(until, UNAVAILABLE, record, reconcile=error.ambiguous and not op.retry_safe)) from error
            return
        if isinstance(error, RateLimited):
            if report:
                gate.succeeded()  # an answer: the gateway is up, only busy
            fresh = gate.limited(error)
            if fresh is not None:
                raise Deferred(Defer(fresh.after, "gateway rate limit (429)", error.to_dict(), slot=fresh.slot)) from error
            return
        if report:
            gate.succeeded()  # any other answer: the gateway is up

    def output(self, step: str) -> dict[str, Any]:
        """The output of an earlier step ({} when it was skipped)."""
        return self.outputs.get(step, {})

    def consume(self, signal_field: str) -> None:
        """Mark a received signal as handled (it is removed when the step completes)."""
        self.consumed.append(signal_field)


class Step(Protocol):
    """What the runner needs of a step definition (``workflows.engine.steps`` provides them)."""

    @property
    def name(self) -> str: ...

    @property
    def operation(self) -> GatewayOperation[Any] | None: ...

    def execute(self, ctx: StepContext) -> Outcome: ...

    def reconcile(self, ctx: StepContext) -> ReconcileResult: ...


def run_step(step: Step, ctx: StepContext, *, must_reconcile: bool, resend: bool) -> Outcome:
    """Run ``step`` once under the claim described by ``ctx``; never raises a GatewayError."""
    op = step.operation
    ctx.declared = op  # the one money operation its body may send (None: a wait, a read, a merchant step)
    policy = ctx.retry
    try:
        if ctx.hold_target is not None:
            # One unresolved money call per gateway target: held before the read-back and the call, or
            # the step waits for the flow that holds it (workflows.engine.targets).
            ctx.kept_from_call = True
            waiting = ctx.hold_target()
            if waiting is not None:
                return waiting
            ctx.kept_from_call = False
        if must_reconcile and op is not None and not op.retry_safe:
            found = _reconcile(step, ctx, op.name)
            if not isinstance(found, NotCommitted):
                return found
        return step.execute(ctx)
    except LeaseLost:
        raise
    except Deferred as deferred:
        return deferred.outcome
    except GatewayError as error:
        failing = _operation_of(error, op, ctx)
        if failing is None:
            # Which call failed is unknown, so whether it was safe to repeat is too: read back first.
            return policy.on_error(error, UNKNOWN_OPERATION, ctx.attempt, resend=True)
        if isinstance(error, BadRequest) and error.already_done and failing.method == "POST" and op is not None:
            # "Already used / completed / exists": an earlier try (or one whose record Redis lost)
            # reached the gateway. Read it and adopt what it holds, if it is this flow's. Also for a
            # keyed call: the gateway forgets keys after a while, and then answers this way.
            found = _reconcile(step, ctx, failing.name)
            if isinstance(found, NotCommitted):
                # The gateway says it exists but shows nothing yet: read again, bounded.
                return _unclear(ctx, failing.name, error.to_dict())
            return found
        return policy.on_error(error, failing, ctx.attempt, resend=resend)
    except Exception as error:  # a defect in a step body or an answer it cannot read
        # Raising would leave the step leased, to be claimed and crash again forever. A person looks;
        # ``retry`` then reconciles first, as the call may have reached the gateway before the crash.
        log.exception("flow %s step %s: unexpected error", ctx.flow_id, ctx.step)
        return Attention(f"{ctx.step}: unexpected {type(error).__name__}: {error}", _describe(error, ctx))


class NothingMoved:
    """:func:`settle` found that the money call never acted, and it can no longer arrive: the flow may
    take the end it owes (cancelled, or the failure it was heading for)."""


NOTHING_MOVED = NothingMoved()


def settle(
    step: Step, ctx: StepContext, *, unsettled: Mapping[str, Any] | None, cancelling: bool = False
) -> Outcome | NothingMoved:
    """A flow that is to end (a cancel requested, or a failure owed) while money may be in flight at the
    gateway (``unsettled``, see ``workflows.engine.inflight``): never a new money call, only the read that tells
    what the earlier one did. Returns what the read found (money moved, a decline, still PENDING, not
    yet clear), or NOTHING_MOVED.

    * A read step (the one that reads a PENDING payment, or a refund's or capture's result) simply runs:
      it only reads.
    * A wait for a customer (``settle_wait``): on a cancel it first closes what the customer could pay
      on (a link, a form), then reads what they did (``workflows.flows.waits``).
    * The money step itself, or the step that opens a page, link or form, reads the gateway back (its
      ``adopt``: the order, the operation, the form's state, the link; an opened instrument found is
      then closed by the wait that follows); a keyed call with no read of its own is asked again with its
      ``Idempotency-Key``, which the gateway answers with what it did (and, had the first never arrived,
      does now: a cancel cannot stop a call already sent).
    * "Never acted" is believed only once the call can no longer arrive: a request whose client gave up
      may still be queued at the gateway and act later (``late_seconds`` after it was sent). Before then
      the read is made again at that time."""
    if not unsettled:
        return NOTHING_MOVED
    op = step.operation
    settle_wait = getattr(step, "settle_wait", None)
    if op is None and settle_wait is not None:
        # A wait for a customer: on a cancel, close what the customer could pay on; then read what they did.
        try:
            waited = settle_wait(ctx, cancelling=cancelling)
        except LeaseLost:
            raise
        except Deferred as deferred:
            return deferred.outcome
        except GatewayError as failed:
            return _unclear(ctx, "the read of the customer's payment", {**failed.to_dict(), "during": "settle"})
        return NOTHING_MOVED if waited is None else waited
    if op is None:
        return Attention(
            f"{ctx.step}: money may be in flight ({unsettled.get('op')}) and this step cannot read it",
            {"type": "MoneyInFlight", "unsettled": dict(unsettled)},
        )
    if not op.declared_only:  # a read: it is run (never a call that moves money or reopens a link)
        read = run_step(step, ctx, must_reconcile=False, resend=False)
        if isinstance(read, Finish) and not read.succeeded and not read.output:
            # The read itself failed (refused, or its attempts used up): not the gateway's word on the
            # money. Read again later, bounded, then a person: never a hot loop of owed failures.
            return _unclear(ctx, op.name, {**(read.error or {}), "during": "settle", "message": read.reason})
        return read
    found = _reconcile(step, ctx, op.name)
    if not isinstance(found, NotCommitted):
        return found
    quiet = ctx.maybe_sent_at + ctx.retry.late_seconds
    if ctx.now < quiet:
        error = {
            "type": "MayArriveLate",
            "operation": op.name,
            "ambiguous": True,
            "message": f"no trace yet; read again at {quiet:.0f}",
        }
        return Retry(quiet - ctx.now, error, True)
    return NOTHING_MOVED


def _reconcile(step: Step, ctx: StepContext, operation: str) -> Outcome | NotCommitted:
    """Read the gateway (the step's ``reconcile``): the adopted outcome, NOT_COMMITTED, or a bounded
    retry of the read when it cannot tell."""
    try:
        found = step.reconcile(ctx)
    except LeaseLost:
        raise
    except Deferred as deferred:
        return deferred.outcome
    except GatewayError as error:
        log.info("flow %s step %s: reconcile read failed: %s", ctx.flow_id, ctx.step, error)
        return _unclear(ctx, operation, {**error.to_dict(), "during": "reconcile"})
    except Exception as error:  # a defect in the reconcile read: stop for a person, never loop
        log.exception("flow %s step %s: reconcile raised", ctx.flow_id, ctx.step)
        return Attention(f"{ctx.step}: reconcile raised {type(error).__name__}: {error}", _describe(error, ctx))
    if isinstance(found, Unclear):
        return _unclear(ctx, operation, {"type": "Unclear", "message": "outcome not yet known"})
    return found


def _unclear(ctx: StepContext, operation: str, error: dict[str, Any]) -> Outcome:
    policy = ctx.retry
    if ctx.attempt >= policy.reconcile_attempts:
        return Attention(f"{operation} may have taken effect and the gateway cannot tell yet", error)
    return Retry(policy.delay(ctx.attempt), error, True)


def _describe(error: Exception, ctx: StepContext) -> dict[str, Any]:
    return {"type": type(error).__name__, "message": str(error)[:500], "calls": list(ctx.calls)}


def _operation_of(error: GatewayError, op: GatewayOperation[Any] | None, ctx: StepContext) -> GatewayOperation[Any] | None:
    """The operation that failed: the one named by the error (a step may read before it writes)."""
    if error.operation and error.operation in BY_NAME:
        return BY_NAME[error.operation]
    return op
