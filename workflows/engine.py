"""The durable engine: start flows, run their steps under claims, and the Python API around them.

The Celery chain is the fast path; the Redis record is the truth (DESIGN.md). Every step runs as:

1. **claim** - a compare-and-set moves the flow to ``running`` with a lease and puts it on the ``due``
   set at the lease's end. A duplicate or late delivery finds the step claimed or done and returns.
   A claim taken over from a worker whose lease ran out marks the try *uncertain*.
2. **run** - ``tasks.runner.run_step``: reconcile first when the previous try may have reached the
   gateway, then call with the step's idempotency key (one per flow and step, never per try).
3. **complete** - one compare-and-set writes the step's output, the next state and the next due time;
   a stale worker's write is refused. Security tokens and order lookups are written *before* the
   complete, so a notification can always be checked once the flow says it waits for one.

Delays of every kind (backoff, polls, waits, timers, leases, a lost chain link) are scores on the
``due`` set; :meth:`Engine.dispatch_due` (run by ``durapay scheduler``) sends what is due.
"""

from __future__ import annotations

import builtins
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from pydantic import BaseModel, ValidationError

from config.settings import Settings
from gateway import SUCCESS_RESULTS, GatewayClient, describe_validation_error
from tasks.outcomes import Advance, Finish, NewOrder, Outcome, Poll, Retry, Sleep, Wait
from tasks.retry import RetryPolicy
from tasks.runner import StepContext, run_step
from workflows.clock import Clock, SystemClock
from workflows.keys import Keys, derived_id, step_idempotency_key
from workflows.signals import admit
from workflows.states import STOPPED, TERMINAL, FlowState
from workflows.steps import FlowDefinition, Step
from workflows.store import Change, FlowRecord, FlowStore, StartConflict, compact_json

log = logging.getLogger("durapay.engine")

__all__ = ["Claim", "Engine", "InputError", "NotFound", "OperatorError", "Sender", "StartConflict"]


class Sender(Protocol):
    def send(self, task_name: str, flow_id: str, step: str) -> None: ...

    def send_chain(self, flow_id: str, links: builtins.list[tuple[str, str]]) -> None: ...


@dataclass
class Claim:
    """A step held under a lease: the record as claimed, and the context to run the step in."""

    record: FlowRecord
    definition: FlowDefinition
    step: Step
    ctx: StepContext
    resend: bool


class InputError(Exception):
    """A flow input refused at ``start``: ``field`` says which, ``reason`` says why."""

    def __init__(self, kind: str, field: str, reason: str) -> None:
        super().__init__(f"{kind}: {field}: {reason}")
        self.kind = kind
        self.field = field
        self.reason = reason


class NotFound(Exception):
    """No flow with that id (or it expired after its retention time)."""


class OperatorError(Exception):
    """An operator asked for something the flow's state does not allow (say which and why)."""


def gateway_order_id(base: str, seq: int) -> str:
    """The gateway order id of attempt ``seq``: ``base`` first, then ``base-2``, ``base-3`` (27 characters max)."""
    if seq <= 0:
        return base
    suffix = f"-{seq + 1}"
    return base[: 27 - len(suffix)] + suffix


class Engine:
    """One per process. Give it the settings, a Redis client, the flow registry and a sender."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        registry: Mapping[str, FlowDefinition],
        *,
        sender: Sender | None = None,
        clock: Clock | None = None,
        client_factory: Callable[[], GatewayClient] | None = None,
        rng: random.Random | None = None,
        keys: Keys | None = None,
    ) -> None:
        self.settings = settings
        self.redis: Any = client
        self.registry = dict(registry)
        self.sender = sender
        self.clock = clock or SystemClock()
        self.keys = keys or Keys(prefix=settings.engine.key_prefix, partitions=settings.engine.partitions)
        self.store = FlowStore(client, self.keys, settings.engine.retention_days * 86400)
        self.retry_policy = RetryPolicy.from_settings(settings.retry, rng)
        self.lease = settings.engine.lease_seconds
        self._client_factory = client_factory or (lambda: GatewayClient(settings.gateway))
        self._client: GatewayClient | None = None
        self._client_pid = 0
        self._client_lock = threading.Lock()

    # -- the Python API ----------------------------------------------------------------------

    def definition(self, kind: str) -> FlowDefinition:
        try:
            return self.registry[kind]
        except KeyError:
            known = ", ".join(sorted(self.registry))
            raise InputError(kind, "kind", f"unknown flow kind; known kinds: {known}") from None

    def validate(self, kind: str, data: Mapping[str, Any] | BaseModel) -> BaseModel:
        definition = self.definition(kind)
        try:
            if isinstance(data, BaseModel):
                data = data.model_dump(mode="json", by_alias=True, exclude_none=True)
            return definition.input_model.model_validate(data)
        except ValidationError as exc:
            field, reason = describe_validation_error(exc)
            raise InputError(kind, field, reason) from None

    def start(
        self,
        kind: str,
        data: Mapping[str, Any] | BaseModel,
        key: str | None = None,
        *,
        run_at: float | None = None,
    ) -> FlowRecord:
        """Start a flow; with ``key``, a second start with the same key returns the first flow.

        With ``run_at`` (POSIX seconds, future) the flow sleeps on the due set until then: a durable
        timer, never a Celery ETA.

        Raises InputError (field, reason) before anything is written when the input is bad, and
        StartConflict when ``key`` was used for a different input.
        """
        definition = self.definition(kind)
        model = self.validate(kind, data)
        wire = model.model_dump(mode="json", by_alias=True, exclude_none=True)
        flow_id = derived_id("f", kind, key) if key else "f" + uuid.uuid4().hex[:24]
        now = self.clock.now()
        order_id = definition.order_id(model) if definition.order_id else ""
        ctx = self._context(flow_id, kind, "", model, {}, now, order_id)
        first = definition.first_step(ctx)
        if first is None:
            raise InputError(kind, "(input)", "no step of this flow applies to this input")
        record, created = self.store.create(
            flow_id,
            kind,
            first.name,
            wire,
            now=now,
            order_id=order_id,
            start_key=key or "",
            by="start",
            run_at=run_at,
            safety=self._safety,
        )
        if created and order_id:
            self._index_order(order_id, flow_id, take_over=False)
        if created and record.state is FlowState.READY:
            self._send_from(record, definition, first.name)
        return record

    def get(self, flow_id: str) -> FlowRecord:
        record = self.store.get(flow_id)
        if record is None:
            raise NotFound(f"no flow {flow_id!r}")
        return record

    def list(
        self,
        *,
        state: FlowState | None = None,
        kind: str | None = None,
        since: float | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> builtins.list[FlowRecord]:
        """Flows newest first, filtered by state, kind and age (``since`` = POSIX seconds)."""
        if state is not None:
            pairs = self.store.ids(state=state, since=since)
        elif kind is not None:
            pairs = self.store.ids(kind=kind, since=since)
        else:
            pairs = self.store.all_ids(since=since)
        found: builtins.list[FlowRecord] = []
        position = 0
        batch = max(limit, 50)
        for start in range(0, len(pairs), batch):
            for record in self.store.many(flow_id for _, flow_id in pairs[start : start + batch]):
                if kind is not None and record.kind != kind:
                    continue
                if state is not None and record.state is not state:
                    continue
                if position >= offset:
                    found.append(record)
                position += 1
                if len(found) >= limit:
                    return found
        return found

    def history(self, flow_id: str) -> builtins.list[dict[str, Any]]:
        self.get(flow_id)
        return self.store.history(flow_id)

    def signal(self, flow_id: str, name: str, payload: Mapping[str, Any] | None = None, *, by: str = "api") -> str:
        """Deliver a signal (``3ds_result``, ``form_completed``, ``notification``, ...): ``resumed``,
        ``stored`` (kept until the flow waits for it), ``finished`` or raise NotFound."""
        payload = admit(self.registry.get(self.get(flow_id).kind), name, payload, by=by)  # SignalRefused: workflows.signals
        result = self.store.signal(flow_id, name, payload or {}, now=self.clock.now(), by=by, safety=self._safety)
        if result == "missing":
            raise NotFound(f"no flow {flow_id!r}")
        if result == "resumed":
            record = self.get(flow_id)
            self._send_from(record, self.registry[record.kind], record.step)
        return result

    def cancel(self, flow_id: str, reason: str = "cancelled", *, by: str = "api") -> FlowRecord:
        """Cancel now, or at the end of the step in flight (whose effect is kept and reported)."""
        for _ in range(20):
            record = self.get(flow_id)
            if record.state in {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED}:
                raise OperatorError(f"flow {flow_id} already ended ({record.state}); nothing to cancel")
            if record.state is FlowState.RUNNING:
                self.store.request_cancel(flow_id)
                return self.get(flow_id)
            change = Change(FlowState.CANCELLED, f"cancelled: {reason}", {"outcome": compact_json({"reason": reason})})
            written = self.store.transition(record, change, now=self.clock.now(), by=by)
            if written is not None:
                if written.state in TERMINAL:
                    self.store.expire_orders(self._order_ids(written))
                return written
        raise OperatorError(f"flow {flow_id} kept changing; try again")

    def late_payment(self, flow_id: str, name: str, payload: Mapping[str, Any], *, by: str = "notification") -> bool:
        """A verified notification reports money taken after the flow ended without it (the customer
        paid on a page past our deadline, or after a cancel): never drop it. The flow moves to
        ``needs_attention`` with the notification kept as a signal, so a person either refunds the
        payment (a ``refund`` flow) or runs ``retry``, which lets the waiting step take it as its
        outcome. True when the flow was moved."""
        operation = payload.get("operation")
        if not isinstance(operation, Mapping) or operation.get("operationResult") not in SUCCESS_RESULTS:
            return False
        record = self.get(flow_id)
        if record.state not in {FlowState.FAILED, FlowState.CANCELLED}:
            return False
        seq = int(record.fields.get("sigseq") or 0) + 1
        now = self.clock.now()
        reported = {key: operation.get(key) for key in ("operationId", "orderId", "operationResult", "amount")}
        what = f"late payment: the gateway reports {reported['operationResult']} after the flow ended {record.state}"
        fields = {
            "sigseq": str(seq),
            f"sig:{seq}": compact_json({"name": name, "payload": dict(payload), "t": now}),
            "error": compact_json({"type": "LatePayment", "endedAs": record.state.value, "operation": reported}),
        }
        written = self.store.transition(record, Change(FlowState.NEEDS_ATTENTION, what, fields), now=now, by=by)
        if written is None:
            return self.late_payment(flow_id, name, payload, by=by)
        log.error("flow %s: %s (operation %s)", flow_id, what, reported["operationId"])
        return True

    def retry(self, flow_id: str, *, by: str = "api") -> FlowRecord:
        """Move a ``needs_attention`` flow on from its current step (reconciling first when its last
        try was ambiguous), or start a ``failed`` flow again from its first step on a fresh gateway
        order id and fresh idempotency keys."""
        record = self.get(flow_id)
        now = self.clock.now()
        definition = self.registry[record.kind]
        if record.state is FlowState.NEEDS_ATTENTION:
            # Whatever stopped the flow (an ambiguous error, a crash, a lost worker), the step's call
            # may have reached the gateway: read it back before calling again (a no-op for reads).
            fields: dict[str, str | None] = {"attempt": "0", "polls": "0", "reconcile": "1"}
            change = Change(FlowState.READY, "retry requested (reconcile first)", fields, due=now + self._safety)
        elif record.state is FlowState.FAILED:
            try:
                model = definition.input_model.model_validate(record.input)
            except ValidationError:
                raise OperatorError(
                    f"flow {flow_id}: its card data was erased when it ended; start a new flow with the card"
                ) from None
            ctx = self._context(flow_id, record.kind, "", model, {}, now, record.order_id)
            first = definition.first_step(ctx)
            assert first is not None
            seq = record.order_seq + 1
            base = definition.order_id(model) if definition.order_id else ""
            new_order = gateway_order_id(base, seq) if base else ""
            fields = {f"out:{name}": None for name in record.outputs}
            fields |= {signal.field: None for signal in record.signals}
            fields |= {
                "step": first.name,
                "attempt": "0",
                "polls": "0",
                "generation": str(record.generation + 1),
                "order_seq": str(seq),
                "order_id": new_order,
                "reconcile": None,
                "uncertain": None,
                "error": None,
                "outcome": None,
                "wait": None,
                "customer_url": None,
            }
            if new_order:
                self._index_order(new_order, flow_id)
            change = Change(FlowState.READY, "restarted after failure", fields, due=now + self._safety)
        else:
            raise OperatorError(f"flow {flow_id} is {record.state}; only failed or needs_attention flows are retried")
        written = self.store.transition(record, change, now=now, by=by)
        if written is None:
            raise OperatorError(f"flow {flow_id} changed meanwhile; look again")
        self._send_from(written, definition, written.step)
        return written

    def wait(self, flow_id: str, timeout: float = 30.0, *, states: frozenset[FlowState] = STOPPED) -> FlowRecord:
        """Block until the flow is in one of ``states`` (finished or needing a person), or TimeoutError."""
        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            record = self.get(flow_id)
            if record.state in states:
                return record
            if time.monotonic() >= deadline:
                raise TimeoutError(f"flow {flow_id} still {record.state} at step {record.step} after {timeout}s")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.25)

    # -- the worker side ---------------------------------------------------------------------

    def run_step(self, flow_id: str, step_name: str, *, worker: str = "", chained_next: str | None = None) -> str:
        """Claim, run and complete one step. Returns what happened (for logs and tests)."""
        claim = self.claim(flow_id, step_name, worker=worker)
        if isinstance(claim, str):
            return claim
        outcome = run_step(claim.step, claim.ctx, must_reconcile=claim.resend, resend=claim.resend)
        return self.complete(claim, outcome, chained_next=chained_next)

    def claim(self, flow_id: str, step_name: str, *, worker: str = "") -> Claim | str:
        """Take the step under a lease, or say why not: ``missing``, ``not-current``, ``leased``,
        ``stopped``, ``early`` (not due yet), ``lost-race`` (another claim won).

        One round trip (``claim.lua``) in the common case; a flow with a cancel request or a step
        reclaimed past its attempts takes the careful path (:meth:`_claim_carefully`)."""
        now = self.clock.now()
        owner = worker or f"pid-{os.getpid()}"
        taken = self.store.claim(
            flow_id,
            step_name,
            now=now,
            lease_until=now + self.lease,
            owner=owner,
            max_attempts=self.retry_policy.max_attempts,
        )
        if taken == "fallback":
            return self._claim_carefully(flow_id, step_name, worker=worker)
        if isinstance(taken, str):
            return taken
        claimed, previous = taken
        return self._claimed(claimed, step_name, now, owner, deadline_reached=previous is FlowState.WAITING)

    def _claim_carefully(self, flow_id: str, step_name: str, *, worker: str = "") -> Claim | str:
        """The claim read, decided and written in three steps (the rules ``claim.lua`` follows)."""
        now = self.clock.now()
        record = self.store.get(flow_id)
        if record is None:
            return "missing"
        if record.step != step_name:
            return "not-current"
        reclaim = False
        if record.state is FlowState.RUNNING:
            if record.lease_until is not None and record.lease_until > now:
                return "leased"
            reclaim = True
        elif record.state in STOPPED:
            return "stopped"
        elif record.state is not FlowState.READY and (record.due is None or record.due > now):
            return "early"
        lease_until = now + self.lease
        owner = worker or f"pid-{os.getpid()}"
        claim_fields: dict[str, str | None] = {
            "attempt": str(record.attempt + 1),
            "lease_until": repr(lease_until),
            "lease_owner": owner,
        }
        if reclaim:
            claim_fields["uncertain"] = "1"
            if record.attempt >= self.retry_policy.max_attempts:
                # The step's worker died holding it again and again (a crash, the OOM killer): stop
                # for a person instead of killing workers forever. ``retry`` reconciles first.
                lost = Change(
                    FlowState.NEEDS_ATTENTION,
                    f"{step_name}: its worker was lost {record.attempt} times",
                    {"lease_until": None, "lease_owner": None, "reconcile": "1", "error": compact_json({"type": "WorkerLost"})},
                )
                stopped = self.store.transition(record, lost, now=now, by=worker or f"pid-{os.getpid()}")
                return "lost-race" if stopped is None else str(stopped.state)
        what = f"claimed {step_name}" + (" after the lease ran out" if reclaim else "")
        claimed = self.store.transition(record, Change(FlowState.RUNNING, what, claim_fields, due=lease_until), now=now, by=owner)
        if claimed is None:
            return "lost-race"
        if claimed.state is not FlowState.RUNNING:
            return str(claimed.state)
        return self._claimed(claimed, step_name, now, owner, deadline_reached=record.state is FlowState.WAITING)

    def _claimed(self, claimed: FlowRecord, step_name: str, now: float, owner: str, *, deadline_reached: bool) -> Claim | str:
        """The claim handed to the step: its input typed again, its context built."""
        definition = self.registry[claimed.kind]
        try:
            model = definition.input_model.model_validate(claimed.input)
        except ValidationError as exc:  # an input the flow's model no longer accepts (a changed release)
            field, reason = describe_validation_error(exc)
            bad = Change(
                FlowState.NEEDS_ATTENTION,
                f"{step_name}: the stored input no longer validates: {field}: {reason}",
                {"lease_until": None, "lease_owner": None, "error": compact_json({"type": "InputError", "field": field})},
            )
            stopped = self.store.transition(claimed, bad, now=now, by=owner)
            return "lost-race" if stopped is None else str(stopped.state)
        ctx = self._context(claimed.id, claimed.kind, step_name, model, claimed.outputs, now, claimed.order_id, claimed)
        ctx.deadline_reached = deadline_reached
        return Claim(claimed, definition, definition.step(step_name), ctx, resend=claimed.reconcile or claimed.uncertain)

    def dispatch_due(self, *, batch: int | None = None) -> int:
        """Send every flow that is due (timers, retries, wait deadlines, lost links, dead workers)."""
        now = self.clock.now()
        sent = 0
        for partition in range(self.keys.partitions):
            ids = self.store.take_due(partition, now=now, batch=batch or self.settings.engine.dispatch_batch, grace=self.lease)
            for record in self.store.many(ids):
                if record.state in STOPPED:
                    continue
                self._send_from(record, self.registry[record.kind], record.step)
                sent += 1
        return sent

    # -- internals -----------------------------------------------------------------------------

    @property
    def _safety(self) -> float:
        """How long a flow whose step was just sent waits on the due set before the dispatcher sends it
        again: a lease when a sender delivers the step now, zero when only the dispatcher will."""
        return self.lease if self.sender is not None else 0.0

    def gateway(self) -> GatewayClient:
        """This process's gateway client (made after a fork, kept alive between calls)."""
        with self._client_lock:
            if self._client is None or self._client_pid != os.getpid():
                self._client = self._client_factory()
                self._client_pid = os.getpid()
            return self._client

    def _context(
        self,
        flow_id: str,
        kind: str,
        step: str,
        model: BaseModel,
        outputs: Mapping[str, dict[str, Any]],
        now: float,
        order_id: str,
        record: FlowRecord | None = None,
    ) -> StepContext:
        generation = record.generation if record else 0
        steps = self.registry[kind].steps if kind in self.registry else ()
        # Redis keeps no field order: give steps their outputs in the flow's step order.
        outputs = {step.name: outputs[step.name] for step in steps if step.name in outputs} | dict(outputs)
        key_step = f"{step}~{generation}" if generation else step
        return StepContext(
            flow_id=flow_id,
            kind=kind,
            step=step,
            input=model,
            outputs=dict(outputs),
            attempt=record.attempt if record else 0,
            now=now,
            idempotency_key=step_idempotency_key(flow_id, key_step),
            order_id=order_id,
            client=self.gateway() if record else _NoClient(),  # type: ignore[arg-type]
            signals=[(s.field, s.name, s.payload) for s in record.signals] if record else [],
            polls=record.polls if record else 0,
            wait_deadline=float(record.wait["deadline"]) if record and record.wait else None,
            notification_url=self.settings.receiver.public_url,
            retry=self.retry_policy,
        )

    def complete(self, claim: Claim, outcome: Outcome, *, chained_next: str | None = None) -> str:
        """Write the step's outcome in one compare-and-set; ``stale`` if the claim was taken over."""
        claimed, definition, step, ctx = claim.record, claim.definition, claim.step, claim.ctx
        now = self.clock.now()
        done: dict[str, str | None] = {"lease_until": None, "lease_owner": None, "uncertain": None}
        done |= {signal_field: None for signal_field in ctx.consumed}
        change: Change
        if isinstance(outcome, Advance):
            self._keep_tokens(ctx.order_id, claimed.id, outcome.output)
            ctx.outputs = {**ctx.outputs, step.name: outcome.output}
            following = definition.next_step(step.name, ctx)
            done |= {
                f"out:{step.name}": compact_json(outcome.output),
                "attempt": "0",
                "polls": "0",
                "reconcile": None,
                "error": None,
                "wait": None,
            }
            done |= self._customer_url(step, outcome.output)
            if following is None:
                summary = definition.summary(ctx.input, ctx.outputs)
                done["outcome"] = compact_json({**summary, "result": "succeeded"})
                change = Change(FlowState.SUCCEEDED, f"{step.name} done; flow succeeded", done)
            else:
                done["step"] = following.name
                change = Change(FlowState.READY, f"{step.name} done", done, due=now + self._safety, step=following.name)
        elif isinstance(outcome, Finish):
            if outcome.output:
                done[f"out:{step.name}"] = compact_json(outcome.output)
                ctx.outputs = {**ctx.outputs, step.name: outcome.output}
            summary = definition.summary(ctx.input, ctx.outputs)
            done["outcome"] = compact_json(
                {**summary, "result": "succeeded" if outcome.succeeded else "failed", "reason": outcome.reason}
            )
            done["error"] = compact_json(outcome.error) if outcome.error else None
            done["wait"] = None
            state = FlowState.SUCCEEDED if outcome.succeeded else FlowState.FAILED
            change = Change(state, f"{step.name}: {outcome.reason}", done)
        elif isinstance(outcome, Retry):
            done |= {"error": compact_json(outcome.error), "reconcile": "1" if outcome.reconcile else None}
            what = f"{step.name} will be retried in {outcome.after:.1f}s" + (" (reconcile first)" if outcome.reconcile else "")
            change = Change(FlowState.RETRYING, what, done, due=now + outcome.after)
        elif isinstance(outcome, Poll):
            done |= {"attempt": "0", "polls": str(claimed.polls + 1), "reconcile": None}
            change = Change(FlowState.RETRYING, f"{step.name}: {outcome.note or 'poll again'}", done, due=now + outcome.after)
        elif isinstance(outcome, Wait):
            wait = {"signals": list(outcome.signals), "deadline": outcome.deadline, "step": step.name}
            done |= {"wait": compact_json(wait), "attempt": "0", "reconcile": None}
            change = Change(
                FlowState.WAITING,
                outcome.note or f"{step.name} waits",
                done,
                due=outcome.deadline,
                awaited=outcome.signals,
            )
        elif isinstance(outcome, Sleep):
            done |= {"attempt": "0"}
            change = Change(FlowState.SLEEPING, f"{step.name}: sleeps until {outcome.until:.0f}", done, due=outcome.until)
        elif isinstance(outcome, NewOrder):
            seq = claimed.order_seq + 1
            base = definition.order_id(ctx.input) if definition.order_id else claimed.order_id
            new_order = gateway_order_id(base, seq)
            self._index_order(new_order, claimed.id)
            done |= {"order_seq": str(seq), "order_id": new_order, "attempt": "0", "reconcile": None}
            change = Change(
                FlowState.READY,
                f"{step.name}: {outcome.reason}; new gateway order {new_order}",
                done,
                due=now + self._safety,
            )
        else:
            done |= {"error": compact_json(outcome.error) if outcome.error else compact_json({"message": outcome.reason})}
            change = Change(FlowState.NEEDS_ATTENTION, f"{step.name}: {outcome.reason}", done)
        written = self.store.transition(claimed, change, now=now, by=claimed.lease_owner)
        if written is None:
            log.info("flow %s step %s: stale completion dropped", claimed.id, step.name)
            return "stale"
        if written.state in TERMINAL:
            self.store.expire_orders(self._order_ids(written))
        if written.state is FlowState.READY and written.step != chained_next:
            self._send_from(written, definition, written.step)
        return str(written.state)

    def _send_from(self, record: FlowRecord, definition: FlowDefinition, step_name: str) -> None:
        """Send the chain of the flow's next steps from ``step_name`` (the fast path)."""
        if self.sender is None:
            return
        links = [(step.task_name, step.name) for step in definition.segment(step_name)]
        try:
            self.sender.send_chain(record.id, links)
        except Exception:
            log.exception("flow %s: sending step %s failed; the dispatcher will pick it up", record.id, step_name)

    def _index_order(self, order_id: str, flow_id: str, *, take_over: bool = True) -> None:
        """Point notifications for ``order_id`` at ``flow_id``. A start that merely *names* an order id
        (``take_over=False``) never takes it from another live flow: the gateway will refuse the
        second order and that flow moves to ``<orderId>-2``; the first keeps its notifications."""
        key = self.keys.order(order_id)
        if take_over:
            self.redis.hset(key, "flow", flow_id)
            return
        if self.redis.hsetnx(key, "flow", flow_id):
            return
        holder = self.flow_for_order(order_id)
        held = self.store.get(holder) if holder and holder != flow_id else None
        if held is None or held.state in TERMINAL:
            self.redis.hset(key, "flow", flow_id)

    def _order_ids(self, record: FlowRecord) -> builtins.list[str]:
        """Every gateway order id the flow used (its first, then ``-2``, ``-3`` after new orders)."""
        definition = self.registry.get(record.kind)
        if not record.order_id or definition is None or definition.order_id is None:
            return [record.order_id] if record.order_id else []
        try:
            base = definition.order_id(definition.input_model.model_validate(record.input))
        except ValidationError:  # card data erased at the end: the current id is what we know
            return [record.order_id]
        return sorted({gateway_order_id(base, seq) for seq in range(record.order_seq + 1)} | {record.order_id})

    def _keep_tokens(self, order_id: str, flow_id: str, output: Mapping[str, Any]) -> None:
        token = output.get("securityToken")
        if order_id and isinstance(token, str) and token:
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(self.keys.tokens(order_id), token)
            pipe.hset(self.keys.order(order_id), "flow", flow_id)
            pipe.execute()

    @staticmethod
    def _customer_url(step: Step, output: Mapping[str, Any]) -> dict[str, str | None]:
        if step.customer_url is None:
            return {}
        url = step.customer_url(dict(output))
        return {"customer_url": url} if url else {}

    # -- notification support (used by the receiver) -------------------------------------------

    def flow_for_order(self, order_id: str) -> str | None:
        value: Any = self.redis.hget(self.keys.order(order_id), "flow")
        return value.decode() if value else None

    def tokens_for_order(self, order_id: str) -> builtins.list[str]:
        members: Any = self.redis.smembers(self.keys.tokens(order_id))
        return [token.decode() for token in members]


class _NoClient:
    """Stands in for the gateway client where no step runs (choosing a flow's first step at start)."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a step condition must not call the gateway")
