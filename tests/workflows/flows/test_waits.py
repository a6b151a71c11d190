"""Waiting flows end only when the customer can no longer pay (``workflows.flows.waits``).

Each test drives a real flow step by step on a manual clock against the simulator over HTTP: the
customer acts through the simulator's pages, the merchant and the operator through the engine.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from durapay.gateway import Catalogue, PayByLinkRenewRequest
from durapay.service.receiver import NotificationReceiver
from durapay.simulator import PAGE_PAYMENT, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.compact import Compactor
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows.waits import GRACE_SECONDS, KEEP_MARGIN_SECONDS, link_end
from tests.workflows.flows.session_engine import engine, link_input, session_engine, step_until

__all__ = ["engine"]

CHALLENGE_PAN = "5186151650005008"  # the simulator's "approved after a 3DS challenge"
ENDED = {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION}


def advance(flows: Engine, sim: SimulatorServer, seconds: float) -> None:
    """Move both clocks: the engine's (deadlines) and the simulator's (expiries)."""
    flows.clock.advance(seconds)  # type: ignore[attr-defined]
    sim.admin.advance_clock(seconds)


def build_input(order_id: str, version: str = "2") -> dict[str, Any]:
    return {
        "merchantUrl": "https://shop.example",
        "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
        "paymentSession": {"actionType": "PAY", "amount": "1500", "language": "eng", "paymentService": "CARDS"},
        "version": version,
    }


def hpp_input(order_id: str) -> dict[str, Any]:
    return {
        "order": {"orderId": order_id, "amount": "900", "currency": "EUR"},
        "paymentSession": {"actionType": "PAY", "amount": "900", "language": "eng", "resultUrl": "https://shop.example/r"},
        "waitSeconds": 600,
    }


def link_of(record: Any) -> str:
    return str(record.outputs["create"]["paymentLink"]["linkId"])


def assert_waits_to(flows: Engine, sim: SimulatorServer, flow_id: str, day: str, *, past: float) -> None:
    """The flow waits on to the link's end on ``day``: its reads at the pace (its due is the next read,
    never past that end) find the link open through ``past`` (the link's first end), and it still waits."""
    for _ in range(200):
        record = flows.get(flow_id)
        assert record.state is FlowState.WAITING, record.summary()
        assert record.due is not None and record.due <= link_end(day) + 1, "never read past the link's end"
        if flows.clock.now() > past:
            return
        advance(flows, sim, record.due - flows.clock.now() + 0.001)
        flows.run_step(flow_id, "payment")
    raise AssertionError("more than 200 reads before the link's first end")


def link_status(flows: Engine, link_id: str) -> str:
    return str(flows.gateway().call(Catalogue.get_paybylink, link_id).paymentLink.status)


# -- 1. build version 2 with 3DS -------------------------------------------------------------------


def test_a_version_2_build_whose_confirm_asks_for_3ds_waits_for_the_customer(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    started = flows.start("build", build_input("v2-3ds-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    assert sim.admin.fill_build_form(session, pan=CHALLENGE_PAN, complete_gdi=False) == "READY_FOR_PAYMENT"
    flows.signal(started.id, "form_completed", {})
    challenged = step_until(flows, started.id, {FlowState.WAITING, *ENDED})
    assert challenged.state is FlowState.WAITING, "confirm answered GDI_VERIFICATION: the customer is still paying"
    assert challenged.step == "challenge"
    assert challenged.unsettled is not None, "the customer may still pay: money in flight"

    assert sim.admin.complete_build_gdi(session) == "PAYMENT_COMPLETE"
    paid = sim.admin.operations(order_id=challenged.order_id)
    done = step_until(flows, started.id, ENDED)  # the notification is lost here: the deadline read finds it
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid[-1]["operationId"]
    assert done.unsettled is None


def test_a_form_whose_customer_is_at_3ds_at_the_deadline_is_read_until_the_session_ends(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, sim = engine
    started = flows.start("build", {**build_input("v3-3ds-1", version="3"), "formSeconds": 60})
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    session = waiting.outputs["create"]["sessionId"]
    assert sim.admin.fill_build_form(session, pan=CHALLENGE_PAN, complete_gdi=False) == "GDI_VERIFICATION"
    advance(flows, sim, 61)
    flows.run_step(started.id, "form")
    still = flows.get(started.id)
    assert still.state is FlowState.WAITING, f"the customer is at the 3DS step: not expired ({still.summary()})"
    assert sim.admin.complete_build_gdi(session) == "READY_FOR_PAYMENT"
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()


def test_cancelling_a_waiting_form_cancels_its_session_first(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, _sim = engine
    started = flows.start("build", build_input("form-cancel-1", version="3"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    flows.cancel(started.id)
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.CANCELLED, done.summary()
    state = flows.gateway().call(Catalogue.build_state, request={"sessionId": waiting.outputs["create"]["sessionId"]})
    assert str(state.state) == "PAYMENT_COMPLETE" and state.operation is not None
    assert str(state.operation.operationResult) in {"CANCELED", "CANCELLED"}, "the form can no longer be paid"


# -- 2. renewals followed ----------------------------------------------------------------------------


def test_a_link_renewed_outside_the_flow_keeps_the_flow_waiting_to_its_new_expiry(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("renew-out-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    link_id = link_of(waiting)
    later = (sim.admin.now() + timedelta(days=20)).date().isoformat()
    flows.gateway().call(Catalogue.renew_paybylink, link_id, request=PayByLinkRenewRequest(expirationDate=later).wire())
    assert waiting.due is not None
    advance(flows, sim, waiting.due - flows.clock.now() + 1)
    flows.run_step(started.id, "payment")
    still = flows.get(started.id)
    assert still.state is FlowState.WAITING, f"the gateway shows the link open: wait on ({still.summary()})"
    assert_waits_to(flows, sim, started.id, later, past=link_end(waiting.outputs["create"]["paymentLink"]["expirationDate"]))

    paid = sim.admin.complete_link(link_id)
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]


def test_a_finished_link_flow_is_kept_while_its_link_can_be_paid(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, _sim = engine
    expires = (datetime.now(UTC) + timedelta(days=80)).date().isoformat()
    started = flows.start("paybylink", {**link_input("keep-1"), "expirationDate": expires})
    step_until(flows, started.id, {FlowState.WAITING})
    flows.cancel(started.id)  # the link is cancelled first; then the flow ends
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.CANCELLED
    assert done.keep_until == pytest.approx(link_end(expires) + KEEP_MARGIN_SECONDS, abs=1)
    assert Compactor(flows.redis, flows.keys, flows.orders, tell=flows.tell_holder, delay=0.0).run(now=flows.clock.now() + 1) == 1
    ttl = flows.redis.ttl(flows.keys.flow(started.id))
    assert ttl >= link_end(expires) - flows.clock.now() - 5 > 70 * 86400, "packed, kept past the 30-day retention"
    assert flows.redis.ttl(flows.keys.tokens(done.order_id)) >= ttl - 5, "its notification token as long"
    assert flows.redis.ttl(flows.keys.order(done.order_id)) >= ttl - 5, "and its order lookup"


# -- 3. PENDING at the deadline ------------------------------------------------------------------------


def test_a_page_payment_still_pending_at_the_deadline_is_read_until_it_settles(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    started = flows.start("hpp", hpp_input("pending-hpp-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.pend(PAGE_PAYMENT, final="000")
    assert sim.admin.complete_hpp(waiting.order_id)["operationResult"] == "PENDING"  # an APM, say
    for _ in range(6):  # well past the three extensions that used to end it "no payment"
        record = flows.get(started.id)
        assert record.due is not None
        advance(flows, sim, record.due - flows.clock.now() + 1)
        flows.run_step(started.id, "payment")
        still = flows.get(started.id)
        assert still.state is FlowState.WAITING, f"the payment is PENDING: not over ({still.summary()})"
    (held,) = sim.admin.settle_pending()  # the payment executes; its notification is lost here
    record = flows.get(started.id)
    assert record.due is not None
    advance(flows, sim, record.due - flows.clock.now() + 1)
    flows.run_step(started.id, "payment")
    done = flows.get(started.id)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == held


def test_a_payment_pending_for_longer_than_its_grace_stops_for_a_person(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    started = flows.start("hpp", hpp_input("pending-hpp-2"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.pend(PAGE_PAYMENT, final="000")
    paid = sim.admin.complete_hpp(waiting.order_id)
    for _ in range(80):  # bounded: every read at most 6 hours apart, for at most 7 days
        record = flows.get(started.id)
        if record.state is not FlowState.WAITING:
            break
        assert record.due is not None
        flows.clock.advance(record.due - flows.clock.now() + 1)  # the simulator's clock stays: still PENDING
        flows.run_step(started.id, "payment")
    stopped = flows.get(started.id)
    assert stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    assert stopped.error is not None and stopped.error["type"] == "PaymentPending"
    assert stopped.error["operationId"] == paid["operationId"], "it names what is still open"
    assert stopped.unsettled is not None, "the money is still in flight: a cancel reads first"


def test_an_unknown_link_status_is_never_taken_as_closed() -> None:
    """Gateway answers stay lenient: a status this version does not know keeps the flow reading."""
    from durapay.gateway import PaymentLink
    from tests.workflows.flows.session_engine import context_at

    ctx = context_at(now=1_000_000.0, created=999_000.0)
    link = PaymentLink.model_validate({"linkId": "L1", "status": "SUSPENDED", "expirationDate": "1970-01-05"})
    from durapay.workflows.flows.waits import judge_wait

    outcome = judge_wait(ctx, ("notification",), [], [link], ends=999_500.0)
    assert type(outcome).__name__ == "Wait", outcome
    late = context_at(now=999_500.0 + GRACE_SECONDS + 1, created=999_000.0)
    assert type(judge_wait(late, ("notification",), [], [link], ends=999_500.0)).__name__ == "Attention"


# -- 4. cancel closes what the customer can pay --------------------------------------------------------


def test_cancelling_a_waiting_link_flow_cancels_the_link_first(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, _sim = engine
    started = flows.start("paybylink", link_input("cancel-link-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    answered = flows.cancel(started.id)
    assert answered.state is FlowState.READY and answered.cancel_requested, "a request: the link is closed first"
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.CANCELLED, done.summary()
    assert link_status(flows, link_of(waiting)) == "CANCELLED", "the customer can no longer pay"


def test_a_cancel_that_finds_the_link_paid_ends_succeeded(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("cancel-link-2"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    flows.cancel(started.id)
    paid = sim.admin.complete_link(link_of(waiting))  # the customer was faster than the cancel
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]


def test_cancelling_a_hosted_page_flow_ends_cancelled_and_keeps_listening(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, _sim = engine
    started = flows.start("hpp", hpp_input("cancel-hpp-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    flows.cancel(started.id)
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.CANCELLED, done.summary()
    assert flows.tokens_for_order(waiting.order_id), "a later payment on the page is still verified and found"


def test_durapay_s_own_renewal_moves_the_waiting_flow_s_deadline_at_once(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("renew-own-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    later = (sim.admin.now() + timedelta(days=30)).date().isoformat()
    renewal = flows.start("paybylink_renew", {"linkId": link_of(waiting), "expirationDate": later})
    assert step_until(flows, renewal.id, ENDED).state is FlowState.SUCCEEDED
    moved = step_until(flows, started.id, {FlowState.WAITING}, limit=3)
    flows.run_step(started.id, "payment")  # the link_changed signal resumed it: it reads the link
    moved = flows.get(started.id)
    assert moved.state is FlowState.WAITING
    assert_waits_to(flows, sim, started.id, later, past=link_end(waiting.outputs["create"]["paymentLink"]["expirationDate"]))
    assert moved.keep_until >= link_end(later), "and it is kept as long"


def test_a_modified_link_s_expiry_is_followed(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("modify-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    later = (sim.admin.now() + timedelta(days=12)).date().isoformat()
    change = flows.start("paybylink_modify", {"linkId": link_of(waiting), "expirationDate": later})
    assert step_until(flows, change.id, ENDED).state is FlowState.SUCCEEDED
    flows.run_step(started.id, "payment")
    assert_waits_to(flows, sim, started.id, later, past=link_end(waiting.outputs["create"]["paymentLink"]["expirationDate"]))


def test_a_link_renewed_after_its_flow_ended_keeps_that_flow_until_the_new_expiry(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    flows, sim = engine
    started = flows.start("paybylink", link_input("renew-late-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    sim.admin.complete_link(link_of(waiting), pan="4349940199997007")  # declined: the link is FAILED
    ended = step_until(flows, started.id, ENDED)
    assert ended.state is FlowState.FAILED, ended.summary()
    later = (sim.admin.now() + timedelta(days=85)).date().isoformat()
    renewal = flows.start("paybylink_renew", {"linkId": link_of(waiting), "expirationDate": later})
    assert step_until(flows, renewal.id, ENDED).state is FlowState.SUCCEEDED
    Compactor(flows.redis, flows.keys, flows.orders, tell=flows.tell_holder, delay=0.0).run(
        now=flows.clock.now() + 1
    )  # the dispatcher's pass
    assert flows.redis.ttl(flows.keys.flow(started.id)) > 80 * 86400, "kept while the renewed link can be paid"
    assert flows.redis.ttl(flows.keys.tokens(ended.order_id)) > 80 * 86400, "its notifications still verified"

    paid = sim.admin.complete_link(link_of(waiting))  # the customer pays the renewed link
    (note,) = [n for n in sim.admin.notifications() if n["body"]["operation"]["operationId"] == paid["operationId"]]
    receiver = NotificationReceiver(flows, flows.settings.receiver)
    assert receiver.receive(json.dumps(note["body"]).encode()).status == 200, "verified, not refused (401)"
    late = flows.get(started.id)
    assert late.state is FlowState.NEEDS_ATTENTION and (late.error or {}).get("type") == "LatePayment", late.summary()
    assert late.error is not None and late.error["operation"]["operationId"] == paid["operationId"]


# -- 5. suspected from reading: each confirmed (and fixed) or refuted ---------------------------------


def test_a_form_whose_customer_is_on_an_apm_page_at_the_deadline_is_not_expired(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: ``_form_deadline`` took REDIRECTED_TO_EXTERNAL_DOMAIN for an expired form."""
    flows, sim = engine
    data = build_input("apm-1", version="3")
    data["paymentSession"] = {**data["paymentSession"], "paymentService": "PAYPAL"}
    started = flows.start("build", {**data, "formSeconds": 60})
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    assert waiting.outputs["create"].get("state") == "REDIRECTED_TO_EXTERNAL_DOMAIN"
    advance(flows, sim, 61)
    flows.run_step(started.id, "form")
    still = flows.get(started.id)
    assert still.state is FlowState.WAITING, f"the customer may still pay on the APM page ({still.summary()})"
    sim.admin.fill_build_form(waiting.outputs["create"]["sessionId"])  # pays on the APM page
    assert still.due is not None
    advance(flows, sim, still.due - flows.clock.now() + 1)
    done = step_until(flows, started.id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()


def test_a_decline_on_a_link_the_gateway_keeps_open_does_not_end_the_wait() -> None:
    """Refuted for the simulator (its link is FAILED after a decline: the flow then ends), confirmed as a
    reading of the code: the flow now reads the link instead of taking the decline as the end."""
    from durapay.gateway import Operation, PaymentLink
    from durapay.workflows.flows.waits import judge_wait
    from tests.workflows.flows.session_engine import context_at

    ctx = context_at(now=1_000_000.0, created=999_000.0)
    declined = Operation.model_validate(
        {"operationId": "1", "orderId": "o", "operationType": "AUTHORIZATION", "operationResult": "DECLINED"}
    )
    open_link = PaymentLink.model_validate({"linkId": "L1", "status": "ACTIVE", "expirationDate": "2099-01-01"})
    assert type(judge_wait(ctx, ("notification",), [declined], [open_link], ends=999_500.0)).__name__ == "Wait"
    failed_link = PaymentLink.model_validate({"linkId": "L1", "status": "FAILED", "expirationDate": "2099-01-01"})
    ended = judge_wait(ctx, ("notification",), [declined], [failed_link], ends=999_500.0)
    assert type(ended).__name__ == "Finish" and not ended.succeeded  # type: ignore[union-attr]


def test_a_pending_notification_before_the_wait_began_keeps_the_whole_wait(engine: tuple[Engine, SimulatorServer]) -> None:
    """Refuted: a notification that is not final, consumed at the wait's first run, does not set the
    deadline to now (the wait's own deadline stands)."""
    flows, _sim = engine
    started = flows.start("hpp", hpp_input("early-pending-1"))
    flows.run_step(started.id, "create")
    record = flows.get(started.id)
    pending = {"orderId": record.order_id, "operationId": "9", "operationType": "AUTHORIZATION", "operationResult": "PENDING"}
    flows.signal(started.id, "notification", {"operation": pending}, by="notification")
    flows.run_step(started.id, "payment")
    waiting = flows.get(started.id)
    assert waiting.state is FlowState.WAITING
    assert waiting.due == pytest.approx(flows.clock.now() + 600, abs=2), "its waitSeconds, not now"


def test_after_a_pending_notification_a_form_still_takes_form_completed(engine: tuple[Engine, SimulatorServer]) -> None:
    """Refuted: the wait listens for its own signals again, not only for notifications."""
    flows, _sim = engine
    started = flows.start("build", build_input("build-pending-1", version="3"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    pending = {"orderId": waiting.order_id, "operationId": "9", "operationType": "AUTHORIZATION", "operationResult": "PENDING"}
    assert flows.signal(started.id, "notification", {"operation": pending}, by="notification") == "resumed"
    flows.run_step(started.id, "form")
    again = flows.get(started.id)
    assert again.state is FlowState.WAITING and again.wait is not None
    assert set(again.wait["signals"]) == {"form_completed", "notification"}


def test_a_deadline_read_the_gateway_keeps_refusing_stops_for_a_person_not_failed(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Confirmed: a deadline read refused until ``max_attempts`` ended a waiting flow ``failed`` while its
    link could be paid; now the failure is owed to a read, bounded, then a person looks. (429s hold the
    flow without using its attempts, workflows.engine.gate, up to the outage bound: a short one here, set when
    the engine is made: each terminal's gate reads it then.)"""
    with session_engine(redis_client, key_prefix, gateway_health={"outage_seconds": 10.0}) as (flows, sim):
        _refused_deadline_reads(flows, sim)


def _refused_deadline_reads(flows: Engine, sim: SimulatorServer) -> None:
    started = flows.start("paybylink", link_input("refused-read-1"))
    waiting = step_until(flows, started.id, {FlowState.WAITING})
    assert waiting.due is not None
    advance(flows, sim, waiting.due - flows.clock.now() + 1)
    sim.admin.set_faults(mode="error", status=429, operation="get_order", count=1000)
    stopped = step_until(flows, started.id, ENDED, limit=60)
    assert stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    assert stopped.unsettled is not None, "the link is still money in flight"
    sim.admin.clear_faults()
    flows.retry(started.id)
    read = step_until(flows, started.id, {FlowState.WAITING, *ENDED}, limit=5)
    assert read.state in {FlowState.WAITING, FlowState.FAILED}, read.summary()  # the gateway's word, whichever


# -- a wait never depends on a notification arriving -----------------------------------------------


def test_a_link_whose_notification_never_comes_is_read_at_the_pace_not_at_its_expiry(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """The gateway gives up on a notification after its retries, and a Redis that lost its last second
    of writes can lose one the receiver acknowledged (``durapay chaos --lose-last-writes`` under
    ``everysec``: a paid link's flow waited for its expiry, days). So an open link is read at the pace
    of every wait while the flow waits (here no notification can come: the receiver's address answers
    nothing), and the payment shows at the next read."""
    with session_engine(redis_client, key_prefix, retry={"read_pace_seconds": 20}) as (flows, sim):
        started = flows.start("paybylink", link_input("unnotified-1"))
        waiting = step_until(flows, started.id, {FlowState.WAITING})
        assert waiting.due == pytest.approx(flows.clock.now() + 20, abs=1), "read soon, not at the link's expiry"

        advance(flows, sim, 21)
        flows.run_step(started.id, "payment")
        still = flows.get(started.id)
        assert still.state is FlowState.WAITING, f"open and unpaid: wait on ({still.summary()})"
        assert still.due is not None and flows.clock.now() < still.due <= flows.clock.now() + 21

        paid = sim.admin.complete_link(link_of(waiting))
        advance(flows, sim, still.due - flows.clock.now() + 0.001)
        flows.run_step(started.id, "payment")
        done = flows.get(started.id)
        assert done.state is FlowState.SUCCEEDED, done.summary()
        assert done.outcome is not None and done.outcome["operation"]["operationId"] == paid["operationId"]
        assert done.outputs["payment"].get("readWhileWaiting") is True, done.outputs["payment"]


def test_the_reads_of_an_open_link_space_out_and_stop_at_its_expiry(redis_client: redis.Redis, key_prefix: str) -> None:
    """Every tenth of the flow's age (at least the read pace), never past the link's end: reads that grow
    with the logarithm of the link's life, then the deadline's read ends the flow."""
    with session_engine(redis_client, key_prefix, retry={"read_pace_seconds": 60}) as (flows, sim):
        started = flows.start("paybylink", link_input("unnotified-2"))
        waiting = step_until(flows, started.id, {FlowState.WAITING})
        end = link_end(waiting.outputs["create"]["paymentLink"]["expirationDate"])
        reads, gaps = 0, []
        record = waiting
        while record.state is FlowState.WAITING and reads < 200:
            assert record.due is not None and record.due <= end + 1, "never past the link's end"
            gaps.append(record.due - flows.clock.now())
            advance(flows, sim, record.due - flows.clock.now() + 0.001)
            flows.run_step(started.id, "payment")
            record = flows.get(started.id)
            reads += 1
        assert record.state is FlowState.FAILED and record.error is not None, record.summary()
        assert record.error["type"] == "Expired", record.error
        # Each gap a tenth of the flow's age then, at least the pace: 10 reads to an age of 600 s, then
        # one per 10% of growth, ln(3 days / 600 s) / ln(1.1) = 64 more.
        assert min(gaps) >= 60 - 1 and max(gaps) <= (end - waiting.created) / 10 + 1, gaps
        assert reads <= 10 + math.ceil(math.log((end - waiting.created) / 600) / math.log(1.1)) + 2, reads
