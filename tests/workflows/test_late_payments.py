"""Late payments (``workflows/late_payments.py``, ``workflows/engine/lua/money.lua``): money the gateway reports for
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
from datetime import UTC, datetime
from typing import Any

import pytest

from durapay.gateway import Catalogue, PayByLinkRenewRequest
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import OperatorError
from durapay.workflows.engine.keys import derived_id
from durapay.workflows.engine.signals import RECEIVER
from durapay.workflows.engine.states import FlowState
from durapay.workflows.late_payments import refund_key
from tests.workflows.aof_tail import AofTail
from tests.workflows.flow_model import FlowWorld
from tests.workflows.model_kinds import DECLINE, session


@pytest.fixture
def world(model_parts: tuple[SimulatorServer, AofTail]) -> Iterator[FlowWorld]:
    built = FlowWorld(*model_parts, example=930)
    yield built
    built.close()


#: Why some closes of a payment on an order the flow left cannot complete yet: a close of a flow that still
#: holds money in flight is a cancel through transition.lua (``LatePayments._write``), and the read that
#: follows must then judge the flow's own order and leave the kept payment to money.lua.


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
    way to accept it, ``retry``; the customer (who got the new page meanwhile) pays it too. (The keep of a
    flow that still holds page ``-2`` reads that order first, then keeps: ``LatePayments._write``.)

    What goes wrong: the retry does not take the kept payment (the notification was consumed by the step
    that raised the LatePayment): the flow waits again, the second page's payment resumes it and it ends
    ``succeeded`` naming only that one. The first payment (a second charge of the customer) is named
    nowhere: not in the outcome, not in an error, no ``payment.late``. Invariants 1 and 4."""
    flow, new_order, paid = _hpp_restarted_then_old_page_paid(world)
    with pytest.raises(OperatorError, match="keep-late-payment"):
        world.engine.retry(flow.flow_id)  # its waiting step would find the same earlier order's payment
    asked = world.engine.keep_late_payment(flow.flow_id)  # the flow still holds page -2: it reads it first
    assert asked.state is FlowState.READY and asked.cancel_requested, asked.summary()
    world.settle()
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
    (``refund_late_payment``); the gateway refuses the refund (a 400: docs/flows.md lists PS0022-PS0029 as
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
    """Moves: as in ``_two_late_payments``; the operator refunds A (``refund-late-payment``). The flow still holds
    page ``-2``, so the refund's close is a cancel through the rule: the flow reads order ``-2`` first, finds B
    there (its own payment: it succeeds with it) and stops again for A, beside it; asking to refund A again
    closes it: back to ``succeeded``, A listed refunded. Then A's notification is delivered again (the gateway
    sends an event again; the receiver forgets event ids after 7 days).

    What went wrong (second review, when B was refunded as a late payment too): ``_close_refunded`` wrote the
    outcome afresh, naming only the refund it closed: closing B erased A's refund, and ``money.lua`` then held
    A unaccounted again (``payment.late`` for money returned days ago). Invariants 1 and 5."""
    flow, a, b = _two_late_payments(world)
    world.engine.refund_late_payment(flow.flow_id)  # A: the flow reads its own order first
    world.settle()
    after_read = world.record(flow)
    assert after_read is not None and after_read.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert (after_read.error or {}).get("operation", {}).get("operationId") == a["operationId"], after_read.error
    world.engine.refund_late_payment(flow.flow_id)  # A again: its refund is done, the close goes through
    world.settle()
    closed = world.record(flow)
    assert closed is not None and closed.state is FlowState.SUCCEEDED and closed.outcome is not None, world.describe(flow)
    assert closed.outcome["operation"]["operationId"] == b["operationId"]
    refunds = refunds_of(world, a["operationId"])
    assert len(refunds) == 1 and refunds[0]["operationResult"] in {"REFUNDED", "VOIDED"}, refunds
    assert not refunds_of(world, b["operationId"])
    told = len(late_events(world, flow.flow_id))
    result = world.engine.signal(flow.flow_id, "notification", {"operation": a}, by=RECEIVER)
    done = world.record(flow)
    assert done is not None
    assert result == "finished" and done.state is FlowState.SUCCEEDED, (
        f"payment {a['operationId']}, refunded by {refunds[0]['operationId']}, is reported late again ({result}): "
        f"{done.state}, error {done.error}, outcome {done.outcome}"
    )
    assert len(late_events(world, flow.flow_id)) == told


def test_a_late_payment_refunded_first_is_not_reported_again_once_a_second_one_is_kept(world: FlowWorld) -> None:
    """Moves: as above, but the merchant keeps A (``keep-late-payment``): the flow reads order ``-2`` first and
    succeeds with B, A shown beside it; asked again, the keep lists A beside B. Then A's notification is
    delivered again.

    What went wrong (second review): ``LatePayments.keep`` built the outcome from the old one without the
    late payments closed before it, and ``money.lua`` then held a closed payment as news again. Invariants 1,
    4 and 5."""
    flow, a, b = _two_late_payments(world)
    world.engine.keep_late_payment(flow.flow_id)  # A: the flow reads its own order first
    world.settle()
    kept = world.engine.keep_late_payment(flow.flow_id)  # A again, beside B
    assert kept.state is FlowState.SUCCEEDED and kept.outcome is not None, world.describe(flow)
    assert kept.outcome["operation"]["operationId"] == b["operationId"]
    assert a["operationId"] in kept.outcome["operationIds"], kept.outcome
    told = len(late_events(world, flow.flow_id))
    result = world.engine.signal(flow.flow_id, "notification", {"operation": a}, by=RECEIVER)
    done = world.record(flow)
    assert done is not None
    assert result == "finished" and done.state is FlowState.SUCCEEDED, (
        f"payment {a['operationId']}, kept, is reported as a second payment again ({result}): {done.state}, "
        f"error {done.error}, outcome {done.outcome}"
    )
    assert len(late_events(world, flow.flow_id)) == told


# -- 7. a third review: closing a late payment on the order the flow left; accepting one refunded meanwhile ----


def link_of(record: Any) -> str:
    return str(record.outputs["create"]["paymentLink"]["linkId"])


def link_status(world: FlowWorld, link_id: str) -> str:
    return str(world.engine.gateway().call(Catalogue.get_paybylink, link_id).paymentLink.status)


def _link_input(order_id: str, world: FlowWorld) -> dict[str, Any]:
    day = datetime.fromtimestamp(world.clock.now() + 20 * 86400, UTC).strftime("%Y-%m-%d")
    return {
        "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
        "paymentSession": session(),
        "expirationDate": day,
    }


def _renew_and_pay(world: FlowWorld, link_id: str) -> dict[str, str]:
    """The link is renewed in the gateway's back office (not through durapay) and the customer pays it."""
    day = datetime.fromtimestamp(world.clock.now() + 5 * 86400, UTC).strftime("%Y-%m-%d")
    world.engine.gateway().call(Catalogue.renew_paybylink, link_id, request=PayByLinkRenewRequest(expirationDate=day).wire())
    return world.sim.admin.complete_link(link_id)


def _link_declined(world: FlowWorld, order_id: str) -> tuple[Any, str]:
    """A pay-by-link flow whose customer is declined: its link FAILED, the flow ``failed``."""
    flow = world.start_flow("paybylink", _link_input(order_id, world), key=order_id)
    run_all(world)
    waiting = world.record(flow)
    assert waiting is not None and waiting.state is FlowState.WAITING, world.describe(flow)
    world.sim.admin.complete_link(link_of(waiting), pan=DECLINE)
    for note in world.notifications(flow):
        world.notify(note["body"])
    run_all(world)
    failed = world.record(flow)
    assert failed is not None and failed.state is FlowState.FAILED, world.describe(flow)
    return flow, link_of(waiting)


def _link_moved_then_old_link_paid(world: FlowWorld, order_id: str) -> tuple[Any, str, dict[str, str]]:
    """A declined pay-by-link flow is restarted by the operator (order ``-2``, link L2); the first link L1 is
    renewed at the gateway and paid: ``needs_attention`` (``LatePayment``, "moved to a new order") while the
    flow still holds L2, ACTIVE."""
    flow, first_link = _link_declined(world, order_id)
    world.engine.retry(flow.flow_id)
    run_all(world)
    again = world.record(flow)
    assert again is not None and again.state is FlowState.WAITING and again.order_id != flow.base, world.describe(flow)
    second_link = link_of(again)
    paid = _renew_and_pay(world, first_link)
    world.discover()
    for note in world.notifications(flow):
        world.notify(note["body"])
    run_all(world)
    late = world.record(flow)
    assert late is not None and late.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert (late.error or {}).get("endedAs") == "moved to a new order", late.error
    assert link_status(world, second_link) == "ACTIVE"
    return flow, second_link, paid


def _never_ended_past_its_link(world: FlowWorld, flow: Any, second_link: str, paid: dict[str, str]) -> None:
    """The flow closed its link L2 and read the gateway (transition.lua's rule) instead of ending with it open;
    the payment on L1 is still shown, to be closed once the flow has stopped."""
    done = world.record(flow)
    assert done is not None
    status = link_status(world, second_link)
    assert status != "ACTIVE" and not (done.finished and done.unsettled), (
        f"flow {done.state} with unsettled {done.unsettled} while its link {second_link} is {status}: the customer "
        "can pay it and be charged twice"
    )
    assert done.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    assert (done.error or {}).get("operation", {}).get("operationId") == paid["operationId"], done.error


def test_keeping_a_payment_on_the_order_the_flow_left_closes_its_open_link_first(world: FlowWorld) -> None:
    """Moves: as in ``_link_moved_then_old_link_paid``; the merchant keeps the payment on L1.

    What went wrong: ``LatePayments.keep`` wrote ``succeeded`` with ``unsettled`` ``{open: true}`` still set
    and L2 ACTIVE: the customer could pay L2 too (charged twice; the review's run: a second LatePayment).
    Now the keep is a cancel through transition.lua's rule: the flow cancels L2 and reads its order first."""
    flow, second_link, paid = _link_moved_then_old_link_paid(world, "m930keep")
    asked = world.engine.keep_late_payment(flow.flow_id)
    assert asked.state is FlowState.READY and asked.cancel_requested, asked.summary()
    world.settle()
    _never_ended_past_its_link(world, flow, second_link, paid)


def test_refunding_a_payment_on_the_order_the_flow_left_closes_its_open_link_first(world: FlowWorld) -> None:
    """Moves: as in ``_link_moved_then_old_link_paid``; the operator refunds the payment on L1 and the refund
    flow succeeds.

    What went wrong: ``_close_refunded`` cleared ``unsettled`` itself and ended the flow ``cancelled`` with L2
    ACTIVE (a second home for transition.lua's rule). Now the refund's close is a cancel through the rule: the
    flow cancels L2 and reads its order first."""
    flow, second_link, paid = _link_moved_then_old_link_paid(world, "m930refund")
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    _never_ended_past_its_link(world, flow, second_link, paid)
    assert len(refunds_of(world, paid["operationId"])) == 1


def test_a_kept_payment_on_the_order_the_flow_left_is_its_outcome_once_its_link_is_closed(world: FlowWorld) -> None:
    """Then, once the flow has closed L2 and stopped again, keeping the payment makes it the flow's outcome."""
    flow, second_link, paid = _link_moved_then_old_link_paid(world, "m930keep2")
    world.engine.keep_late_payment(flow.flow_id)
    world.settle()
    world.engine.keep_late_payment(flow.flow_id)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.SUCCEEDED and not done.unsettled, world.describe(flow)
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]
    assert link_status(world, second_link) != "ACTIVE"
    world.check_settled()


def test_a_refunded_payment_on_the_order_the_flow_left_is_closed_once_its_link_is_closed(world: FlowWorld) -> None:
    """Then, once the flow has closed L2 and stopped again, asking to refund again closes it: cancelled, naming
    the refund."""
    flow, second_link, paid = _link_moved_then_old_link_paid(world, "m930refund2")
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.CANCELLED and not done.unsettled, world.describe(flow)
    assert done.outcome is not None and done.outcome["refund"]["operationId"] == paid["operationId"]
    assert link_status(world, second_link) != "ACTIVE"
    assert len(refunds_of(world, paid["operationId"])) == 1
    world.check_settled()


def test_an_accept_is_refused_once_the_gateway_shows_the_payment_refunded(world: FlowWorld) -> None:
    """Moves: a declined pay-by-link flow fails; its link is renewed at the gateway and paid: ``LatePayment``.
    The money goes back another way than refund-late-payment (a plain ``refund`` flow of the operation, which
    succeeds); the operator then accepts (``retry``).

    What went wrong: the wait step took the kept notification as the outcome without reading the gateway: the
    flow ended ``succeeded`` naming a payment the gateway shows refunded. Now the accept reads the order first
    and is refused, naming the refund."""
    flow, link = _link_declined(world, "m930accept")
    paid = _renew_and_pay(world, link)
    for note in world.notifications(flow):
        world.notify(note["body"])
    late = world.record(flow)
    assert late is not None and late.state is FlowState.NEEDS_ATTENTION, world.describe(flow)
    refund = world.start_flow("refund", {"operationId": paid["operationId"]}, key="m930accept-refund")
    run_all(world)
    refunded = world.record(refund)
    assert refunded is not None and refunded.state is FlowState.SUCCEEDED, world.describe(refund)
    refund_id = refunds_of(world, paid["operationId"])[0]["operationId"]
    try:
        world.engine.retry(flow.flow_id)  # "accept"
    except OperatorError as refused:
        assert refund_id in str(refused), refused
    world.settle()
    done = world.record(flow)
    assert done is not None
    assert done.state is not FlowState.SUCCEEDED, (
        f"the flow succeeded with payment {paid['operationId']}, which the gateway shows refunded by {refund_id}: {done.outcome}"
    )
    assert done.state is FlowState.NEEDS_ATTENTION and (done.error or {}).get("type") == "LatePayment", world.describe(flow)


def test_a_late_payment_refunded_elsewhere_is_closed_by_refund_late_payment_without_a_second_refund(
    world: FlowWorld,
) -> None:
    """Left by the review's fix of accept: a late payment whose money went back another way (a plain refund
    flow, the gateway's back office) was refused by accept and keep, and refund-late-payment started a refund
    the gateway could only refuse: the flow could never be closed. refund-late-payment now reads the gateway
    first and closes it as given back, naming what the gateway shows, with no second refund."""
    flow, link = _link_declined(world, "m931undone")
    paid = _renew_and_pay(world, link)
    for note in world.notifications(flow):
        world.notify(note["body"])
    refund = world.start_flow("refund", {"operationId": paid["operationId"]}, key="m931undone-refund")
    run_all(world)
    refund_id = refunds_of(world, paid["operationId"])[0]["operationId"]
    with pytest.raises(OperatorError, match=refund_id):
        world.engine.keep_late_payment(flow.flow_id)
    closed = world.engine.refund_late_payment(flow.flow_id)
    world.settle()
    done = world.record(flow)
    assert done is not None and done.state is FlowState.CANCELLED, world.describe(flow)
    assert refund_id in str((done.outcome or {}).get("refund")), done.outcome
    assert closed.state is FlowState.CANCELLED
    assert [op["operationId"] for op in refunds_of(world, paid["operationId"])] == [refund_id], "no second refund"
    assert world.record(refund) is not None


def test_a_payment_being_refunded_is_offered_no_accept_nor_keep(world: FlowWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: after "Refund" the flow stays in needs_attention until its refund flow succeeded, and the
    console still offered "Accept late payment", which the engine refuses while the refund is under way
    (``LatePayments.accepting``); nor did it name the refund flow. The actions are asked of the engine."""
    flow, _ = _hpp_failed_then_paid(world)
    record = world.engine.get(flow.flow_id)
    assert world.engine.actions(record) == ["accept", "refund"] and world.engine.refund_under_way(record) is None
    world.engine.refund_late_payment(flow.flow_id)
    record = world.engine.get(flow.flow_id)
    refund = world.engine.refund_under_way(record)
    assert record.state is FlowState.NEEDS_ATTENTION and refund is not None and refund.kind == "refund"
    assert world.engine.actions(record) == [], "nothing to do but wait for the refund (linked, not offered)"
    with pytest.raises(OperatorError, match="being refunded"):
        world.engine.retry(flow.flow_id)

    monkeypatch.setattr(world.engine.late, "refund_ended", lambda refund: None)  # its worker lost at the end
    world.settle()
    monkeypatch.undo()
    record = world.engine.get(flow.flow_id)
    assert record.state is FlowState.NEEDS_ATTENTION
    assert world.engine.actions(record) == ["refund"], "asking again closes it, the refund done"
    assert world.engine.refund_late_payment(flow.flow_id).state is FlowState.CANCELLED


def test_the_operators_reason_for_a_refund_is_kept_in_the_flows_history(world: FlowWorld) -> None:
    """Issue 27: the console's refund asks for a reason "kept in the flow's history", but the refund
    flow's end closed the flow with "late payment refunded", by "refund": who asked, and why, were lost."""
    flow, _ = _hpp_failed_then_paid(world)
    world.engine.refund_late_payment(flow.flow_id, "the customer asked", by="console")
    world.settle()
    closed = world.record(flow)
    assert closed is not None and closed.state is FlowState.CANCELLED, world.describe(flow)
    assert closed.outcome is not None and closed.outcome["reason"] == "the customer asked"
    last = world.engine.history(flow.flow_id)[-1]
    assert last["what"].endswith("cancelled (asked by console): the customer asked"), last
