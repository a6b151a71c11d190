"""One money call at a time per gateway target: a lost answer's read-back has one candidate.

A refund, a capture and a capture's cancel act on a payment's gateway order; a no-show, incremental or
delayed charge on a reservation (whose gateway order id is its id). What the gateway shows of such a
*target* (its operations: type, amount, currency, time) says nothing of whose call made each one, so two
flows calling on one target at once could leave a lost answer ambiguous, and a read-back that judged by
resemblance took another flow's refund or charge as its own (issue 36). The rule, here and in
``engine/lua/target_*.lua``:

* **At most one unresolved money call per target.** A money step *holds* its target from before its call
  can be sent until the gateway has named the call's operation, refused it, or a read showed it never
  acted and can no longer arrive (``inflight.lua``'s ``unanswered``, on the holder's record). Another
  flow's money step on that target waits meanwhile: ``retrying`` with the error ``TargetHeld`` naming the
  holder and its state, no attempt and no run used (:class:`~durapay.tasks.outcomes.Held`); woken when
  the holder lets go, else after a bounded poll (a lease, doubling to 16). A holder stopped for a person
  keeps its target: its money is unresolved until a person's retry or cancel reads the gateway.
* **The snapshot.** Holding the target, before its call can be sent, the step reads the target's
  operations and records their ids on its record (``hold.before``), durable before the call. A read-back of
  the call takes as its own only an operation of its type that the snapshot does not list and that no
  other flow recorded (its ``op:`` lookup): with the target held, no other flow's call can have made it.
  Type, amount and currency only exclude (``workflows.flows._adopt``). The snapshot is taken once per
  hold: a call sent again after a read found nothing is judged against the same one, and a try that finds
  its own hold still held takes the key again under the same token (never a new one, which would leave
  the old, still on the key, free to another flow's check in between).
* **No snapshot, known from the record.** A try stopped before its hold was written sent nothing under
  its mark of money in flight (the mark's format says it is this release's: the hold comes first). A call
  an earlier release sent with no hold (``inflight.sent_unheld``: its mark has no format) holds the target
  with no snapshot (``legacy``); its read-back adopts nothing on its own, and a person decides.
* **The holder's record is the truth.** The target's key names its holder and the hold's token
  (``Keys.target``). A step that finds the target held asks the holder's record (``target_flow.lua``
  ``check``): held while its hold names this target and token and its money call is unanswered. Else it
  takes the target over: it fences the token on the holder's record (a worker of the holder that had not
  yet recorded its hold can no longer, so it never sends), waits until the holder's record is durable,
  and moves the key by compare-and-set. Neither an old key nor an expired holder is ever taken over on
  its own say; a record that expired ended long ago.

The order of the writes, so that the key never names a flow whose record does not say it holds: (1) the
hold on the flow's record (``intent``), (2) the key, (3) the read of the target, (4) the snapshot on the
record, (5) a durability wait covering the record, the key and a taken-over holder's record, (6) the
call. On Redis Cluster the key lives in the target's partition, every other write in the flow's own; no
script spans two slots. The release (after the completion that resolves the call) waits for the record
to be durable, then frees the key and wakes the waiters.

A flow kind with no shared target (a payment on its own order) never reaches this module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from durapay.tasks.outcomes import Held
from durapay.tasks.runner import LeaseLost, TargetSnapshot
from durapay.workflows.engine import inflight
from durapay.workflows.engine.durability import NotDurable
from durapay.workflows.engine.scripts import register, request_token, source
from durapay.workflows.engine.steps import Target
from durapay.workflows.engine.store import FlowRecord, FlowStore, compact_json

if TYPE_CHECKING:
    from durapay.workflows.engine.protocol import Claim

log = logging.getLogger("durapay.targets")

#: How many waiters one release wakes (the rest: the next release, or their polls).
WAKE_AT_ONCE = 100
#: How many times a take meets another holder let go (and takes it over) before it waits all the same.
TAKE_ROUNDS = 3
#: The longest poll of a waiting step, in leases (it doubles from one lease).
MAX_POLL_LEASES = 16


def hold_of(record: FlowRecord, step: str) -> dict[str, Any] | None:
    """The record's hold (``hold``) when it is of ``step``: what the step last held, not whether it still does."""
    raw = record.fields.get("hold")
    if not raw:
        return None
    try:
        hold = json.loads(raw)
    except ValueError:
        return None
    return hold if isinstance(hold, dict) and hold.get("step") == step and hold.get("target") else None


def current_hold(record: FlowRecord, step: str) -> dict[str, Any] | None:
    """The step's hold when it was written under the money in flight marked now (``inflight.marked_since``):
    one left by a try whose money was settled since is no hold of the call now in flight, and its snapshot
    no longer says what the target held before that call (a back-office refund made in between would be
    taken for its own)."""
    hold = hold_of(record, step)
    return hold if hold is not None and inflight.marked_since(record, hold.get("t")) else None


def snapshot_of(record: FlowRecord, step: str) -> TargetSnapshot | None:
    """The snapshot a read-back of ``step``'s call judges by, as the record holds it: the target's operations
    when it was held; ``before`` None when no call was sent under the record's mark (a hold recorded and its
    call never sent, or no hold at all under a mark of this release: the hold comes first); None for a call
    an earlier release sent with no hold (``legacy``: no snapshot can exist; ``workflows.flows._adopt``
    lets a person decide rather than judge by resemblance)."""
    hold = current_hold(record, step)
    if hold is None:
        return None if inflight.sent_unheld(record, step) else TargetSnapshot("", None)
    if hold.get("legacy"):
        return None
    before = hold.get("before")
    return TargetSnapshot(str(hold["target"]), frozenset(str(i) for i in before) if isinstance(before, list) else None)


def decided_of(record: FlowRecord, step: str) -> dict[str, Any] | None:
    """A person's decision on ``step``'s call (``decided``: ``operator_actions.decision``), or None."""
    raw = record.fields.get("decided")
    try:
        decided = json.loads(raw) if raw else None
    except ValueError:
        return None
    return decided if isinstance(decided, dict) and decided.get("step") == step else None


class Targets:
    """Take, let go and wake: the engine's side of :mod:`workflows.engine.targets`. One per engine."""

    def __init__(self, store: FlowStore, lease: float, now: Callable[[], float]) -> None:
        self.store = store
        self.keys = store.keys
        self.lease = lease
        self.now = now
        client = store.redis
        self._take = register(client, "engine/lua/target_take.lua", source("engine/lua/target_take.lua"))
        self._free = register(client, "engine/lua/target_free.lua", source("engine/lua/target_free.lua"))
        self._flow = register(
            client, "engine/lua/target_flow.lua", source("engine/lua/inflight.lua") + source("engine/lua/target_flow.lua")
        )

    # -- taking ----------------------------------------------------------------------------------

    def prepare(self, claim: Claim, target: Target) -> None:
        """Give a claimed money step its snapshot as recorded, and the hold to take before it calls."""
        claim.ctx.snapshot = snapshot_of(claim.record, claim.step.name)
        claim.ctx.decided = decided_of(claim.record, claim.step.name)
        claim.ctx.hold_target = lambda: self.hold(claim, target)

    def hold(self, claim: Claim, target: Target) -> Held | None:
        """Hold the step's target before it reads back or calls: None once held (``ctx.snapshot`` says
        what the target held), or the outcome of waiting for its holder. LeaseLost when the claim is no
        longer this worker's, or Redis cannot take the hold (the lease runs out; the step is taken up
        again, reading the gateway first)."""
        try:
            return self._hold(claim, target)
        except (redis.RedisError, NotDurable) as exc:
            raise LeaseLost(f"flow {claim.record.id} step {claim.step.name}: its target could not be held: {exc}") from exc

    def _hold(self, claim: Claim, target: Target) -> Held | None:
        record, ctx = claim.record, claim.ctx
        held = current_hold(record, claim.step.name)
        if held is not None and self._check(record.id, held)[0] == "held":
            return self._hold_again(claim, target, held)
        earlier = hold_of(record, claim.step.name)  # the step's target, as an earlier try named it
        name = str(earlier["target"]) if earlier is not None else target.of(ctx)
        token = request_token()
        hold: dict[str, Any] = {"step": claim.step.name, "t": ctx.now, "target": name, "token": token}
        # A call an earlier release sent with no hold (its mark says so: inflight.sent_unheld) may already
        # be among what the target holds now: no snapshot of it can be taken, and its read-back lets a
        # person decide (workflows.flows._adopt). Never inferred from a hold missing: under this release's
        # mark the hold is written, and durable, before any call.
        legacy = held is None and inflight.sent_unheld(record, claim.step.name)
        if legacy:
            hold["legacy"] = True
        self._write(claim, "intent", hold)
        expected, taken_over = "", []
        for _ in range(TAKE_ROUNDS):
            answer = self._take_key(name, record.id, token, expected)
            if answer[0] == "ok":
                break
            holder, holder_token = answer[1], answer[2]
            verdict = self._check(holder, {"target": name, "token": holder_token}, fence=True)
            if verdict[0] == "held":
                return self._waits(claim, target, name, answer, verdict)
            taken_over.append(holder)  # let go (or never recorded): its record made durable before the key moves
            self.store.sync(holder, f"release of {name} by flow {holder}")
            expected = holder_token
        else:
            return self._waits(claim, target, name, answer)
        claim.hold_token = token  # taken: let go after this try's completion, whatever it is
        self._snapshot(claim, target, hold, taken_over, legacy=legacy)
        return None

    def _hold_again(self, claim: Claim, target: Target, held: dict[str, Any]) -> Held | None:
        """The step's own hold from an earlier try, still held (its call unanswered, or recorded and never
        sent): taken again under the same token, so that the key never names a token the flow's record no
        longer does (a new token written first would leave the old one free to another flow's check while the
        key still names it). Judged by the same snapshot; one recorded but never taken is taken now."""
        record, ctx = claim.record, claim.ctx
        name, token = str(held["target"]), str(held["token"])
        answer = self._take_key(name, record.id, token)
        if answer[0] != "ok":  # (only after Redis lost writes: another flow holds it) wait for it
            return self._waits(claim, target, name, answer)
        claim.hold_token = token
        before = held.get("before")
        if isinstance(before, list) or held.get("legacy"):
            # Durable before the call is sent again (the try that took it may have stopped before its wait).
            self.store.sync(record.id, f"hold of {name} by flow {record.id}", targets=[name])
            ctx.snapshot = TargetSnapshot(name, frozenset(str(i) for i in before)) if isinstance(before, list) else None
            return None
        self._snapshot(claim, target, held, [], legacy=False)
        return None

    def _snapshot(self, claim: Claim, target: Target, hold: dict[str, Any], taken_over: list[str], *, legacy: bool) -> None:
        """Held: read the target, record what it holds (not for a legacy hold), all durable before the call."""
        record, ctx = claim.record, claim.ctx
        name = str(hold["target"])
        before = sorted({str(operation_id) for operation_id in target.operations(ctx, name)})
        if not legacy:
            self._write(claim, "snapshot", {**hold, "before": before})
        # The hold, the key and any take-over on disk before the call can go out (docs/durability.md).
        self.store.sync([record.id, *taken_over], f"hold of {name} by flow {record.id}", targets=[name])
        ctx.snapshot = None if legacy else TargetSnapshot(name, frozenset(before))

    def _take_key(self, name: str, flow_id: str, token: str, expected: str = "") -> list[str]:
        keys = [self.keys.target(name), self.keys.target_waiters(name)]
        answer = self._take(keys=keys, args=[flow_id, token, expected, repr(self.now())])
        return [_text(item) for item in answer]

    def _check(self, flow_id: str, hold: dict[str, Any], *, fence: bool = False) -> list[str]:
        """``target_flow.lua``'s check of ``flow_id``'s record: held (state, step, kind) or free."""
        args = ["check", str(hold["target"]), str(hold["token"]), "1" if fence else ""]
        return [_text(item) for item in self._flow(keys=[self.keys.flow(flow_id)], args=args)]

    def _write(self, claim: Claim, mode: str, hold: dict[str, Any]) -> None:
        record = claim.record
        args = [mode, str(record.version), record.lease_owner, compact_json(hold)]
        if _text(self._flow(keys=[self.keys.flow(record.id)], args=args)[0]) != "ok":
            raise LeaseLost(f"flow {record.id} step {claim.step.name}: the claim is no longer {record.lease_owner}'s")
        record.fields["hold"] = compact_json(hold)

    def _waits(self, claim: Claim, target: Target, name: str, answer: list[str], verdict: list[str] | None = None) -> Held:
        """The step waits for the flow that holds ``name``: how long at most, and what it says."""
        holder = answer[1] if len(answer) > 1 else ""
        state, step, kind = verdict[1:4] if verdict and len(verdict) >= 4 else ["", "", ""]
        previous = claim.record.error or {}
        again = previous.get("type") == "TargetHeld" and previous.get("target") == name
        waits = int(previous.get("waits") or 0) + 1 if again else 1
        after = self.lease * min(MAX_POLL_LEASES, 2 ** min(waits - 1, 8))
        held_by = f"flow {holder}" + (f" ({kind}, {state} at {step})" if state else "")
        reason = (
            f"waits for {held_by}: its money call on {target.what} {name} is not resolved yet, and this "
            f"{claim.record.kind} sent now could not be told from it"
        )
        error = {
            "type": "TargetHeld",
            "target": name,
            "holder": holder,
            "holderState": state or None,
            "waits": waits,
            "message": reason,
            "retryable": True,
        }
        return Held(after, reason, error)

    # -- letting go ------------------------------------------------------------------------------

    def release(self, claim: Claim) -> None:
        """After a completion of the step: if the flow no longer holds its target (its record says so),
        let the target go and wake its waiters. Best effort: a release that fails leaves the target to be
        taken over by the next flow that asks (the holder's record says it is free)."""
        token = claim.hold_token
        held = hold_of(claim.record, claim.step.name)
        if token is None and held is not None:
            # Not taken by this try (a read for a cancel, say), but held since an earlier one that may have
            # sent (a legacy hold too): the check below asks target_flow.lua, the one home of "is the call
            # still unanswered", whether this completion resolved it; if so the target is let go.
            token = str(held.get("token") or "") or None
        if token is None:
            return
        snapshot = claim.ctx.snapshot
        name = snapshot.target if snapshot is not None and snapshot.target else str((held or {}).get("target") or "")
        if not name:
            return
        flow_id = claim.record.id
        try:
            if self._check(flow_id, {"target": name, "token": token})[0] == "held":
                return
            self.store.sync(flow_id, f"release of {name} by flow {flow_id}")  # the resolution first, then the key
            keys = [self.keys.target(name), self.keys.target_waiters(name)]
            waiters = [_text(item) for item in self._free(keys=keys, args=[token, str(WAKE_AT_ONCE)])]
            for waiter in waiters:
                self.wake(waiter, name)
        except (redis.RedisError, NotDurable):
            log.exception("flow %s: letting %s go failed; the next flow that asks takes it over", flow_id, name)

    def wake(self, flow_id: str, name: str) -> bool:
        """A flow waiting for ``name`` is due now (False: it waits no more, or not for it)."""
        keys = [self.keys.flow(flow_id), self.keys.due_of(flow_id)]
        return bool(self._flow(keys=keys, args=["wake", name, repr(self.now()), flow_id]))


def _text(item: Any) -> str:
    return item.decode() if isinstance(item, bytes) else str(item)
