"""Which operator actions a flow accepts now, why the others are refused, and what each will do at the
gateway, in words: one home for the rule, asked by the engine before it acts (``Engine.cancel``,
``retry``) and by the console and CLI before they offer an action, so that what a person is shown and
what the engine does cannot disagree.

The actions: ``retry`` (a ``needs_attention`` flow moves on, a ``failed`` one restarts on a new order),
``accept`` (the console's name for a retry that takes a late payment as the outcome), ``cancel``,
``refund`` and ``keep`` (a late payment, ``workflows.late_payments``). What a cancel does while money may
be in flight is transition.lua's, which reads the same field (``unsettled``) as :func:`explain`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from durapay.workflows.engine import inflight
from durapay.workflows.engine.sensitive import erased
from durapay.workflows.engine.states import TERMINAL, FlowState
from durapay.workflows.engine.store import FlowRecord, compact_json

ACTIONS = {
    "retry": "Retry",
    "cancel": "Cancel",
    "accept": "Accept the late payment",
    "refund": "Refund the late payment",
    "keep": "Keep the second payment",
}


@dataclass(frozen=True)
class Seen:
    """A flow as a person was shown it (a bulk dry run's line): its state and version, and whether it was
    packed. Their confirmation acts on the flow only as it was (DESIGN, money invariant 8): the engine asks
    :meth:`changed` in the same read its compare-and-set is guarded by (``Engine.retry``, ``cancel``).

    Packing (``compact.lua``, about a second after a flow ended) moves the version and changes nothing of
    the flow: a flow shown unpacked and found packed one version on, in the same state, has not changed."""

    state: FlowState
    version: int
    packed: bool = False
    #: Where the person was shown it, in the refusal's words: a bulk dry run, a confirmation page.
    since: str = "the dry run"

    def changed(self, record: FlowRecord) -> str | None:
        """Why the flow is not the one shown (None: it is), in words that do not vary by flow (counted by
        reason)."""
        if record.state is not self.state:
            return f"flow {record.id} changed since {self.since} (it was {self.state}, it is {record.state} now)"
        packing = record.packed and not self.packed and record.finished and record.version == self.version + 1
        if record.version != self.version and not packing:
            return (
                f"flow {record.id} changed since {self.since} (still {record.state}, but acted on or moved on meanwhile: "
                "a retry, a step, a signal)"
            )
        return None

    def text(self) -> str:
        """``<version>[p] <state>``: how a dry run keeps it (``workflows.bulk``), a few bytes."""
        return f"{self.version}{'p' if self.packed else ''} {self.state.value}"

    @classmethod
    def parse(cls, text: str, *, since: str = "the dry run") -> Seen:
        """The flow as :meth:`text` kept it; ValueError for a text it never wrote."""
        version, _, state = text.partition(" ")
        return cls(FlowState(state), int(version.rstrip("p")), version.endswith("p"), since)

    @classmethod
    def of(cls, record: FlowRecord) -> Seen:
        return cls(record.state, record.version, record.packed)


def late_payment(record: FlowRecord) -> dict[str, Any] | None:
    """The unaccounted payment of a ``LatePayment`` flow (operation id, result, amount), if it is one."""
    error = record.error or {}
    if record.state is FlowState.NEEDS_ATTENTION and error.get("type") == "LatePayment":
        operation = error.get("operation")
        return dict(operation) if isinstance(operation, dict) else {}
    return None


def unheld_candidates(record: FlowRecord) -> list[str] | None:
    """The operations a read-back listed for a call an earlier release sent with no hold on its target
    (``ForeignOperation``, reason ``legacy``: ``workflows.flows._adopt``), or None when the flow did not stop
    for that. Only a person can say whether one is the flow's: :func:`decision`."""
    error = record.error or {}
    if record.state is FlowState.NEEDS_ATTENTION and error.get("type") == "ForeignOperation" and error.get("reason") == "legacy":
        ids = error.get("operationIds")
        return [str(i) for i in ids] if isinstance(ids, list) else []
    return None


def decision(record: FlowRecord, action: str) -> dict[str, str | None]:
    """The fields a person's ``retry`` or ``cancel`` of a flow stopped over :func:`unheld_candidates`
    writes (``decided``, read by the step's read-back): a retry takes the one operation listed as the flow's
    (confirmed against the back office: it is offered only when one is listed), a cancel takes none of
    those listed as its own (its call then never acted, once it can no longer arrive). Nothing for any
    other flow."""
    ids = unheld_candidates(record)
    if ids is None or action not in {"retry", "cancel"}:
        return {}
    chosen = {"step": record.step, "adopt": ids[0]} if action == "retry" else {"step": record.step, "none": ids}
    return {"decided": compact_json(chosen)}


def taken(record: FlowRecord, *, refunding: FlowRecord | None = None) -> list[str]:
    """The actions the engine takes on the flow now: the one rule :func:`allowed` (what is offered) and
    :func:`refusal` (what is refused, and why) are both read from.

    ``refunding``: the refund flow of its late payment, under way (``LatePayments.refunding``): ask
    :meth:`Engine.actions <durapay.workflows.engine.Engine.actions>`, which looks it up. Meanwhile the payment
    is neither accepted nor kept (the engine refuses both) and the refund's end closes the flow: nothing is
    taken, but once that refund succeeded (its worker lost before it closed the flow) asking to refund
    again closes it. ``accept`` is a retry that takes the late payment; ``refund`` and ``keep`` close any
    late payment (``workflows.late_payments``)."""
    late = late_payment(record)
    if late is not None and refunding is not None:
        return ["refund"] if refunding.state is FlowState.SUCCEEDED else []
    if late is not None:
        # Beside a succeeded flow's payment, the first stays the outcome whatever is done with the second
        # (a retry would not account for the second, and a flow whose payment succeeded is never cancelled: no cancel).
        return ["accept", "retry", "refund", "keep"] if _takes(record) else ["keep", "refund"]
    actions: list[str] = []
    unheld = unheld_candidates(record)
    if unheld is not None and len(unheld) != 1:
        pass  # a retry would take one of several as the flow's: a person cancels, or looks again (refusal)
    elif record.state is FlowState.NEEDS_ATTENTION or (record.state is FlowState.FAILED and _restartable(record)):
        actions.append("retry")
    if record.state not in TERMINAL and not record.cancel_requested and inflight.moved(record) is None:
        # A flow whose money an earlier step took (``money_moved``) is never cancelled (transition.lua).
        actions.append("cancel")
    return actions


def allowed(record: FlowRecord, *, refunding: FlowRecord | None = None) -> list[str]:
    """The actions a person is offered on the flow now (the console's buttons, ``durapay flows show``):
    those :func:`taken`, but where ``accept`` is, neither ``retry`` (the same move, in its right name) nor
    ``keep`` (after a flow failed or was cancelled, accepting is what a person means; ``keep`` stays the
    CLI's ``keep-late-payment``)."""
    actions = taken(record, refunding=refunding)
    if "accept" in actions:
        return [action for action in actions if action not in {"retry", "keep"}]
    return actions


def refusal(record: FlowRecord, action: str, *, refunding: FlowRecord | None = None) -> str | None:
    """Why ``action`` is not possible on the flow now (None: it is, :func:`taken`). ``refunding``: as for
    :func:`taken` (what ``LatePayments.accepting`` refuses, said the same way)."""
    if action in taken(record, refunding=refunding):
        return None
    late = late_payment(record)
    if late is not None and refunding is not None:
        return (
            f"flow {record.id}: payment {late.get('operationId', '?')} is being refunded by flow {refunding.id} "
            f"({refunding.state}): its success closes this flow"
        )
    if late is not None:
        operation = late.get("operationId", "?")
        if not _takes(record):
            return (
                f"flow {record.id} {_first(record) if _second(record) else 'had moved on'} and the gateway "
                f"reports {operation}: a {action} would not account for it (and a flow whose payment succeeded is never "
                "cancelled). Refund it (refund-late-payment) or keep it (keep-late-payment)"
            )
        return (
            f"flow {record.id} stopped over payment {operation}, which the gateway took after the flow ended: accept "
            "it (retry), refund it (refund-late-payment) or keep it (keep-late-payment)"
        )
    if action == "cancel":
        if record.state not in TERMINAL and inflight.moved(record) is not None:
            return (
                f"flow {record.id}: the gateway took payment {_money_moved(record)}, which a cancel cannot undo; "
                "let the flow finish (or retry it), then refund it if it must be undone"
            )
        if record.state in TERMINAL:
            return f"flow {record.id} already ended ({record.state}); nothing to cancel"
        return f"flow {record.id}: a cancel is already requested"
    unheld = unheld_candidates(record)
    if action == "retry" and unheld is not None:
        return (
            f"flow {record.id}: the gateway holds {len(unheld)} operations ({', '.join(unheld)}) that the call an "
            "earlier release sent may have made, and a retry takes one as the flow's: look them up in the gateway's "
            "back office; cancel the flow if none is its own"
        )
    if action == "retry" and record.state is FlowState.FAILED and record.fields.get("owner"):
        return (
            f"flow {record.id} is a charge of schedule {record.fields['owner']}, which retries declined charges "
            "itself (dunning): resume, or cancel, the schedule instead; a restart here would charge again"
        )
    if action == "retry" and record.state is FlowState.FAILED and erased(record.input):
        return f"flow {record.id}: its card data was erased when it ended; start a new flow with the card"
    if action == "retry":
        return f"flow {record.id} is {record.state}; only failed or needs_attention flows are retried"
    return f"flow {record.id} has no late payment to {action} (it is {record.state})"


def explain(record: FlowRecord, action: str) -> list[str]:
    """What ``action`` will do, at the gateway first (the confirmation page's sentences)."""
    late = late_payment(record) or {}
    operation = late.get("operationId", "?")
    if action == "accept":
        return [
            f"Nothing is sent to the gateway: the kept notification of operation {operation} "
            f"({late.get('operationResult', '?')}) becomes the flow's outcome.",
            f"The flow goes back to its step {record.step!r}, which takes the notification, and succeeds with that payment.",
        ]
    if action == "refund":
        then = (
            "This flow goes back to succeeded: its first payment stays its outcome, the refunded one is listed beside it."
            if _second(record)
            else "This flow is then cancelled, with the refund flow named in its outcome."
        )
        return [
            f"A refund flow is started: the gateway is asked to refund operation {operation} in full "
            "(or to void it, before capture). Asking twice refunds once.",
            f"{then} Follow the refund on its own page.",
            *_still_open(record),
        ]
    if action == "keep":
        return [
            f"Nothing is sent to the gateway: operation {operation} ({late.get('operationResult', '?')}) is kept, "
            "once a read of the gateway shows it still held (not refunded or voided meanwhile).",
            "This flow goes back to succeeded: its first payment stays its outcome, the second is listed beside it.",
            *_still_open(record),
        ]
    if action == "retry" and record.state is FlowState.FAILED:
        # The next derived order id ends in -(seq + 1) (workflows.engine.orders.gateway_order_id; -2 for the first
        # restart), or a later one if another flow holds it.
        where = (
            f"a new gateway order (order id with suffix -{record.order_seq + 2}, or the next one free)"
            if record.order_id
            else "the gateway"
        )
        return [
            f"The flow starts again from its first step on {where} with fresh idempotency keys: this is a new "
            "attempt at the gateway.",
        ]
    unheld = unheld_candidates(record)
    if unheld is not None:
        return _explain_unheld(record, action, unheld)
    if action == "retry":
        return [
            f"The flow goes back to step {record.step!r}. Its last call may have reached the gateway, so the step "
            "first reads the order back and adopts what it finds; it calls the gateway again only if nothing was made.",
            "No payment is made twice: the call keeps its idempotency key.",
        ]
    unsettled = inflight.in_flight(record)
    if inflight.holds_open(record):
        # A page, link or form the customer can pay on (workflows/flows/waits.py): closed first, then read.
        return [
            "The customer can still pay on what this flow opened at the gateway: the flow first closes it where the "
            "gateway allows (a pay-by-link is cancelled, an embedded form's session cancelled; a hosted page has no "
            "cancel), then reads the order.",
            "If the customer paid meanwhile, the flow ends succeeded with that payment (refund it then); if nothing was "
            "paid, cancelled. A payment made afterwards on a hosted page shows in this flow as a late payment "
            "(needs attention), never lost.",
        ]
    if unsettled:
        # The engine's own rule (transition.lua): with money in flight a cancel is a read first.
        return [
            f"Money may be in flight at the gateway ({unsettled.get('op')}"
            + (f", operation {unsettled['operationId']}" if unsettled.get("operationId") else "")
            + "): nothing new is sent, the flow reads the gateway first.",
            "If no money moved, the flow ends cancelled; if it did, it ends succeeded with that payment (a cancel "
            "cannot undo it: refund it then); if the gateway cannot tell, it needs attention.",
        ]
    if record.state is FlowState.RUNNING:
        return [
            f"The step in flight ({record.step!r}) is not interrupted: its gateway call finishes and its effect is "
            "kept and shown; then the flow stops, cancelled. Nothing new is sent to the gateway.",
            "A payment that step makes is not undone by the cancel: the flow then ends succeeded with it.",
        ]
    sentences = ["Nothing is sent to the gateway: the flow is cancelled now and no further step runs."]
    if record.state is FlowState.WAITING:
        sentences.append(
            "The customer's page at the gateway stays open until it expires; a payment made there afterwards "
            "shows in this flow as a late payment (needs attention), never lost."
        )
    return sentences


def _explain_unheld(record: FlowRecord, action: str, unheld: list[str]) -> list[str]:
    """What a person decides for a call an earlier release sent with no hold on its target: the gateway
    cannot say whose each operation is, so durapay takes none as the flow's on its own."""
    listed = ", ".join(unheld) or "none"
    why = (
        f"An earlier release of durapay sent this flow's {record.kind} call before it held its gateway target, so "
        f"the gateway cannot say whether operation {listed} is this flow's or another's (another flow, the back office)."
    )
    if action == "retry":
        return [
            why,
            f"Confirm only once the gateway's back office shows operation {unheld[0]} is this flow's: the flow takes it "
            "as its own, reads it until final and nothing is sent again.",
        ]
    return [
        why,
        "Confirm only once the back office shows none of them is this flow's: the flow takes none as its own, and "
        "ends cancelled once its call can no longer arrive (a read that then finds a new one stops it for a person again).",
    ]


def _restartable(record: FlowRecord) -> bool:
    """A failed flow starts again only with its input whole (card data is erased when a flow ends) and
    when no schedule owns it (a schedule retries its declined charges itself)."""
    return not record.fields.get("owner") and not erased(record.input)


def _second(record: FlowRecord) -> bool:
    """The late payment is a second one beside the payment of a flow that had succeeded."""
    return (record.error or {}).get("endedAs") == FlowState.SUCCEEDED.value


def _still_open(record: FlowRecord) -> list[str]:
    """What a close does first when the flow still holds something its customer can pay on (the link or
    page of the order it moved to): ``workflows.late_payments`` closes through the money rule."""
    if not inflight.holds_open(record):
        return []
    return [
        f"The flow still holds what its customer can pay on ({(record.unsettled or {}).get('op')}): it first closes it where "
        "the gateway allows and reads its order; the late payment stays shown until then, and the flow ends as that "
        "read says (ask again if it stops over the same payment)."
    ]


def _takes(record: FlowRecord) -> bool:
    """The late payment came after the flow failed or was cancelled: a retry (``accept``) lets the flow's
    step take it as its outcome."""
    return (record.error or {}).get("endedAs") in {FlowState.FAILED.value, FlowState.CANCELLED.value}


def _first(record: FlowRecord) -> str:
    """The payment a succeeded flow's outcome names (it stays the outcome whatever is done with a second)."""
    operation = (record.outcome or {}).get("operation") or {}
    return f"succeeded with payment {operation.get('operationId', '?')}"


def _money_moved(record: FlowRecord) -> str:
    """The operation id an earlier step recorded taken (``money_moved``), or "?"."""
    return str((inflight.moved(record) or {}).get("operationId", "?"))


#: What a person may start on a flow's payment once it succeeded (new flows of these kinds, not actions
#: on the flow): the console's "Refund…" and "Capture…" on a payment's page.
FOLLOW_UPS = {"capture": "Capture…", "refund": "Refund…"}
#: The operations a refund gives back (a payment taken, a reservation's charge).
_TAKEN = frozenset({"CAPTURE", "NOSHOW", "INCREMENTAL", "DELAY_CHARGE"})


def follow_ups(record: FlowRecord) -> list[str]:
    """The flows a person may start on this flow's payment now: ``capture`` (and ``refund``, its void) of
    an authorization the gateway holds AUTHORIZED; ``refund`` of money it took (EXECUTED). Only on a
    succeeded flow, read from its outcome's operation (what the gateway holds), never from its kind."""
    operation = (record.outcome or {}).get("operation")
    if record.state is not FlowState.SUCCEEDED or not isinstance(operation, dict) or not operation.get("operationId"):
        return []
    kind, result = operation.get("operationType"), operation.get("operationResult")
    if kind == "AUTHORIZATION" and result == "AUTHORIZED":
        return ["capture", "refund"]
    if kind in _TAKEN and result == "EXECUTED":
        return ["refund"]
    return []


def follow_up_input(record: FlowRecord, kind: str, amount: int | None) -> dict[str, Any]:
    """The input of the ``kind`` flow :func:`follow_ups` offers: the outcome's operation, and ``amount``
    (minor units, in its currency; None: the whole). A refund of an authorization voids it whole (the
    gateway's rule, refused by the refund flow for a part), so it carries no amount."""
    operation = (record.outcome or {}).get("operation") or {}
    data: dict[str, Any] = {"operationId": str(operation["operationId"])}
    whole = operation.get("operationType") == "AUTHORIZATION" and kind == "refund"
    if amount is not None and not whole:
        data |= {"amount": amount, "currency": str(operation.get("operationCurrency") or "")}
    return data


def no_action_why(record: FlowRecord) -> str:
    """Why a stopped flow offers no action, for the page that shows none (a failed card flow: its card was
    erased when it ended, so a person starts a new flow with the card). ``""`` when it has one, or when
    its state says it (succeeded, cancelled)."""
    if taken(record) or record.state is not FlowState.FAILED:
        return ""
    return refusal(record, "retry") or ""
