"""Late payments (``workflows/late_payments.py``, ``workflows/lua/money.lua``): money the gateway reports for
a flow that does not account for it stays shown until a person keeps or refunds it.

Each test replays a finding of an independent review on the flow model's world (``flow_model.FlowWorld``:
the real engine, the simulator over HTTP, messages delivered when the test says), and failed on the code
before the fix:

1. A payment on a flow's earlier order, reported while it waits on its new one, was consumed by the
   ``LatePayment`` it raised: a cancel then hid it, an accepting retry dropped it.
2. A capture of a flow's payment, notified to its order, was reported as a second payment.
3. ``refund_late_payment`` closed the flow before the refund happened: a refused refund left the payment
   unrefunded with the flow cancelled, and an accept between the refund's start and the close took a
   payment being refunded.
4. A refunded late payment, notified again, was reported late again.
5. (``durapay chaos``) A cancel of a flow stopped for a second payment beside its success rewrote it as
   cancelled, and closing the late payment then left it cancelled with its first payment taken.
6. (a second review) A flow with two late payments, each closed by a person, remembered only the last
   close: the first one's notification, delivered again, was news again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway import Catalogue
from simulator import SimulatorServer
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld
from workflows.engine import OperatorError
from workflows.keys import derived_id
from workflows.late_payments import refund_key
from workflows.signals import RECEIVER
from workflows.states import FlowState


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=930)
    yield built
    built.close()


def run_all(world: FlowWorld) -> None:
    while world.messages.chains:
        world.deliver(0)


# -- 1. a payment on an earlier order, reported while the flow waits on its new one -----------------------


def _hpp_restarted_then_old_page_paid(world: FlowWorld) -> tuple[Any, str, dict[str, Any]]:
    """A hosted page flow expires unpaid (its page is still open at the gateway), the operator restarts it
    (new order ``-2``, new page); the customer then pays the *first* page. Its notification reaches the
    flow, now waiting on ``-2``: ``needs_attention`` (LatePayment, "moved to a new order")."""
    flow = world.start("hpp", "approve")
    run_all(world)
    first = world.record(flow)
    assert first is not None and first.state is FlowState.WAITING
    world.advance(601)
    world.engine.dispatch_due()
    run_all(world)
    failed = world.record(flow)
    assert failed is not None and failed.state is FlowState.FAILED, world.describe(flow)
    world.engine.retry(flow.flow_id)
    run_all(world)
    restarted = world.record(flow)
    assert restarted is not None and restarted.state is FlowState.WAITING and restarted.order_id != flow.base
    paid = world.sim.admin.complete_hpp(flow.base)  # the first page, still open
    for note in world.notifications(flow):
        world.notify(note["body"])
    run_all(world)
    late = world.record(flow)
    assert late is not None and late.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert (late.error or {}).get("type") == "LatePayment", late.error
    return flow, restarted.order_id, paid


def test_a_cancel_never_hides_a_payment_on_an_earlier_order(world: FlowWorld) -> None:
    """Moves: a hosted page flow expires unpaid (its page stays open), the operator restarts it (order
    ``-2``), the customer pays the first page, its notification stops the flow in ``needs_attention``
    (``LatePayment``); the operator then cancels it.

    What goes wrong: the wait step *consumed* the notification when it raised the LatePayment (an
    ``Attention``), so nothing kept in the record reports the payment any more; ``Engine.cancel`` ends
    the flow ``cancelled`` with the payment at the gateway (docs/operations.md: "a plain cancel does not
    close a late payment... the flow comes back to needs_attention"). Invariants 1 and 2."""
    flow, _, paid = _hpp_restarted_then_old_page_paid(world)
    with pytest.raises(OperatorError, match=str(paid["operationId"])):
        world.engine.cancel(flow.flow_id, "the operator cancels")  # refused: accept, refund or keep it
    world.settle()
    done = world.record(flow)
    assert done is not None
    assert done.state is not FlowState.CANCELLED, (
        f"payment {paid['operationId']} on order {flow.base} is at the gateway while the flow says cancelled: "
        f"{world.describe(flow)}"
    )
    world.check_settled()


def test_accepting_an_earlier_order_payment_never_drops_it(world: FlowWorld) -> None:
    """Moves: as above up to the LatePayment ("moved to a new order"); the operator takes the documented
    way to accept it, ``retry``; the customer (who got the new page meanwhile) pays it too.

    What goes wrong: the retry does not take the kept payment (the notification was consumed by the step
    that raised the LatePayment): the flow waits again, the second page's payment resumes it and it ends
    ``succeeded`` naming only that one. The first payment (a second charge of the customer) is named
    nowhere: not in the outcome, not in an error, no ``payment.late``. Invariants 1 and 4."""
    flow, new_order, paid = _hpp_restarted_then_old_page_paid(world)
    with pytest.raises(OperatorError, match="keep-late-payment"):
        world.engine.retry(flow.flow_id)  # its waiting step would find the same earlier order's payment
    kept = world.engine.keep_late_payment(flow.flow_id)  # the merchant accepts it: the flow's outcome
    assert kept.state is FlowState.SUCCEEDED and kept.outcome is not None
    assert kept.outcome["operation"]["operationId"] == paid["operationId"]
    world.sim.admin.complete_hpp(new_order)
    world.discover()  # the model learns the flow's orders (the notifications of -2 are its own)
    for note in world.notifications(flow):
        world.notify(note["body"])
    world.settle()
    done = world.record(flow)
    assert done is not None
    shown = json.dumps({"outcome": done.outcome, "error": done.error})
    assert paid["operationId"] in shown, (
        f"payment {paid['operationId']} on the flow's first order is named nowhere: {world.describe(flow)}"
    )
    world.check_settled()


# -- 2. a capture of the flow's payment, notified, is taken for a second payment ------------------------------


def test_a_notified_capture_of_the_flows_payment_is_not_a_second_payment(world: FlowWorld) -> None:
    """Moves: a hosted page flow with explicit capture succeeds (the customer's payment ``AUTHORIZED``); the
    merchant captures it with a ``capture`` flow, which the gateway answers ``PENDING`` ("follow-up
    notifications are expected"); it settles ``EXECUTED`` and the gateway notifies it to the order's
    ``notificationUrl`` (durapay's receiver), with the order's token.

    What goes wrong: the receiver routes it by order id to the hosted page flow; the engine takes any
    ``AUTHORIZED``/``EXECUTED`` operation for a payment taken (``gateway.reported_payment`` looks at the
    result only, never at the type or the parent operation), and the capture is not in the succeeded
    flow's ``operationIds``: the flow goes to ``needs_attention`` with ``LatePayment`` ("second payment"),
    and the merchant gets ``payment.late``. The capture then shows in two flows (the capture flow's
    outcome, and the page flow as a second charge of the customer), and the operator's documented answer,
    ``refund_late_payment``, refunds the capture, i.e. the customer's one payment, while the page flow goes
    back to ``succeeded``. Invariants 1 and 4 (and 5: a ``payment.late`` for no late payment)."""
    data = world.hpp_input("m930cap")
    data["paymentSession"]["captureType"] = "EXPLICIT"
    flow = world.start_flow("hpp", data, key="hpp-explicit")
    run_all(world)
    world.sim.admin.complete_hpp("m930cap")
    for note in world.sim.admin.notifications(order_id="m930cap"):
        world.notify(note["body"])
    run_all(world)
    paid = world.record(flow)
    assert paid is not None and paid.state is FlowState.SUCCEEDED, world.describe(flow)
    authorization = paid.outcome["operation"]  # type: ignore[index]
    assert authorization["operationResult"] == "AUTHORIZED", authorization
    world.sim.admin.pend("capture_operation", final="000")
    capture = world.start_flow("capture", {"operationId": authorization["operationId"]}, key="capture-1")
    run_all(world)
    world.sim.admin.settle_pending()
    seen = {note["body"]["eventId"] for note in world.sim.admin.notifications(order_id="m930cap")}
    for note in world.sim.admin.notifications(order_id="m930cap"):
        world.notify(note["body"])  # the capture's notification (the payment's again is a repeat)
    world.settle()
    captured = world.record(capture)
    assert captured is not None and captured.state is FlowState.SUCCEEDED, world.describe(capture)
    done = world.record(flow)
    assert done is not None
    late = [event.body for event, _ in world.engine.events(types=["payment.late"]) if event.body["flow"] == flow.flow_id]
    assert done.state is FlowState.SUCCEEDED and not late, (
        f"the capture {captured.outcome['operation']['operationId']} of the flow's own payment is reported as a "  # type: ignore[index]
        f"second payment ({len(seen)} notifications): {done.state}, error {done.error}, events {late}"
    )


# -- 3. a late payment closed by refund: only once the refund is done --------------------------------------------------------


def _hpp_failed_then_paid(world: FlowWorld) -> tuple[Any, dict[str, str]]:
    """A hosted page flow ends ``failed`` at its deadline, its page still open; the customer pays it and
    its notification stops the flow in ``needs_attention`` (``LatePayment``, ended failed)."""
    flow = world.start("hpp", "approve")
    run_all(world)
    world.advance(601)
    world.engine.dispatch_due()
    run_all(world)
    failed = world.record(flow)
    assert failed is not None and failed.state is FlowState.FAILED, world.describe(flow)
    paid = world.sim.admin.complete_hpp(flow.base)
    for note in world.notifications(flow):
        world.notify(note["body"])
    late = world.record(flow)
    assert late is not None and late.state is FlowState.NEEDS_ATTENTION and (late.error or {}).get("type") == "LatePayment"
    return flow, paid


def test_a_payment_being_refunded_is_never_also_taken_as_the_outcome(world: FlowWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """Moves: a late payment on a failed hosted page flow; an operator refunds it; before the refund flow
    has run, another operator accepts the payment (``retry``, "Accept"); the refund flow then succeeds, but
    the worker that ends it dies before it closes the late flow.

    Before: the flow was cancelled as the refund flow *started*, and an accept between the two writes took
    the payment the refund then returned. Now: the accept is refused while the refund is under way, the
    refund's end closes the flow, and asking to refund again closes it when that worker was lost."""
    flow, paid = _hpp_failed_then_paid(world)
    under_way = world.engine.refund_late_payment(flow.flow_id)
    assert under_way.state is FlowState.NEEDS_ATTENTION, "closed only once the refund succeeded"
    with pytest.raises(OperatorError, match="being refunded"):
        world.engine.retry(flow.flow_id)
    with pytest.raises(OperatorError, match="being refunded"):
        world.engine.keep_late_payment(flow.flow_id)

    def lost(refund: Any) -> None:
        """The worker that ended the refund flow died before it closed the late flow."""

    monkeypatch.setattr(world.engine.late, "refund_ended", lost)
    world.settle()
    monkeypatch.undo()
    refunds = [op for op in world.sim.admin.operations(order_id=flow.base) if op.get("parentOperationId") == paid["operationId"]]
    assert len(refunds) == 1 and refunds[0]["operationResult"] in {"REFUNDED", "VOIDED"}, refunds
    still = world.record(flow)
    assert still is not None and still.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    closed = world.engine.refund_late_payment(flow.flow_id)  # asked again: the refund is done, the flow closes
    assert closed.state is FlowState.CANCELLED and closed.outcome is not None
    assert closed.outcome["refund"]["operationId"] == paid["operationId"]
    world.check_settled()


def test_a_refund_that_succeeds_closes_its_late_payment(world: FlowWorld) -> None:
    flow, paid = _hpp_failed_then_paid(world)
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    closed = world.record(flow)
    assert closed is not None and closed.state is FlowState.CANCELLED, world.describe(flow)
    assert closed.outcome is not None and closed.outcome["refund"]["operationId"] == paid["operationId"]
    world.check_settled()


def _pass(world: FlowWorld, seconds: float) -> None:
    """Time passes: the clocks move on, and Redis forgets every key whose TTL ran out meanwhile."""
    world.advance(seconds)
    client = world.engine.redis
    for key in list(client.scan_iter(count=1000)):
        if 0 < client.ttl(key) <= seconds:
            client.delete(key)


def test_a_refunded_late_payment_is_not_reported_again_by_a_replayed_notification(world: FlowWorld) -> None:
    """Moves: a late payment on a failed hosted page flow; the operator refunds it
    (``refund_late_payment``: the refund flow refunds it, the flow is ``cancelled`` naming the refund);
    eight days later the same notification (same body, same token, same event id) is delivered again (a
    replay: the receiver remembers event ids for 7 days).

    What goes wrong: the receiver reads the operation back (still ``EXECUTED``: a refund is an operation of
    its own) and signals it; ``money.lua`` holds any reported payment in a ``cancelled`` flow unaccounted,
    even the one its outcome names as refunded: the flow is back in ``needs_attention`` with
    ``LatePayment`` and the merchant gets ``payment.late`` for money already returned. The runbook's
    "Accept" (``retry``) then makes the refunded payment the flow's outcome (``succeeded``). Invariants 3
    and 5."""
    flow, paid = _hpp_failed_then_paid(world)
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    closed = world.record(flow)
    assert closed is not None and closed.state is FlowState.CANCELLED, world.describe(flow)
    refunds = [op for op in world.sim.admin.operations(order_id=flow.base) if op.get("parentOperationId") == paid["operationId"]]
    assert refunds and refunds[0]["operationResult"] in {"REFUNDED", "VOIDED"}, refunds
    _pass(world, 8 * 86400)
    replayed = [note for note in world.notifications(flow) if note["body"]["operation"]["operationId"] == paid["operationId"]]
    statuses = [world.notify(note["body"]) for note in replayed]
    done = world.record(flow)
    assert done is not None
    assert done.state is FlowState.CANCELLED, (
        f"payment {paid['operationId']}, refunded by {refunds[0]['operationId']}, reported late again after a replay "
        f"({statuses}): {done.state}, error {done.error}"
    )


def test_a_late_payment_is_closed_only_once_its_refund_is_done(world: FlowWorld) -> None:
    """Moves: a late payment on a failed hosted page flow; the operator refunds it
    (``refund_late_payment``); the gateway refuses the refund (a 400: the README lists PS0022-PS0029 as
    a refund's documented failures).

    What goes wrong: ``refund_late_payment`` ends the flow ``cancelled`` ("late payment refunded", the
    outcome naming the refund flow) as soon as the refund flow is *started*; the refund flow then fails,
    and nothing brings the payment back to a person: the flow says cancelled and refunded while the
    customer's payment is still ``EXECUTED`` at the gateway, unrefunded. Invariant 2 (and 3: the outcome
    names a refund the gateway never made)."""
    flow, paid = _hpp_failed_then_paid(world)
    world.sim.admin.set_faults(mode="error", operation="refund_operation", status=400, count=50)
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    done = world.record(flow)
    assert done is not None
    refund_flow = world.engine.get(derived_id("f", "refund", refund_key(flow.flow_id, paid["operationId"])))
    refunds = [op for op in world.sim.admin.operations(order_id=flow.base) if op.get("parentOperationId") == paid["operationId"]]
    assert done.state is not FlowState.CANCELLED or refunds, (
        f"the flow says {done.state} with {done.outcome}, its refund flow is {refund_flow.state} and the gateway "
        f"holds payment {paid['operationId']} unrefunded"
    )
    assert done.state is FlowState.NEEDS_ATTENTION and (done.error or {}).get("type") == "LatePayment", world.describe(flow)
    with pytest.raises(OperatorError, match="ended failed"):
        world.engine.refund_late_payment(flow.flow_id)  # asking again says what became of the refund


# -- 5. a flow whose payment succeeded is never cancelled -------------------------------------------------------


def test_a_cancel_of_a_second_payment_never_cancels_the_paid_flow(world: FlowWorld) -> None:
    """Found by ``durapay chaos`` with operator actions: a hosted page flow succeeded with payment P; a second
    payment Q is reported (LatePayment beside a success); the operator cancels. The cancel rewrote the flow
    as ended cancelled (its outcome naming P replaced by a reason), and the refund then closed it cancelled
    with P still at the gateway. A flow whose payment succeeded can never end cancelled: the cancel is
    refused, naming the payment, and the flow stays P's."""
    flow = world.start("hpp", "approve")
    run_all(world)
    world.sim.admin.complete_hpp(flow.base)
    for note in world.notifications(flow):
        world.notify(note["body"])
    run_all(world)
    paid = world.record(flow)
    assert paid is not None and paid.state is FlowState.SUCCEEDED and paid.outcome is not None
    first = paid.outcome["operation"]["operationId"]
    second = f"{flow.base}-2"
    body = {key: value for key, value in world.hpp_input(second).items() if key != "waitSeconds"}
    world.engine.gateway().call(Catalogue.create_hpp_order, request=body)
    late = world.sim.admin.complete_hpp(second)
    operation = world.engine.gateway().call(Catalogue.get_operation, late["operationId"]).wire()
    assert world.engine.signal(flow.flow_id, "notification", {"operation": operation}, by=RECEIVER) == "late_payment"
    with pytest.raises(OperatorError, match=first):
        world.engine.cancel(flow.flow_id, "the operator cancels")
    still = world.record(flow)
    assert still is not None and still.outcome is not None and still.outcome["operation"]["operationId"] == first
    assert (still.error or {}).get("endedAs") == "succeeded", still.error
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED and done.outcome is not None, world.describe(flow)
    assert done.outcome["operation"]["operationId"] == first


# -- 6. a second review: two late payments on one flow, each closed by a person --------------------------------


def gateway_operation(world: FlowWorld, operation_id: str) -> dict[str, Any]:
    return world.engine.gateway().call(Catalogue.get_operation, operation_id).wire()


def late_events(world: FlowWorld, flow_id: str) -> list[dict[str, Any]]:
    return [event.body for event, _ in world.engine.events(types=["payment.late"]) if event.body["flow"] == flow_id]


def refunds_of(world: FlowWorld, operation_id: str) -> list[dict[str, Any]]:
    return [op for op in world.sim.admin.operations() if op.get("parentOperationId") == operation_id]


def _two_late_payments(world: FlowWorld) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A hosted page flow expires unpaid (its page stays open); the operator restarts it (order ``-2``, a new
    page). The customer pays both pages: the first page's payment A stops the flow in ``needs_attention``
    (``LatePayment``, "moved to a new order"); the second page's payment B is kept on the record."""
    flow = world.start("hpp", "approve")
    run_all(world)
    world.advance(601)
    world.engine.dispatch_due()
    run_all(world)
    failed = world.record(flow)
    assert failed is not None and failed.state is FlowState.FAILED, world.describe(flow)
    world.engine.retry(flow.flow_id)
    run_all(world)
    restarted = world.record(flow)
    assert restarted is not None and restarted.state is FlowState.WAITING and restarted.order_id != flow.base
    first = world.sim.admin.complete_hpp(flow.base)
    second = world.sim.admin.complete_hpp(restarted.order_id)
    world.discover()  # the model learns the order -2 (its notifications are the flow's)
    for note in world.notifications(flow):
        assert world.notify(note["body"]) == 200
    run_all(world)
    late = world.record(flow)
    assert late is not None and late.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert (late.error or {}).get("operation", {}).get("operationId") == first["operationId"], late.error
    return flow, gateway_operation(world, first["operationId"]), gateway_operation(world, second["operationId"])


def test_a_late_payment_refunded_first_is_not_reported_again_once_a_second_one_is_refunded(world: FlowWorld) -> None:
    """Moves: as in ``_two_late_payments``; the operator refunds A (``refund-late-payment``): its refund flow
    succeeds and closes the flow ``cancelled`` naming that refund, which at once brings it back to
    ``needs_attention`` for B (endedAs cancelled); the operator refunds B the same way: ``cancelled``. Both
    payments are refunded at the gateway. Then A's notification is delivered again (the gateway sends an event
    again; the receiver forgets event ids after 7 days).

    What goes wrong: ``LatePayments._close_refunded`` writes the outcome afresh,
    ``{reason, refund: {flow, operationId}}``, naming only the refund it closes: closing B erased A's refund.
    ``money.lua`` then holds A unaccounted in a cancelled flow (its outcome names another refund): the flow is
    back in ``needs_attention`` with ``LatePayment`` A and the merchant gets ``payment.late`` for money returned
    days ago. The record no longer shows A or its refund anywhere (the outcome names B's only), and every
    close of one payment re-opens the other (asking to refund A closes it by rewriting the outcome to A's
    refund, which forgets B's). Invariants 1 and 5 (and 3: the outcome of a flow with two refunded payments
    names one)."""
    flow, a, b = _two_late_payments(world)
    world.engine.refund_late_payment(flow.flow_id)  # A
    world.settle()
    after_a = world.record(flow)
    assert after_a is not None and after_a.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert (after_a.error or {}).get("operation", {}).get("operationId") == b["operationId"], after_a.error
    world.engine.refund_late_payment(flow.flow_id)  # B
    world.settle()
    closed = world.record(flow)
    assert closed is not None and closed.state is FlowState.CANCELLED, world.describe(flow)
    for paid in (a, b):
        refunds = refunds_of(world, paid["operationId"])
        assert len(refunds) == 1 and refunds[0]["operationResult"] in {"REFUNDED", "VOIDED"}, refunds
    told = len(late_events(world, flow.flow_id))
    result = world.engine.signal(flow.flow_id, "notification", {"operation": a}, by=RECEIVER)
    done = world.record(flow)
    assert done is not None
    assert result == "finished" and done.state is FlowState.CANCELLED, (
        f"payment {a['operationId']}, refunded by {refunds_of(world, a['operationId'])[0]['operationId']}, is reported "
        f"late again ({result}): {done.state}, error {done.error}, outcome {done.outcome}"
    )
    assert len(late_events(world, flow.flow_id)) == told


def test_a_late_payment_refunded_first_is_not_reported_again_once_a_second_one_is_kept(world: FlowWorld) -> None:
    """Moves: as above, but the merchant keeps B (``keep-late-payment``) instead of refunding it: the flow takes
    B as its outcome and succeeds. Then A's notification is delivered again.

    What goes wrong: ``LatePayments.keep`` builds the outcome from the old one without its ``refund`` (A's) and
    lists only B in ``operationIds``: A's refund is forgotten, and ``money.lua`` holds A, refunded, as a second
    payment of the succeeded flow: ``needs_attention`` (``LatePayment``, endedAs succeeded) and ``payment.late``
    for money returned. Invariants 1, 4 and 5."""
    flow, a, _ = _two_late_payments(world)
    world.engine.refund_late_payment(flow.flow_id)  # A
    world.settle()
    kept = world.engine.keep_late_payment(flow.flow_id)  # B
    assert kept.state is FlowState.SUCCEEDED, world.describe(flow)
    assert refunds_of(world, a["operationId"]), "A was refunded at the gateway"
    told = len(late_events(world, flow.flow_id))
    result = world.engine.signal(flow.flow_id, "notification", {"operation": a}, by=RECEIVER)
    done = world.record(flow)
    assert done is not None
    assert result == "finished" and done.state is FlowState.SUCCEEDED, (
        f"payment {a['operationId']}, refunded, is reported as a second payment ({result}): {done.state}, "
        f"error {done.error}, outcome {done.outcome}"
    )
    assert len(late_events(world, flow.flow_id)) == told
