"""The worker's side of the engine: claim a step, run it, complete it; and the dispatcher's send.

Every step runs as:

1. **claim** - ``claim.lua`` decides and writes in one round trip: the flow moves to ``running`` with a
   lease and sits on the ``due`` set at the lease's end. A duplicate or late delivery finds the step
   claimed or done and returns. The script is the one home of every claim rule; Python only applies
   the two verdicts that end the claim instead (a cancel request, a worker lost too often).
2. **run** - ``tasks.runner.run_step``: reconcile first when a previous try may have reached the
   gateway, then call with the step's idempotency key (one per flow and step, never per try).
3. **complete** - one compare-and-set writes the step's outcome, the next state and the next due time;
   a stale worker's write is refused. Security tokens and order lookups are written *before* the
   complete, so a notification can always be checked once the flow says it waits for one.

A worker that follows a flow's steps (``follow_steps``) sends the next step's claim in the same round
trip as the completion (two scripts, one pipeline; each keeps its own checks), except on a cluster and
for a claim that must wait for durability before its step calls.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from pydantic import ValidationError

from durapay.config.tracing import TRACE_FIELD, FlowTag
from durapay.gateway import BY_NAME, describe_validation_error, reported_payment
from durapay.tasks.celery_tasks import ENGINE_STEP_TASK
from durapay.tasks.outcomes import Advance, Attention, Defer, Finish, Held, NewOrder, Outcome, Poll, Retry, Sleep, Wait
from durapay.tasks.runner import LeaseLost, NothingMoved, StepContext, run_step, settle
from durapay.workflows.engine import holders, inflight, versions
from durapay.workflows.engine.cards import CardKeyMissing, CardUnreadable
from durapay.workflows.engine.durability import NotDurable
from durapay.workflows.engine.fairness import ADMITTED, claim_token, key_of
from durapay.workflows.engine.keys import step_idempotency_key
from durapay.workflows.engine.orders import OrderIdsTaken
from durapay.workflows.engine.states import STOPPED, FlowState
from durapay.workflows.engine.steps import FlowDefinition, MerchantStep, Step, WaitStep
from durapay.workflows.engine.store import Change, ClaimRequest, FlowRecord, compact_json
from durapay.workflows.flows._common import operation_of
from durapay.workflows.late_payments import REFUND_KEY

if TYPE_CHECKING:
    from durapay.workflows.engine.api import Engine

log = logging.getLogger("durapay.engine")

#: Typed inputs kept per process (the oldest dropped first): enough for the flows in flight in a worker.
INPUT_CACHE = 2048


@dataclass
class Claim:
    """A step held under a lease: the record as claimed, and the context to run the step in."""

    record: FlowRecord
    definition: FlowDefinition
    step: Step
    ctx: StepContext
    resend: bool
    #: The token of the gateway target this try holds (``workflows.engine.targets``), once taken.
    hold_token: str | None = None
    #: ``kind@version`` the flow moves onto with this step's completion (a declared migration), or None.
    moved_to: str | None = None


@dataclass(frozen=True)
class Ran:
    """What running a claimed step gave: its outcome (None: cancel the flow now, nothing in flight), and
    the fields of money in flight the completion must write besides (a read that found nothing moved)."""

    outcome: Outcome | None
    settled: dict[str, str | None] = dataclasses.field(default_factory=dict)


class StepProtocol:
    """Claim, complete, dispatch. One per engine; it reads the engine's store, registry and settings."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: Told of every step this process ran: (flow kind, step, seconds from claim to completion, what
        #: happened). The worker's metrics (``service.metrics``) listen here.
        self.observer: Callable[[str, str, float, str], None] | None = None
        self._inputs: dict[tuple[str, str], Any] = {}
        self._inputs_lock = threading.Lock()
        self._money_ops: dict[str, str] = {}

    # -- claim ---------------------------------------------------------------------------------

    def claim(self, flow_id: str, step_name: str, *, worker: str = "", money: bool | None = None) -> Claim | str:
        """Take the step under a lease, or say why not: ``missing``, ``not-current``, ``leased``,
        ``stopped``, ``early`` (not due yet), ``lost-race`` (another writer won), or the state a
        cancel request or a too often lost worker moved the flow to.

        ``money``: the caller knows the step moves money (its task is a call the gateway cannot
        deduplicate): the claim is made durable in the same exchange (see ``FlowStore.claim``)."""
        request = self._request(flow_id, step_name, self.engine.clock.now(), worker, bool(money))
        try:
            taken = self.engine.store.claim(**dataclasses.asdict(request))
        except NotDurable as exc:
            log.warning("%s; the step waits for its lease to run out, then reads the gateway first", exc)
            return "not-durable"
        return self._judge(taken, request)

    def _request(self, flow_id: str, step_name: str, now: float, worker: str, money: bool) -> ClaimRequest:
        engine = self.engine
        return ClaimRequest(
            flow_id,
            step_name,
            now,
            now + engine.lease,
            worker or f"pid-{os.getpid()}",
            engine.retry_policy.max_attempts,
            engine.settings.engine.max_step_runs,
            money,
            self.money_ops(step_name),
        )

    def money_ops(self, step_name: str) -> str:
        """``claim.lua``'s ARGV of money in flight: per definition (``kind@version``) whose step ``step_name``
        moves money, the operation it calls (and per kind, for a record naming no definition), and the
        format the mark carries (``inflight.MARK_FORMAT``), as JSON; or "" (the script learns the
        definition from the record it claims)."""
        found = self._money_ops.get(step_name)
        if found is None:
            ops: dict[str, str] = {}
            runs_on = [((kind, version), definition) for (kind, version), definition in self.engine.held.items()]
            # A flow of a version migrating onto a newer one runs the newer one's step (or is parked, and the
            # mark its claim made is settled: StepProtocol._park).
            runs_on += [(key, new) for key, (_old, new) in versions.migrations(self.engine.registry).items()]
            for (kind, version), definition in runs_on:
                if step_name in definition.step_index and (op := inflight.money_operation(definition.step(step_name))):
                    ops[f"{kind}@{version}"] = op
                    ops.setdefault(kind, op)  # (the current version first: versions.held keeps that order)
            found = self._money_ops[step_name] = compact_json({"ops": ops, "v": inflight.MARK_FORMAT}) if ops else ""
        return found

    def _judge(self, taken: tuple[str, FlowRecord] | str, request: ClaimRequest) -> Claim | str:
        """Apply ``claim.lua``'s verdict: the claim handed to the step, or why there is none."""
        if isinstance(taken, str):
            return taken
        step_name, now, owner = request.step, request.now, request.owner
        verdict, record = taken
        if verdict == "lost":
            # The step's worker died holding it again and again (a crash, the OOM killer): stop for a
            # person instead of killing workers forever. ``retry`` reconciles first.
            lost = Change(
                FlowState.NEEDS_ATTENTION,
                f"{step_name}: its worker was lost {record.attempt} times",
                {"lease_until": None, "lease_owner": None, "reconcile": "1", "error": compact_json({"type": "WorkerLost"})},
            )
            return self._stop(record, lost, now, owner)
        if verdict == "looping":
            # Every loop of the engine has its own bound; this is the one under all of them.
            looping = Change(
                FlowState.NEEDS_ATTENTION,
                f"{step_name}: claimed {record.fields.get('runs')} times without moving on",
                {"lease_until": None, "lease_owner": None, "reconcile": "1", "error": compact_json({"type": "TooManyRuns"})},
            )
            return self._stop(record, looping, now, owner)
        return self._claimed(record, step_name, now, owner, durable=request.durable)

    def _park(self, record: FlowRecord, step_name: str, now: float, owner: str, why: str) -> str:
        """Park a claimed flow this process may not run (a migration refused): its attempt and run given
        back, offered again after ``park_seconds`` as claim.lua's parking does."""
        fields = {"lease_until": None, "lease_owner": None, **_given_back(record), **inflight.unclaimed(record)}
        again = now + self.engine.store.park_seconds
        return self._stop(record, Change(FlowState.PARKED, f"{step_name}: parked: {why}", fields, due=again), now, owner)

    def _stop(self, record: FlowRecord, change: Change, now: float, owner: str) -> str:
        written = self.engine.store.transition(record, change, now=now, by=owner)
        if written is None:
            return "lost-race"
        return str(written.state)

    def _refund_ended(self, refund: FlowRecord) -> None:
        """A late payment's refund flow ended: close the flow it refunded for (``workflows.late_payments``).
        Never fails the step: asking to refund again closes it too."""
        try:
            self.engine.late.refund_ended(refund)
        except Exception:
            log.exception("flow %s: closing the late payment it refunded failed; refund-late-payment closes it", refund.id)

    def _tell_holder(self, written: FlowRecord) -> None:
        """The flow changed something at the gateway that another flow holds (a renewed link), and its
        completion wrote that it owes that flow a tell (``workflows.engine.holders``): told now, and the
        debt dropped; else the packing pass tells it."""
        if holders.tell_owed(self.engine.tell_holder, written.id, written.fields):
            try:
                self.engine.store.drop_field(written.id, holders.FIELD)
            except redis.RedisError as exc:  # told: the packing pass tells it once more, which is harmless
                log.info("flow %s: its tell is done, its mark stays (%s)", written.id, exc)

    def _shown(self, flow_id: str) -> None:
        """A completion that gives the flow a customer URL (a page, a 3DS challenge) is made durable at
        once: the merchant hands that URL to the customer, so Redis must not forget it (nor the page's
        notification token, written before it). Forgotten, the step would run again, find the order
        unpaid and move to a fresh order id, while the customer pays the page they were given."""
        try:
            self.engine.store.sync(flow_id, f"customer URL of flow {flow_id}")
        except NotDurable as exc:
            log.warning("%s; the customer URL is shown before it is durable", exc)

    def _claimed(self, claimed: FlowRecord, step_name: str, now: float, owner: str, *, durable: bool = False) -> Claim | str:
        """The claim handed to the step: its input typed again, its context built."""
        engine = self.engine
        # claim.lua parked a flow whose definition this process does not hold: what it claimed, it holds,
        # or declares a migration from (workflows.engine.versions.migration decides here whether the flow may move).
        definition = engine.definition_for(claimed)
        moved_to = None
        if definition is None and (migration := engine.migration_for(claimed)) is not None:
            old, new = migration
            refused = versions.migration(old, new, step_name, (claimed.unsettled or {}).get("step"))
            if refused is not None:
                return self._park(claimed, step_name, now, owner, f"no migration to {versions.label(new)}: {refused}")
            definition, moved_to = new, versions.label(new)
        definition = definition or engine.registry[claimed.kind]
        if claimed.terminal not in engine.terminals.gates:
            # Its terminal is not in this process's settings (a process started before it was declared, or
            # after it was removed): parked like a definition it does not hold, never run on another
            # terminal's key (workflows.engine.terminals). A process whose settings declare it takes it on.
            why = f"terminal {claimed.terminal!r} is not in this process's settings (DURAPAY_TERMINALS)"
            return self._park(claimed, step_name, now, owner, why)
        try:
            model = self._typed_input(definition, claimed, claimed.fields.get("input") or "{}")
        except (CardKeyMissing, CardUnreadable) as exc:  # its card key is not configured here (or was removed)
            bad = Change(
                FlowState.NEEDS_ATTENTION,
                f"{step_name}: the card data does not open: {exc}",
                {"lease_until": None, "lease_owner": None, "error": compact_json({"type": type(exc).__name__})},
            )
            stopped = engine.store.transition(claimed, bad, now=now, by=owner)
            return "lost-race" if stopped is None else str(stopped.state)
        except ValidationError as exc:  # an input the flow's model no longer accepts (a changed release)
            field, reason = describe_validation_error(exc)
            bad = Change(
                FlowState.NEEDS_ATTENTION,
                f"{step_name}: the stored input no longer validates: {field}: {reason}",
                {"lease_until": None, "lease_owner": None, "error": compact_json({"type": "InputError", "field": field})},
            )
            stopped = engine.store.transition(claimed, bad, now=now, by=owner)
            return "lost-race" if stopped is None else str(stopped.state)
        ctx = self.context(claimed.id, claimed.kind, step_name, model, claimed.outputs, now, claimed.order_id, claimed)
        # Judged from the record, not from how the step was woken: a deadline read that failed and is
        # retried must read again, not wait again (which would start its attempts over, forever).
        ctx.deadline_reached = ctx.wait_deadline is not None and now >= ctx.wait_deadline

        fair = key_of(claimed.fields) if engine.caps.caps else ""
        capped = bool(fair) and engine.caps.capped(fair)
        token = claim_token(claimed.version, claimed.lease_owner)
        if capped:  # the claim holds its flow's place, for its lease (workflows.engine.fairness.Caps)
            engine.caps.take(fair, claimed.id, token, claimed.lease_until or now + engine.lease)

        def renew_lease() -> None:
            lease_until = engine.clock.now() + engine.lease
            if not engine.store.renew(claimed, lease_until=lease_until):
                raise LeaseLost(f"flow {claimed.id} step {step_name}: the claim is no longer {owner}'s")
            if capped:  # the place lapses with the lease: a step that renews it keeps counting
                engine.caps.take(fair, claimed.id, token, lease_until, renew=True)

        ctx.renew_lease = renew_lease
        step = definition.step(step_name)
        if isinstance(step, MerchantStep):
            kept_field = kept_field_of(ctx)
            kept_text = claimed.fields.get(kept_field)
            ctx.kept_output = json.loads(kept_text) if kept_text else None

            def keep_output(output: dict[str, Any]) -> dict[str, Any]:
                kept = engine.store.keep_output(claimed, kept_field, output)
                if kept is None:
                    raise LeaseLost(f"flow {claimed.id} step {step_name}: the claim is no longer {owner}'s")
                return kept

            ctx.keep_output = keep_output
        if not durable and writes(step):
            # Before a write at the gateway (money moves), the claim must be durable: if Redis lost it,
            # the step would run again as if it never had (or a cancel would end the flow) without
            # reading the gateway first. Keyed calls too: a key is not remembered for ever.
            try:
                engine.store.sync(claimed.id, f"claim of {step_name} of flow {claimed.id}")
            except NotDurable as exc:
                log.warning("%s; the step waits for its lease to run out, then reads the gateway first", exc)
                return "not-durable"
        claim = Claim(claimed, definition, step, ctx, resend=inflight.reads_first(claimed), moved_to=moved_to)
        target = getattr(step, "target", None)
        if target is not None:  # a money call on a shared gateway target: one at a time (workflows.engine.targets)
            engine.targets.prepare(claim, target)
        return claim

    def _typed_input(self, definition: FlowDefinition, record: FlowRecord, text: str) -> Any:
        """The stored input as its model, its card data opened (``workflows.engine.cards``: it is stored
        sealed), read once per process and input: every step of a flow reads the same input, and
        validating it again at each step was a visible share of a step's CPU. (Steps never change their
        input; card data is erased only once the flow has ended.) In this process's memory only."""
        key = (definition.kind, text)
        model = self._inputs.get(key)
        if model is None:
            model = definition.input_model.model_validate(self.engine.cards.open(record.id, record.input))
            with self._inputs_lock:
                if len(self._inputs) >= INPUT_CACHE:
                    self._inputs.pop(next(iter(self._inputs)))
                self._inputs[key] = model
        return model

    def context(
        self,
        flow_id: str,
        kind: str,
        step: str,
        model: Any,
        outputs: Mapping[str, dict[str, Any]],
        now: float,
        order_id: str,
        record: FlowRecord | None = None,
    ) -> StepContext:
        engine = self.engine
        generation = record.generation if record else 0
        steps = engine.registry[kind].steps if kind in engine.registry else ()
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
            orders=list(record.orders) if record else ([order_id] if order_id else []),
            created=record.created if record else now,
            client=engine.gateway(record.terminal) if record else _NoClient(),  # type: ignore[arg-type]
            signals=[(s.field, s.name, s.payload) for s in record.signals] if record else [],
            polls=record.polls if record else 0,
            wait_deadline=float(record.wait["deadline"]) if record and record.wait else None,
            wait_since=_wait_since(record, step, now, engine.store.history),
            notification_url=engine.settings.receiver.public_url,
            retry=engine.retry_policy,
            maybe_sent_at=inflight.sent_at(record) if record else now,
            order_holder=engine.orders.flow_for,
            operation_holder=engine.store.flow_for_operation,
            operation_order=self.operation_order,
            gate=engine.terminals.gate(record.terminal) if record else None,
            slot=_number(record.fields.get("gate_slot")) if record else None,
        )

    def operation_order(self, operation_id: str) -> str | None:
        """The gateway order of operation ``operation_id`` as the flow that recorded it holds it (its ``op:``
        lookup names the flow; the flow's outputs keep the operation as the gateway answered it, with its
        ``orderId``), or None: durapay made no such operation, or no longer keeps its flow."""
        flow_id = self.engine.store.flow_for_operation(operation_id)
        record = self.engine.store.get(flow_id) if flow_id else None
        for output in (record.outputs if record is not None else {}).values():
            operation = operation_of(output) if isinstance(output, dict) else None
            if operation is not None and str(operation.get("operationId")) == operation_id and operation.get("orderId"):
                return str(operation["orderId"])
        return None

    # -- run and complete -------------------------------------------------------------------------

    def run_step(
        self,
        flow_id: str,
        step_name: str,
        *,
        worker: str = "",
        chained_next: str | None = None,
        money: bool | None = None,
        follow: int = 0,
    ) -> str:
        """Claim, run and complete one step. Returns what happened (for logs and tests).

        ``follow``: then go on with the flow's next step, up to ``follow`` more, for as long as each
        leaves the flow ``ready`` (its next step due now): each is claimed, run and completed exactly
        like a step sent as its own task, without the queue's round trip between them (a Celery task
        costs a worker more CPU than everything durability adds to a step), and claimed in the same
        round trip as the completion before it (``FlowStore.transition_then_claim``). A worker that
        dies in between leaves the next step on the due set, where the dispatcher finds it."""
        began = time.perf_counter()
        claim = self.claim(flow_id, step_name, worker=worker, money=money)
        if isinstance(claim, str) or not self.engine.caps.caps or not self.engine.caps.capped(key_of(claim.record.fields)):
            # A refused claim releases nothing: the flow's place (if it was sent under a cap) may be the
            # claim that refused it's (a message twice), else it lapses and the dispatcher refills it.
            return self._run_steps(claim, began, worker, chained_next, follow, [])
        result = FlowState.FAILED.value  # what an exception leaves: the place given back
        claims = [claim]
        try:
            result = self._run_steps(claim, began, worker, chained_next, follow, claims)
            return result
        finally:
            # Left ready, the flow's next step is on its way (sent by the completion, or the chain's next
            # link): it keeps its place, or each step of a flow would free one (and its next step run over
            # the cap). Anywhere else (waiting, sleeping, ended) the place goes to a held flow: the place
            # of the last claim made here, given back only while it is that claim's (a stale try's flow
            # runs on the worker that took it over, in its place).
            if result != FlowState.READY.value:
                last = claims[-1].record
                self._release(last, claim_token(last.version, last.lease_owner))

    def _run_steps(
        self, claim: Claim | str, began: float, worker: str, chained_next: str | None, follow: int, claims: list[Claim]
    ) -> str:
        """:meth:`run_step`'s loop from its first claim; each claim it makes after it is appended to ``claims``."""
        while not isinstance(claim, str):
            result, written, following = self._run_claimed(claim, chained_next, inline=follow > 0)
            if self.observer is not None:
                self.observer(claim.record.kind, claim.step.name, time.perf_counter() - began, result)
            if follow <= 0:
                return result
            began = time.perf_counter()
            if following is None:
                if written is None or written.state is not FlowState.READY:
                    return result
                definition = self.engine.definition_for(written)
                if definition is None or written.step not in definition.step_index:
                    return result  # not this process's to run: its due entry sends it (and parks it where no one holds it)
                following = self.claim(written.id, written.step, worker=worker, money=writes(definition.step(written.step)))
            follow -= 1
            chained_next = None
            claim = following
            if not isinstance(claim, str):
                claims.append(claim)
        return claim

    def _run_claimed(
        self, claim: Claim, chained_next: str | None, *, inline: bool
    ) -> tuple[str, FlowRecord | None, Claim | str | None]:
        """Run a claimed step and complete it: (what happened, the record as its completion wrote it if
        it did, and with ``inline`` the claim of the next step when it was made with the completion)."""
        tracing = self.engine.tracing
        if tracing.on:
            record = claim.record
            with tracing.step_span(
                FlowTag(record.id, record.kind, record.terminal),
                claim.step.name,
                link=record.fields.get(TRACE_FIELD, ""),
                attempt=record.attempt,
                state_before=record.claimed_from,
                recovery=claim.resend,
            ) as span:
                done = self._run_and_finish(claim, chained_next, inline=inline)
                span.ended(done[0], str(done[1].state) if done[1] is not None else "")
                return done
        return self._run_and_finish(claim, chained_next, inline=inline)

    def _run_and_finish(
        self, claim: Claim, chained_next: str | None, *, inline: bool
    ) -> tuple[str, FlowRecord | None, Claim | str | None]:
        try:
            ran = self.run(claim)
        except LeaseLost as lost:
            log.warning("%s; its result is dropped", lost)
            return "stale", None, None
        return self.finish(claim, ran, chained_next, inline=inline)

    def run(self, claim: Claim) -> Ran:
        """Run a claimed step: its outcome, or (``outcome`` None) that the flow is to be cancelled now.
        Raises LeaseLost when the claim was taken over before a call."""
        record = claim.record
        if not (record.cancel_requested or record.ending):
            return Ran(run_step(claim.step, claim.ctx, must_reconcile=claim.resend, resend=claim.resend))
        # To end (a cancel asked, or a failure owed) while money may be in flight: no new money call,
        # only the read that tells what the earlier one did (tasks.runner.settle).
        found = settle(claim.step, claim.ctx, unsettled=inflight.in_flight(record), cancelling=record.cancel_requested)
        if isinstance(found, Wait) and record.ending and not record.cancel_requested:
            # The read shows the customer can still pay (a wait's read that failed, then read again): the
            # failure is no longer owed, the wait goes on.
            return Ran(found, {"ending": None})
        if not isinstance(found, NothingMoved):
            return Ran(found)
        if record.cancel_requested or not record.ending:
            return Ran(None, inflight.nothing_moved())
        return Ran(_owed_failure(record.ending), inflight.nothing_moved())

    def finish(
        self, claim: Claim, ran: Ran, chained_next: str | None = None, *, inline: bool = False
    ) -> tuple[str, FlowRecord | None, Claim | str | None]:
        """Complete a step :meth:`run` ran (see :meth:`_run_claimed`)."""
        if ran.outcome is None:
            record = claim.record
            what = "cancelled as requested" + (": the gateway shows no money moved" if inflight.in_flight(record) else "")
            answered = {signal_field: None for signal_field in claim.ctx.consumed}  # the read answered them
            cancel = Change(FlowState.CANCELLED, what, {"lease_until": None, "lease_owner": None, **answered, **ran.settled})
            stopped = self._stop(record, cancel, self.engine.clock.now(), record.lease_owner)
            if claim.ctx.hold_target is not None:
                self.engine.targets.release(claim)
            return stopped, None, None
        return self._complete(claim, ran.outcome, chained_next, inline=inline, settled=ran.settled)

    def complete(self, claim: Claim, outcome: Outcome, *, chained_next: str | None = None) -> str:
        """Write the step's outcome in one compare-and-set; ``stale`` if the claim was taken over."""
        return self._complete(claim, outcome, chained_next, inline=False)[0]

    def _complete(
        self,
        claim: Claim,
        outcome: Outcome,
        chained_next: str | None,
        *,
        inline: bool,
        settled: dict[str, str | None] | None = None,
    ) -> tuple[str, FlowRecord | None, Claim | str | None]:
        engine = self.engine
        claimed, definition, step, ctx = claim.record, claim.definition, claim.step, claim.ctx
        now = engine.clock.now()
        done: dict[str, str | None] = {"lease_until": None, "lease_owner": None, "uncertain": None}
        done |= {signal_field: None for signal_field in ctx.consumed}
        if claim.moved_to is not None:  # a declared migration: the flow runs on the new version from now on
            done["definition"] = claim.moved_to
        if _unanswered_write(ctx, outcome):
            # The one home of "this try's write got no answer": it may still act at the gateway, and the late
            # window (tasks.runner.settle) starts now, whatever the flow does next: retried, deferred by the
            # gate, or stopped for a person (its last attempt, an outage bound). A lost worker's lease end
            # is claim.lua's to record.
            done["maybe_sent"] = repr(now)
        if isinstance(outcome, Defer):
            outcome = self._outage_bound(claim, outcome, now)
        if not isinstance(outcome, Defer | Held):
            # The gateway answered (or the bound was reached): the outage is over for this flow.
            done |= {name: None for name in ("gateway_since", "gateway_due", "gate_slot") if claimed.fields.get(name)}
        change: Change
        if isinstance(outcome, Defer):
            change = self._deferred(claim, outcome, done, now)
        elif isinstance(outcome, Held):
            change = self._held(claim, outcome, done, now)
        elif isinstance(outcome, Advance):
            engine.orders.keep_token(ctx.order_id, claimed.id, outcome.output)
            ctx.outputs = {**ctx.outputs, step.name: outcome.output}
            following = definition.next_step(step.name, ctx)
            done |= {
                f"out:{step.name}": compact_json(outcome.output),
                "attempt": "0",
                "polls": "0",
                "runs": None,
                "reconcile": None,
                "error": None,
                "wait": None,
            }
            done |= _customer_url(step, outcome.output)
            if isinstance(step, MerchantStep):
                done[kept_field_of(ctx)] = None  # recorded as the step's output now: the copy kept for a lost worker goes
            if following is None:
                summary = definition.summary(ctx.input, ctx.outputs)
                done["outcome"] = compact_json({**summary, "result": "succeeded"})
                change = Change(FlowState.SUCCEEDED, f"{step.name} done; flow succeeded", done)
            else:
                done["step"] = following.name
                change = Change(FlowState.READY, f"{step.name} done", done, due=now + engine.safety, step=following.name)
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
            # A wait that fails (its deadline passed) while the signal it awaits arrived meanwhile must
            # read that signal first: the script turns the failure into another run of the step.
            awaited = step.signals if isinstance(step, WaitStep) and not outcome.succeeded else ()
            change = Change(state, f"{step.name}: {outcome.reason}", done, awaited=awaited)
        elif isinstance(outcome, Retry):
            # Once a call of this step may have reached the gateway (an ambiguous error, a lost worker),
            # that stays true until the step is done: a later 429 or 5xx of a resend proves nothing
            # about the earlier request, which may still be on its way to commit.
            done |= {"error": compact_json(outcome.error), **inflight.unanswered(claimed, outcome.reconcile)}
            reconcile = bool(done["reconcile"])
            what = f"{step.name} will be retried in {outcome.after:.1f}s" + (" (reconcile first)" if reconcile else "")
            change = Change(FlowState.RETRYING, what, done, due=now + outcome.after)
        elif isinstance(outcome, Poll):
            done |= {"attempt": "0", "polls": str(claimed.polls + 1), "reconcile": None}
            change = Change(FlowState.RETRYING, f"{step.name}: {outcome.note or 'poll again'}", done, due=now + outcome.after)
        elif isinstance(outcome, Wait):
            wait = {"signals": list(outcome.signals), "deadline": outcome.deadline, "step": step.name, "since": ctx.wait_since}
            done |= {"wait": compact_json(wait), "attempt": "0", "reconcile": None}
            if ctx.consumed or (ctx.deadline_reached and outcome.deadline >= now + engine.retry_policy.read_pace_seconds):
                # Woken by a signal it took (a customer's notification, a merchant's signal), or a read at
                # its deadline that waits on at least the read pace (an open link read while it waits, a
                # PENDING payment read again): progress made, not a loop, so its runs count afresh
                # (``claim.lua``'s bound is for a step that never moves on; a replayed notification, or a
                # year of a link's reads, must not stop a flow that waits for its customer). Time bounds
                # these: at most one run per read pace.
                done["runs"] = None
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
        elif isinstance(outcome, NewOrder) and (fresh := self._new_order(definition, claimed, ctx)) is not None:
            seq, new_order = fresh
            done |= {
                "order_seq": str(seq),
                "order_id": new_order,
                "orders": compact_json([*claimed.orders, new_order]),
                "attempt": "0",
                "reconcile": None,
            }
            change = Change(
                FlowState.READY,
                f"{step.name}: {outcome.reason}; new gateway order {new_order}",
                done,
                due=now + engine.safety,
            )
        else:
            if isinstance(outcome, NewOrder):  # no derived order id left that is not another flow's
                outcome = Attention(f"{outcome.reason}; no fresh order id: every one tried is another flow's")
            done |= {"error": compact_json(outcome.error) if outcome.error else compact_json({"message": outcome.reason})}
            change = Change(FlowState.NEEDS_ATTENTION, f"{step.name}: {outcome.reason}", done)
        # Money in flight: settled, told its operation, or kept, from what the gateway answered; written
        # in this same compare-and-set, which will not let the flow end while it is kept (transition.lua).
        money = {**inflight.after(step, claimed, outcome, sent=not ctx.kept_from_call), **(settled or {})}
        change = dataclasses.replace(change, fields={**change.fields, **money})
        paid = _payment_recorded(outcome)
        if paid:
            change = dataclasses.replace(change, paid=paid)
            if not isinstance(outcome, Attention) and inflight.moved(claimed) is None:
                # Kept for the rest of the flow: transition.lua ends no flow failed once its money moved.
                change = dataclasses.replace(change, fields={**change.fields, "money_moved": compact_json(paid)})
        call = _call_made(step, claimed, outcome, now, reconcile=claim.resend or claimed.reconcile, made=ctx.calls)
        if call:
            change = dataclasses.replace(change, call=call)
        if definition.tells_holder and change.state is FlowState.SUCCEEDED:
            # What the change owes the flow holding its order, written with the change (workflows.engine.holders).
            change = dataclasses.replace(
                change, fields={**change.fields, holders.FIELD: holders.owed(definition.tells_holder, step.name)}
            )
        following_claim: Claim | str | None = None
        next_step = definition.step(change.step or claimed.step) if change.state is FlowState.READY else None
        request = self._request(claimed.id, next_step.name, now, claimed.lease_owner, writes(next_step)) if next_step else None
        if inline and request is not None and engine.store.claims_with_transition(request):
            written, taken = engine.store.transition_then_claim(claimed, change, request, now=now, by=claimed.lease_owner)
            following_claim = self._judge(taken, request)
        else:
            written = engine.store.transition(claimed, change, now=now, by=claimed.lease_owner)
        if written is None:
            log.info("flow %s step %s: stale completion dropped", claimed.id, step.name)
            return "stale", None, following_claim
        if ctx.hold_target is not None:
            engine.targets.release(claim)  # its call resolved: the target goes to whoever waits for it
        if done.get("customer_url"):
            self._shown(claimed.id)
        if written.finished and written.start_key.startswith(REFUND_KEY):
            self._refund_ended(written)
        if written.fields.get(holders.FIELD) and written.finished:
            self._tell_holder(written)
        if written.state is FlowState.READY and written.step != chained_next and not inline:
            self.send_from(written, written.step)
        return str(written.state), written, following_claim

    def _deferred(self, claim: Claim, outcome: Defer, done: dict[str, str | None], now: float) -> Change:
        """The flow waits in ``retrying`` for the gate (``workflows.engine.gate``): the breaker's end, jittered so
        that the backlog does not come back at once, or its own reserved limiter slot. The attempt and the
        run its claim counted (claim.lua) are given back: the gateway's state is no fault of the flow's.
        Kept on the flow, for ``outage_seconds``: when this outage began for it (``gateway_since``, see
        :meth:`_outage_since`) and when the gate told it to come back (``gateway_due``)."""
        claimed, step = claim.record, claim.step
        done |= {
            "error": compact_json({**outcome.error, "reason": outcome.reason}),
            "gate_slot": repr(outcome.slot) if outcome.slot is not None else None,
        }
        done |= inflight.unanswered(claimed, outcome.reconcile)  # the call that opened the breaker may have acted
        done |= _given_back(claimed)
        if self._outage_since(claimed, now) is None:
            done["gateway_since"] = repr(now)
        after = outcome.after
        if outcome.slot is None:
            after += self.engine.gate_rng.uniform(0.0, 1.0 + 0.25 * self.engine.terminals.health(claimed.terminal).open_seconds)
        done["gateway_due"] = repr(now + after)
        what = f"{step.name}: {outcome.reason}; tried again in {after:.1f}s (no attempt used)"
        return Change(FlowState.RETRYING, what, done, due=now + after)

    def _held(self, claim: Claim, outcome: Held, done: dict[str, str | None], now: float) -> Change:
        """The flow waits in ``retrying`` for another flow's money call on its gateway target to be
        resolved (``workflows.engine.targets``): woken when it is, at the latest after ``outcome.after``. As for a
        Defer, the attempt and the run its claim counted are given back: the wait is no fault of the
        flow's, and no call was sent."""
        claimed, step = claim.record, claim.step
        done |= {
            "error": compact_json({**outcome.error, "reason": outcome.reason}),
            "reconcile": "1" if inflight.reads_first(claimed) else None,
        }
        done |= _given_back(claimed)
        what = f"{step.name}: {outcome.reason}; tried again once it is, in {outcome.after:.0f}s at the latest (no attempt used)"
        return Change(FlowState.RETRYING, what, done, due=now + outcome.after)

    def _outage_since(self, claimed: FlowRecord, now: float) -> float | None:
        """When the outage the flow meets now began for it (None: it begins now): the first of an unbroken
        run of Defers, each taken up again within a lease and a breaker period (``open_seconds``: the
        jitter that spreads a backlog, the dispatcher's lag) of when the gate told it to come back
        (``gateway_due``). A flow taken up later than that was kept by something other than the gateway
        meanwhile (a pause of its kind, a stopped dispatcher, a person), and that time is no outage: the
        count starts again. (A record deferred before ``gateway_due`` was kept counts from its ``since``.)"""
        since = _number(claimed.fields.get("gateway_since"))
        due = _number(claimed.fields.get("gateway_due"))
        gap = self.engine.lease + self.engine.terminals.health(claimed.terminal).open_seconds
        if since is None or (due is not None and now > due + gap):
            return None
        return since

    def _outage_bound(self, claim: Claim, outcome: Defer, now: float) -> Outcome:
        """A flow kept from the gateway longer than ``outage_seconds`` (:meth:`_outage_since`) ends:
        ``failed`` with the reason, or ``needs_attention`` where money may have moved (an earlier call
        unanswered, money in flight still marked: workflows.engine.inflight, never declared failed; money the
        gateway took: transition.lua turns the failure into needs_attention)."""
        claimed = claim.record
        since = self._outage_since(claimed, now)
        bound = self.engine.terminals.health(claimed.terminal).outage_seconds  # the flow's own terminal's
        if since is None or now - since < bound:
            return outcome
        reason = f"{outcome.reason} for more than {bound:.0f}s"
        error = {**outcome.error, "reason": outcome.reason, "since": since}
        if inflight.may_have_moved(claim.step, claimed, outcome):
            return Attention(f"{reason}; money may have moved", error)
        return Finish(False, reason, error=error)

    def _new_order(self, definition: FlowDefinition, claimed: FlowRecord, ctx: StepContext) -> tuple[int, str] | None:
        """The flow's next gateway order id, held by it in the order index (None: none is free, or the flow's
        order is the merchant object's own, ``FlowDefinition.order_fixed``)."""
        if definition.order_fixed:
            return None
        base = definition.order_id(ctx.input) if definition.order_id else claimed.order_id
        try:
            return self.engine.orders.take(base, claimed.order_seq + 1, claimed.id)
        except OrderIdsTaken:
            return None

    # -- sending -------------------------------------------------------------------------------

    def dispatch_due(self, *, batch: int | None = None) -> int:
        """Send every flow that is due (timers, retries, wait deadlines, lost links, dead workers)."""
        engine = self.engine
        now = engine.clock.now()
        sent = 0
        size = batch or engine.settings.engine.dispatch_batch
        ids = engine.store.take_due_all(now=now, batch=size, grace=engine.lease)
        records = engine.store.many(ids) if ids else []
        held = engine.pauses.hold(records) if records else set()  # a paused kind's flows wait (workflows.pauses)
        for record in records:
            if record.state in STOPPED or record.id in held:
                continue
            self.send_from(record, record.step, from_due=True)
            sent += 1
        for key in engine.caps.caps:  # (none unless fairness is on with caps: nothing for anyone else)
            sent += self._refill(key, now)
        return sent

    def send_from(self, record: FlowRecord, step_name: str, *, from_due: bool = False) -> None:
        """Send the chain of the flow's next steps from ``step_name`` (the fast path). ``from_due``: the
        dispatcher sends it from its due entry (under a cap: see :meth:`_admitted`)."""
        definition = self.engine.definition_for(record)
        self.send_chain(record.id, definition, step_name, fair_key=key_of(record.fields), from_due=from_due)

    def send_chain(
        self, flow_id: str, definition: FlowDefinition | None, step_name: str, *, fair_key: str, from_due: bool = False
    ) -> None:
        """Send the step's task; where workers do not follow a flow's steps themselves
        (``follow_steps`` 0), a Celery chain of it and the unconditional steps after it. ``definition``:
        the flow's own (None: this process holds none, so the engine's task is sent, and the worker
        that holds the version runs it, or a worker that does not parks it). ``fair_key``: the flow's
        fairness key (``workflows.engine.fairness``): with fairness on, the queue the chain goes to."""
        sender = self.engine.sender
        if sender is None:
            return
        if definition is None or step_name not in definition.step_index:
            links = [(ENGINE_STEP_TASK, step_name)]
        else:
            steps = (
                definition.segment(step_name) if self.engine.settings.engine.follow_steps == 0 else (definition.step(step_name),)
            )
            links = [(step.task_name, step.name) for step in steps]
        fairness = self.engine.fairness
        try:
            if fairness.on:
                if self.engine.caps.caps:  # a step of this key waits: the capped keys share with it
                    self.engine.caps.mark(fair_key, self.engine.clock.now())
                if self.engine.caps.capped(fair_key) and not self._admitted(flow_id, fair_key, from_due=from_due):
                    return
                sender.send_chain(flow_id, links, queue=fairness.queue_for(fair_key))
            else:
                sender.send_chain(flow_id, links)
        except Exception:
            log.exception("flow %s: sending step %s failed; the dispatcher will pick it up", flow_id, step_name)

    def _admitted(self, flow_id: str, fair_key: str, *, from_due: bool = False) -> bool:
        """Whether the flow's step may be sent under its key's cap (``workflows.engine.fairness.Caps``). Held back,
        its due entry is moved ``hold_seconds`` on (it was a lease on: sent or just taken), so the
        dispatcher sends it then should no release come first; it is never only on the held list.
        ``from_due``: its due entry brought it back, so a flow held before has waited at least
        ``hold_seconds``: it ranks that far back in the held list, ahead of the flows listed since (left
        unlisted while the list was full, it would otherwise be passed by every later flow of a busy key)."""
        engine = self.engine
        now = engine.clock.now()
        since = now - engine.caps.hold_seconds if from_due else now
        if engine.caps.admit(fair_key, flow_id, now, since=since) == ADMITTED:
            return True
        engine.redis.zadd(engine.keys.due_of(flow_id), {flow_id: now + engine.caps.hold_seconds}, xx=True)
        return False

    def _release(self, record: FlowRecord, token: str) -> None:
        """A capped key's step ended (its task is over): its claim ``token``'s place is given back, and
        the held flows admitted in its place are sent."""
        engine = self.engine
        key = key_of(record.fields)
        try:
            self._send_admitted(key, engine.caps.release(key, record.id, token, engine.clock.now()))
        except Exception:  # the held flows' due entries send them later; the lapse frees the place
            log.exception("flow %s: releasing the place of fairness key %s failed", record.id, key)

    def _refill(self, key: str, now: float) -> int:
        """The dispatcher's look at a capped key: places that lapsed unclaimed (a flow cancelled or paused
        before its step ran, a message lost) go to the held flows, a lease after they were sent rather
        than at the held flows' due entries. How many were sent."""
        try:
            return self._send_admitted(key, self.engine.caps.refill(key, now))
        except Exception:  # as a release's: their due entries send them later
            log.exception("fairness key %s: admitting held flows in lapsed places failed", key)
            return 0

    def _send_admitted(self, key: str, ids: list[str]) -> int:
        """Send the held flows a release or a refill admitted. One that cannot run (ended meanwhile, or its
        kind paused: held as the dispatcher holds it, ``Pauses.hold``) gives its place back at once, and
        the room is offered to the next held flows, for at most :data:`ADMIT_ROUNDS` rounds (the rest
        at the dispatcher's next refill): a place is never burnt on a flow that cannot take it."""
        engine = self.engine
        sent = 0
        for _ in range(ADMIT_ROUNDS):
            if not ids:
                break
            records = engine.store.many(ids)
            ended = [held.id for held in records if held.state in STOPPED]
            live = [held for held in records if held.state not in STOPPED]
            paused = engine.pauses.hold(live) if live else set()
            for held in live:
                if held.id not in paused:
                    self.send_from(held, held.step)
                    sent += 1
            given_back = ended + sorted(paused)
            if not given_back:
                break
            engine.caps.forget(key, given_back)
            ids = engine.caps.refill(key, engine.clock.now())
        return sent


#: Rounds of :meth:`StepProtocol._send_admitted` giving the places of picked flows that cannot run to the
#: next held ones (a bound, as on every loop; the dispatcher's refill takes what is left).
ADMIT_ROUNDS = 4


def writes(step: Step) -> bool:
    """The step writes at the gateway (a POST: money may move): its claim must be durable before it
    calls. (A step's Celery task passes the same as ``money``: its operation's method.)"""
    return step.operation is not None and step.operation.method == "POST"


def _given_back(claimed: FlowRecord) -> dict[str, str | None]:
    """The attempt and the run a claim counted (claim.lua), given back by a try kept from the gateway (the
    gate's Defer, another flow's hold on its target): the one home of "uses no attempt"."""
    runs = int(claimed.fields.get("runs") or "0")
    return {"attempt": str(max(0, claimed.attempt - 1)), "runs": str(max(0, runs - 1)) if runs > 1 else None}


def _wrote(ctx: StepContext) -> bool:
    """Whether this try sent a call that writes at the gateway (reads only, it changed nothing there)."""
    return any(op.method == "POST" for name in ctx.calls if (op := BY_NAME.get(name)) is not None)


def _unanswered_write(ctx: StepContext, outcome: Outcome) -> bool:
    """Whether this try sent a write at the gateway and got no answer it can read (``inflight.unanswered_write``)."""
    return inflight.unanswered_write(outcome, wrote=_wrote(ctx))


def _payment_recorded(outcome: Outcome) -> dict[str, Any] | None:
    """The payment taken that a step's outcome records (answered or adopted), or that it stops for a
    person over (a LatePayment it found: transition.lua keeps it on the flow), if any."""
    if isinstance(outcome, Attention) and isinstance(outcome.error, dict) and outcome.error.get("type") == "LatePayment":
        reported = outcome.error.get("operation")
        return dict(reported) if isinstance(reported, dict) and reported.get("operationId") else None
    if not isinstance(outcome, Advance | Finish):
        return None
    operation = operation_of(outcome.output) if outcome.output else None
    return reported_payment({"operation": operation}) if operation else None


def _call_made(
    step: Step, claimed: FlowRecord, outcome: Outcome, now: float, *, reconcile: bool, made: Sequence[str] = ()
) -> dict[str, Any] | None:
    """What the log keeps of the gateway call a step's try made (the console's timeline): the operation,
    the status it ended with (the operation's result, an HTTP status, or the error's type), the time
    from claim to completion, and whether the try only read back what an earlier one did.

    ``made``: the calls the try made, in order (``StepContext.calls``). The operation named is those when
    they are not just the step's own: a reconcile try reads (``get_order``) before it calls again, if it
    does, and its row named the step's ``create_moto_order`` although that was never sent."""
    operation = getattr(step, "operation", None)
    name = getattr(operation, "name", "") if operation is not None and not isinstance(step, WaitStep) else ""
    if not name:
        return None
    status: Any = None
    if isinstance(outcome, Advance | Finish) and outcome.output:
        found = operation_of(outcome.output)
        status = found.get("operationResult") if found else None
    if status is None and isinstance(outcome, Poll):
        status = "PENDING"
    error = getattr(outcome, "error", None)
    if status is None and isinstance(error, dict):
        status = error.get("status") or error.get("operationResult") or error.get("type")
    if status is None:
        status = type(outcome).__name__.lower()
    op = " then ".join(made) if made and list(made) != [name] else name
    call: dict[str, Any] = {"op": op, "status": status, "ms": round(max(0.0, now - claimed.updated) * 1000, 1)}
    if reconcile:
        call["reconcile"] = True
    return call


#: The log's word for an operator's restart of a failed flow (``Engine.retry``): a new generation, whose
#: steps are entered anew (:func:`_wait_since`).
RESTARTED = "restarted after failure"


def _wait_since(record: FlowRecord | None, step: str, now: float, history: Callable[[str], list[dict[str, Any]]]) -> float:
    """When the flow's wait at ``step`` began: kept in its wait (``since``) from its first wait on; no wait
    yet at this step: this run begins it. A wait written by a release before it kept none: the moment its
    log shows the flow entering ``step`` (the latest such entry: a step is entered again only by a restart,
    which names itself where the step is the first one), read once (the wait is then written with it).
    Never the flow's creation, which a delayed start or a restart puts days earlier; with the entry
    trimmed from the log, the record's last change (no earlier than the wait's start: errs late, never
    early)."""
    wait = record.wait if record is not None else None
    if record is None or not wait or wait.get("step") != step:
        return now
    since = wait.get("since")
    if isinstance(since, int | float):
        return float(since)
    entered: float | None = None
    before = None
    for entry in history(record.id):
        entering = before != step or entry.get("what") == RESTARTED
        if entry.get("step") == step and entering and isinstance(entry.get("t"), int | float):
            entered = float(entry["t"])
        before = entry.get("step")
    return entered if entered is not None else record.updated


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _owed_failure(ending: Mapping[str, Any] | None) -> Finish:
    """The failure a flow was heading for when money was found in flight, now that a read of the gateway
    showed none moved (``ending``, kept by transition.lua)."""
    ending = ending or {}
    error = ending.get("error")
    outcome = ending.get("outcome")
    reason = (outcome or {}).get("reason") if isinstance(outcome, dict) else None
    return Finish(
        False,
        f"{reason or ending.get('reason') or 'failed'} (the gateway shows no money moved)",
        error=error if isinstance(error, dict) else None,
    )


def _customer_url(step: Step, output: Mapping[str, Any]) -> dict[str, str | None]:
    if step.customer_url is None:
        return {}
    url = step.customer_url(dict(output))
    return {"customer_url": url} if url else {}


class _NoClient:
    """Stands in for the gateway client where no step runs (choosing a flow's first step at start)."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a step condition must not call the gateway")


def kept_field_of(ctx: StepContext) -> str:
    """Where a merchant step's output is kept between its function's return and its completion
    (``engine/lua/keep.lua``): one per step and operator restart (the idempotency key has the generation)."""
    return f"kept:{ctx.idempotency_key}"
