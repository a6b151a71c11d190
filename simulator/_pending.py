"""Money operations answered ``PENDING`` and settled later, as the real gateway may answer ("PENDING:
payment ongoing, follow-up notifications are expected").

``POST /_sim/pending`` (``admin.pend``) arms a rule: the next ``count`` requests to one money operation
of the catalogue (:data:`PENDABLE`) record their operation with ``operationResult: PENDING`` and answer
it so (the post-operations, whose answer is only ``{operationId, operationTime}``, show it through
``GET /operations/{id}``). Nothing else changes: the request is checked as always, its operation id is
final, a keyed request is stored and replayed as usual (so a repeat replays the ``PENDING`` answer), and
no money moves.

The operation settles with the rule's ``final`` outcome token (``_cards``: ``000`` approves, an ISO code
declines, ``DENIED_BY_RISK``, ``FAILED``; the card rule and scripted outcomes do not apply to it) when
``POST /_sim/pending/settle`` says, or by itself once the simulator's clock is ``settle_after`` seconds
past its creation (checked by the sweep, by every clock move and by the reads that show it, as link
expiry is). Settling does what answering at once would have done: a payment gets its result and its
money pool (and the contract it creates); a refund, capture or cancel with ``000`` gets its result
(``REFUNDED``, ``VOIDED``, ``EXECUTED``) and moves the money, if it still fits the pool (``_ledger.fits``),
else it ends ``FAILED`` like any other ``final``. The settled operation is notified to the order's
``notificationUrl`` when it has one.

Page payments: a rule for :data:`PAGE_PAYMENT` (``page_payment``, not a catalogue name) holds the next
``count`` payments a customer makes on a page: the hosted page, a pay-by-link page, a build session's APM
page (``REDIRECTED_TO_EXTERNAL_DOMAIN``) or the version 2 3DS step that runs the payment, by hand or by
auto-completion (an APM answered "payment ongoing", as the gateway does). The page answers the
``PENDING`` operation and it is notified at once (``operationResult: PENDING``). While it is held the
order read shows it ``PENDING`` with no money; the hosted page is used (409 to a second payment); the
build session reads ``PAYMENT_COMPLETE`` with the ``PENDING`` operation; the link stays ``ACTIVE`` (no
``paidByOperationId``) but is in use: a second payment or an abandon on its page is refused (409), the
merchant's cancel and modify with ``PS0045``, and it does not expire. Settling finishes the page as an
immediate result would have: approved, the link ``PAID`` by the operation; declined, the link ``FAILED``
(renewable), the hosted page closed; then the final notification. A customer's failed 3DS (``forced``) is
never held.

Rules live with the simulator, like faults (``reset`` forgets them; ``--state-file`` does not keep them);
the held operations live in the state (``SimulatorState.pending``), so a restart still settles them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from durapay.gateway import CATALOGUE, OperationResult, describe_validation_error
from durapay.simulator import _ledger, _payments
from durapay.simulator._cards import Outcome, outcome_from_token
from durapay.simulator._clock import iso, parse_iso
from durapay.simulator._payments import PAGE_PAYMENT
from durapay.simulator._protocol import Origin
from durapay.simulator._records import OperationRecord, PendingRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

#: The catalogue operations whose requests a rule can answer PENDING: every call that moves money (the
#: catalogue's ``moves_money``: a payment, a card verification, a reservation charge, a post-operation),
#: but the earlier reservation MIT, which answers no operation to read.
PENDABLE = tuple(op.name for op in CATALOGUE if op.moves_money and op.name != "create_reservation_mit_earlier")
#: Reservation charges keep their own operation type (``NOSHOW``...) through settling, as ``_reservations`` does.
_CHARGES = frozenset({"create_no_show", "create_incremental", "create_delay_charge"})
SETTLE_ORIGIN = Origin("pending_settle", "/_sim/pending/settle")
CLOCK_ORIGIN = Origin("pending_settle", "/_sim/clock")
PENDING = OperationResult.PENDING.value


class PendRequest(BaseModel):
    """The body of ``POST /_sim/pending``; unknown keys are refused so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operation: str
    count: int = Field(default=1, ge=1)
    final: str = "000"
    settle_after: float | None = Field(default=None, ge=0)

    @field_validator("operation")
    @classmethod
    def _pendable(cls, value: str) -> str:
        if value not in PENDABLE and value != PAGE_PAYMENT:
            names = ", ".join(PENDABLE)
            raise ValueError(f"{value!r} cannot answer PENDING; give one of: {names}, or {PAGE_PAYMENT} (a page's payment)")
        return value

    @field_validator("final")
    @classmethod
    def _token(cls, value: str) -> str:
        outcome_from_token(value)  # ValueError names the accepted tokens
        return value.strip().upper()


@dataclass
class PendRule:
    request: PendRequest
    remaining: int
    fired: int = 0

    def describe(self) -> dict[str, Any]:
        return {**self.request.model_dump(), "remaining": self.remaining, "fired": self.fired}


class Pending:
    """The ``pend`` rules of one simulator and the settling of the operations they held.

    Every method takes the state's lock (re-entrant: the handlers that call :meth:`take` hold it already).
    """

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self._rules: list[PendRule] = []

    def clear(self) -> None:
        """Forget the rules (the operations already held stay PENDING until they settle)."""
        with self._sim.state.lock:
            self._rules = []

    def arm(self, body: dict[str, Any]) -> dict[str, Any]:
        """Add a rule from a ``POST /_sim/pending`` body; ValueError names what is wrong."""
        try:
            request = PendRequest.model_validate(body)
        except ValidationError as exc:
            where, reason = describe_validation_error(exc)
            raise ValueError(f"{where}: {reason}") from None
        with self._sim.state.lock:
            self._rules.append(PendRule(request, request.count))
        return self.describe()

    def describe(self) -> dict[str, Any]:
        with self._sim.state.lock:
            return {
                "rules": [rule.describe() for rule in self._rules],
                "operations": [record.describe() for record in self._sim.state.pending.values()],
            }

    def _rule(self, operation: str) -> PendRule | None:
        return next((rule for rule in self._rules if rule.request.operation == operation and rule.remaining > 0), None)

    def peek(self, operation: str) -> Outcome | None:
        """The final outcome of the rule the next request to ``operation`` would take, if any (takes nothing)."""
        with self._sim.state.lock:
            rule = self._rule(operation)
            return outcome_from_token(rule.request.final) if rule else None

    def take(self, operation: str) -> PendRule | None:
        """Use up one request of the first rule for ``operation``: the request it names will answer PENDING."""
        with self._sim.state.lock:
            rule = self._rule(operation)
            if rule is not None:
                rule.remaining -= 1
                rule.fired += 1
            return rule

    def hold(self, op: OperationRecord, rule: PendRule, origin: Origin, *, success_result: str | None = None) -> None:
        """Leave ``op`` PENDING (a rule :meth:`take` gave for its request) until it settles."""
        state = self._sim.state
        with state.lock:
            if op.result != PENDING:
                op.result = PENDING
                op.steps.append(origin.step(PENDING))
            op.time = state.now_gateway()
            kept_type = op.operation_type if rule.request.operation in _CHARGES else None
            state.pending[op.operation_id] = PendingRecord(
                operation_id=op.operation_id,
                operation=rule.request.operation,
                final=rule.request.final,
                created_at=iso(self._sim.clock.now()),
                settle_after=rule.request.settle_after,
                success_result=success_result,
                kept_type=kept_type,
            )

    def settle(self, operation_id: str | None = None, *, origin: Origin = SETTLE_ORIGIN) -> list[str]:
        """Settle one held operation (KeyError if it is not PENDING), or every one; the ids settled."""
        state = self._sim.state
        with state.lock:
            if operation_id is not None and operation_id not in state.pending:
                raise KeyError(operation_id)
            ids = [operation_id] if operation_id is not None else list(state.pending)
            for held in ids:
                self._settle(state.pending.pop(held), origin)
            return ids

    def settle_due(self) -> list[str]:
        """Settle the held operations whose ``settle_after`` has passed by the simulator's clock."""
        state = self._sim.state
        with state.lock:
            if not state.pending:
                return []
            now = self._sim.clock.now()
            due = [
                record.operation_id
                for record in state.pending.values()
                if record.settle_after is not None
                and now >= parse_iso(record.created_at) + timedelta(seconds=record.settle_after)
            ]
            for held in due:
                self._settle(state.pending.pop(held), CLOCK_ORIGIN)
            return due

    def _settle(self, record: PendingRecord, origin: Origin) -> None:
        sim, state = self._sim, self._sim.state
        op = state.operations[record.operation_id]
        order = state.orders[op.order_id]
        outcome = outcome_from_token(record.final)
        if record.success_result is not None:  # a post-operation
            moves = outcome.approved and _ledger.fits(sim, op)
            if moves:
                _ledger.move(sim, op, origin)
            op.result = record.success_result if moves else OperationResult.FAILED.value
            op.time = state.now_gateway()
            op.steps.append(origin.step(op.result))
        else:
            _payments.complete(sim, op, order, outcome, origin)
            if record.kept_type is not None:
                op.operation_type = record.kept_type
        state.dirty = True
        if record.operation == PAGE_PAYMENT:  # the page learns the result (link PAID or FAILED), and notifies
            _payments.finish_page(sim, order, op, state.links.get(op.payment_link_id or ""))
        else:
            sim.notify(order, op, _token(sim, op))


def _token(sim: Simulator, op: OperationRecord) -> str:
    """The security token a notification of ``op`` carries: its payment's link's, else the order's last."""
    state = sim.state
    pool = _ledger.pool_of(state, op) or op
    link = state.links.get(pool.payment_link_id or "")
    if link is not None:
        return link.security_token
    tokens = state.orders[op.order_id].security_tokens
    return tokens[-1] if tokens else ""
