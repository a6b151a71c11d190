"""Declaring a flow: the public face of durapay's engine (docs/deploys.md, "Declaring a flow").

Every kind durapay runs is declared with these names, its own built-in kinds (``workflows/flows/``)
and a merchant's (a module named in ``DURAPAY_FLOWS__MODULES``, loaded by every process):

* :class:`Flow`: a kind, its input model, its steps in order, an optional ``label`` and the
  ``previous`` versions the code still runs for flows started on them;
* :func:`call`: one gateway operation of the catalogue (by name or as ``Catalogue.x``): its request
  built from the input and earlier outputs, its result read, its read-back after a lost answer;
* :func:`wait_signal`: a wait for a signal (a notification, a 3DS result) until a deadline;
* :func:`timer`: a durable timer (months if need be);
* :func:`payment` and :func:`settle`: a payment call read as durapay's own are (declines, PENDING,
  the read-back of a lost answer), and the read of a PENDING one until final;
* :func:`step`: the merchant's own Python function, given a :class:`StepInput` (the input, earlier
  outputs, a stable idempotency key); its return value is the step's output; it raises :class:`Retry`
  to be tried again with the engine's backoff, :class:`Final` to end the flow with the reason.

A definition error (a step name twice, an unknown operation, a step reading an output no earlier step
makes) raises :class:`DefinitionError` when the module is loaded, naming the flow, the step and why.
Each definition has a :attr:`Flow.version`, a hash of what a flow in flight depends on
(``workflows.engine.versions``); a flow records the version it started on and runs on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from durapay.gateway import BY_NAME, GatewayOperation
from durapay.tasks.outcomes import Outcome
from durapay.tasks.runner import ReconcileResult, StepContext
from durapay.workflows.engine import (
    Call,
    CallStep,
    Condition,
    DefinitionError,
    MerchantStep,
    RequestBuilder,
    SignalHandler,
    SleepStep,
    StepInput,
    Target,
    WaitStep,
    advance_with_answer,
    never_committed,
)
from durapay.workflows.engine import FlowDefinition as Flow
from durapay.workflows.engine import StepFinal as Final
from durapay.workflows.engine import StepRetry as Retry

#: The most tries a merchant step may ask for (its ``retry``): every loop has a bound.
MAX_TRIES = 100


def _no_request(ctx: StepContext) -> Call:
    return Call()


def call(
    name: str,
    operation: GatewayOperation[Any] | str,
    build: RequestBuilder = _no_request,
    *,
    result: Callable[[StepContext, Any], Outcome] = advance_with_answer,
    adopt: Callable[[StepContext], ReconcileResult] = never_committed,
    when: Condition | None = None,
    customer_url: Callable[[dict[str, Any]], str | None] | None = None,
    target: Target | None = None,
    reads: Sequence[str] = (),
    body: Callable[[StepContext, Callable[[StepContext], Outcome]], Outcome] | None = None,
) -> CallStep:
    """A gateway call: ``build(ctx)`` gives the :class:`Call` (path arguments, request), ``result(ctx,
    answer)`` the outcome (default: advance with the answer as the output), ``adopt(ctx)`` reads back a
    call whose answer was lost. ``reads``: the earlier steps whose outputs it reads. ``body(ctx, send)``:
    a step body of its own around the call (``send(ctx)`` makes it): checks right before it, or the
    operation of another form in its place (a version's: v2 of a link's create where v3 is declared). A
    money step's body sends its declared operation or another form of the same act (the catalogue's
    ``gateway.FORM_OF``), nothing else that moves money (``tasks.runner.StepContext.call``): money in
    flight, the durable claim and the read-back of a lost answer are the declared operation's."""
    operation = _operation(name, operation)
    if (operation.moves_money or operation.notifies) and adopt is never_committed:
        # A lost answer is read back by adopt; never_committed would take "nothing read" for the gateway's
        # word, and a cancel would end the flow while the gateway holds its money (invariant 2).
        raise DefinitionError(
            "", name, f"{operation.name} moves money (or opens a page a customer pays on): give adopt=, the read-back "
            "of a lost answer by this flow's identity (an order's payment: use durapay.flows.payment; "
            "docs/deploys.md, Gateway calls)",
        )  # fmt: skip
    return CallStep(name, operation, build, result, adopt, when, customer_url, target, tuple(reads), body)


def _operation(step: str, operation: GatewayOperation[Any] | str) -> GatewayOperation[Any]:
    """The catalogue's operation, given or named (a definition error names an unknown one)."""
    if not isinstance(operation, str):
        return operation
    found = BY_NAME.get(operation)
    if found is None:
        raise DefinitionError("", step, f"no gateway operation named {operation!r} in the catalogue")
    return found


def wait_signal(
    name: str,
    signals: Sequence[str],
    on_signal: SignalHandler,
    on_deadline: Callable[[StepContext], Outcome],
    timeout: Callable[[StepContext], float] | float,
    *,
    when: Condition | None = None,
    customer_url: Callable[[dict[str, Any]], str | None] | None = None,
    close: Callable[[StepContext], None] | None = None,
    on_settle: Callable[[StepContext], Outcome] | None = None,
    reads: Sequence[str] = (),
) -> WaitStep:
    """Wait for one of ``signals`` (``on_signal`` reads each); at the deadline (``timeout`` seconds after
    the wait began) ``on_deadline`` reads the gateway instead of guessing."""
    seconds = float(timeout) if isinstance(timeout, int | float) else None
    timeout_of = (lambda ctx: seconds) if seconds is not None else timeout
    return WaitStep(name, tuple(signals), on_signal, on_deadline, timeout_of, when, customer_url, close, on_settle, tuple(reads))  # type: ignore[arg-type]


def timer(
    name: str,
    until: Callable[[StepContext], float | None],
    *,
    when: Condition | None = None,
    customer_url: Callable[[dict[str, Any]], str | None] | None = None,
    reads: Sequence[str] = (),
) -> SleepStep:
    """A durable timer: the flow sleeps until ``until(ctx)`` (POSIX seconds; None or past: go on)."""
    return SleepStep(name, until, when, customer_url, tuple(reads))


def step(
    fn: Callable[[StepInput], Any],
    *,
    name: str | None = None,
    retry: int | None = None,
    output: type[BaseModel] | None = None,
    when: Condition | None = None,
    reads: Sequence[str] = (),
) -> MerchantStep:
    """A step of the merchant's own code (named after ``fn`` unless ``name``). ``retry``: at most this
    many tries of a retryable error (default the engine's ``DURAPAY_RETRY__MAX_ATTEMPTS``); ``output``:
    a model its return value is checked against (part of the version)."""
    named = name or str(getattr(fn, "__name__", ""))
    if not named or named == "<lambda>":
        raise DefinitionError("", named, "a step of a lambda needs a name (name=...)")
    if retry is not None and not 1 <= retry <= MAX_TRIES:
        raise DefinitionError("", named, f"retry must be 1 to {MAX_TRIES} tries, not {retry}")
    return MerchantStep(named, fn, retry, output, when, None, tuple(reads))


def payment(
    name: str,
    operation: GatewayOperation[Any] | str,
    request: Callable[[StepContext], dict[str, Any]],
    *,
    when: Condition | None = None,
    reads: Sequence[str] = (),
) -> CallStep:
    """A payment call read as durapay's own payments are: ``request(ctx)`` gives the body (its
    ``order`` sent as the input's, with the flow's current gateway order id); AUTHORIZED or EXECUTED advances, a
    decline ends the flow failed with the ISO code, PENDING advances for a :func:`settle` step to read;
    an answer lost is read back from the order before anything is sent again. The flow's ``order_id``
    must name the input's order (``order_id=input_order_id``): a Flow without one is refused at load."""
    from durapay.workflows.flows._adopt import adopt_order_payment
    from durapay.workflows.flows._common import order_with_current_id, payment_result

    def build(ctx: StepContext) -> Call:
        body = dict(request(ctx))
        if "order" in body and getattr(ctx.input, "order", None) is not None:
            body["order"] = order_with_current_id(ctx, ctx.input.order)
        return Call(request=body)

    made = call(name, operation, build, result=payment_result, adopt=adopt_order_payment, when=when, reads=reads)
    return dataclasses.replace(made, needs_order=True)


def settle(name: str, source: str) -> CallStep:
    """Read the operation of payment step ``source`` until final, when it was answered PENDING (skipped
    otherwise); bounded, then a person looks."""
    from durapay.workflows.flows._common import settle_step

    return settle_step(name, source)


def input_order_id(data: Any) -> str:
    """A Flow's ``order_id`` for an input with the gateway's ``order.orderId``."""
    return str(data.order.orderId)


def summarize(data: Any, outputs: Any) -> dict[str, Any]:
    """A Flow's ``summary`` as durapay's payments have it: the last operation and every operation id."""
    from durapay.workflows.flows._common import summarize as summary

    return summary(data, outputs)


__all__ = [
    "Call",
    "DefinitionError",
    "Final",
    "Flow",
    "Retry",
    "StepContext",
    "StepInput",
    "Target",
    "call",
    "input_order_id",
    "payment",
    "settle",
    "step",
    "summarize",
    "timer",
    "wait_signal",
]
