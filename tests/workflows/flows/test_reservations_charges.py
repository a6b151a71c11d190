"""Reservation charges (no-show, incremental, delayed) checked against the reservation before anything is
sent, and read back after a lost answer (issue 23, items 10, 12 and 14).

The real flows run step by step on a manual clock against the simulator over HTTP (``session_engine``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine, StartConflict
from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.session_engine import engine, step_until

__all__ = ["engine"]

ENDED = {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION}
TYPES = {"no_show": "NOSHOW", "incremental": "INCREMENTAL", "delay_charge": "DELAY_CHARGE"}
APPROVE = "4349940199004549"


def paid_reservation(flows: Engine, sim: SimulatorServer, reservation_id: str, amount: int, **extra: Any) -> str:
    """A reservation whose guest paid its deposit (all of ``amount``) on its link, outside any flow: the id of
    that original operation."""
    client = flows.gateway()
    reservation = {
        "reservationId": reservation_id,
        "amount": str(amount),
        "currency": "EUR",
        "deposit": str(amount),
        "reservationType": "PREPAID_REFUNDABLE",
        **extra,
    }
    client.call(Catalogue.create_reservation, request={"reservation": reservation})
    link = client.call(Catalogue.create_reservation_paybylink, reservation_id, request={})
    return sim.admin.complete_link(link.paymentLink.linkId)["operationId"]


def charged(sim: SimulatorServer, kind: str) -> list[dict[str, Any]]:
    return sim.admin.operations(operation_type=TYPES[kind])


def forget_keys(sim: SimulatorServer) -> None:
    """The gateway forgets the Idempotency-Keys it has seen: the public material does not say how long it
    keeps them, and durapay takes it that it may not (``tasks.runner``)."""
    state = sim.simulator.state
    with state.lock:
        state.idempotency.clear()


# -- item 12: a charge checks one reservation and charges another -----------------------------------


@pytest.mark.parametrize("kind", ["no_show", "incremental", "delay_charge"])
def test_a_charge_naming_another_guest_s_operation_is_refused_before_anything_is_sent(
    engine: tuple[Engine, SimulatorServer], kind: str
) -> None:
    flows, sim = engine
    paid_reservation(flows, sim, "res-small", 3000)
    other_guest = paid_reservation(flows, sim, "res-large", 15000)
    data = {"reservationId": "res-small", "originalOperationId": other_guest, "amount": 3000, "currency": "EUR"}
    done = step_until(flows, flows.start(kind, data).id, ENDED)
    assert done.state is FlowState.FAILED, done.summary()
    assert done.error is not None and done.error["field"] == "originalOperationId", done.error
    assert other_guest in done.error["reason"] and "res-small" in done.error["reason"]
    assert charged(sim, kind) == [], "nothing charged on the other guest's card"


def test_a_charge_naming_a_card_sale_is_refused(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    paid_reservation(flows, sim, "res-sale", 3000)
    order = {"orderId": "shop-sale-1", "amount": "15000", "currency": "EUR"}
    card = {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"}
    sale = flows.gateway().call(Catalogue.create_moto_order, request={"order": order, "card": card}).operation.operationId
    data = {"reservationId": "res-sale", "originalOperationId": sale, "amount": 3000, "currency": "EUR"}
    done = step_until(flows, flows.start("no_show", data).id, ENDED)
    assert done.state is FlowState.FAILED and done.error is not None and done.error["field"] == "originalOperationId"
    assert charged(sim, "no_show") == []


def test_a_charge_naming_the_reservation_s_own_operation_goes_on(engine: tuple[Engine, SimulatorServer]) -> None:
    flows, sim = engine
    original = paid_reservation(flows, sim, "res-own", 3000)
    data = {"reservationId": "res-own", "originalOperationId": original, "amount": 1000, "currency": "EUR"}
    done = step_until(flows, flows.start("incremental", data).id, ENDED)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert [op["orderId"] for op in charged(sim, "incremental")] == ["res-own"]


# -- item 14: once per reservation, bounded in total, after the stay --------------------------------


def test_a_second_no_show_of_a_reservation_is_refused(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: two no_show starts without a key charged the guest twice."""
    flows, sim = engine
    paid_reservation(flows, sim, "res-twice", 20000)
    data = {"reservationId": "res-twice", "amount": 5000, "currency": "EUR"}
    first = step_until(flows, flows.start("no_show", data).id, ENDED)
    assert first.state is FlowState.SUCCEEDED, first.summary()
    # Keyed by the reservation when the merchant gives no key: the same start is the first flow, another a conflict.
    assert flows.start("no_show", data).id == first.id
    with pytest.raises(StartConflict, match="no_show:res-twice"):
        flows.start("no_show", {**data, "amount": 4000})
    # Under a key of the merchant's own, the reservation's read refuses it before anything is sent.
    second = step_until(flows, flows.start("no_show", data, "merchant-key-2").id, ENDED)
    assert second.state is FlowState.FAILED, second.summary()
    assert second.error is not None and second.error["field"] == "reservationId", second.error
    assert first.outcome is not None and first.outcome["operation"]["operationId"] in second.error["reason"]
    assert len(charged(sim, "no_show")) == 1


def test_the_charges_of_a_reservation_stay_within_its_amount(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: each charge was checked alone (at most the reservation's amount), never their total."""
    flows, sim = engine
    paid_reservation(flows, sim, "res-total", 20000)
    data = {"reservationId": "res-total", "amount": 15000, "currency": "EUR"}
    assert step_until(flows, flows.start("incremental", data).id, ENDED).state is FlowState.SUCCEEDED
    over = step_until(flows, flows.start("incremental", data).id, ENDED)
    assert over.state is FlowState.FAILED, over.summary()
    assert over.error is not None and over.error["field"] == "amount" and "20000" in over.error["reason"], over.error
    within = step_until(flows, flows.start("delay_charge", {**data, "amount": 5000}).id, ENDED)
    assert within.state is FlowState.SUCCEEDED, within.summary()
    assert sum(op["amount"] for op in charged(sim, "incremental") + charged(sim, "delay_charge")) == 20000


def test_a_delayed_charge_whose_run_at_is_past_is_refused(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: a runAt already past charged at once."""
    flows, sim = engine
    paid_reservation(flows, sim, "res-past", 20000)
    run_at = datetime.fromtimestamp(flows.clock.now() - 86400, UTC).isoformat()
    data = {"reservationId": "res-past", "amount": 800, "currency": "EUR", "runAt": run_at}
    done = step_until(flows, flows.start("delay_charge", data).id, ENDED)
    assert done.state is FlowState.FAILED, done.summary()
    assert done.error is not None and done.error["field"] == "runAt", done.error
    assert charged(sim, "delay_charge") == []


def test_a_delayed_charge_before_check_out_is_refused(engine: tuple[Engine, SimulatorServer]) -> None:
    """Confirmed: nothing compared runAt with the reservation's checkOutDate."""
    flows, sim = engine
    now = flows.clock.now()
    check_out = datetime.fromtimestamp(now, UTC).date() + timedelta(days=5)
    paid_reservation(flows, sim, "res-stay", 20000, checkOutDate=check_out.isoformat())
    early = datetime.fromtimestamp(now + 2 * 86400, UTC).isoformat()
    data = {"reservationId": "res-stay", "amount": 800, "currency": "EUR", "runAt": early}
    done = step_until(flows, flows.start("delay_charge", data).id, ENDED)
    assert done.state is FlowState.FAILED, done.summary()
    assert done.error is not None and done.error["field"] == "runAt" and check_out.isoformat() in done.error["reason"]
    after = datetime.fromtimestamp(now + 6 * 86400, UTC).isoformat()
    sleeping = step_until(flows, flows.start("delay_charge", {**data, "runAt": after}).id, {FlowState.SLEEPING})
    assert sleeping.step == "timer"
    assert charged(sim, "delay_charge") == []


@pytest.mark.parametrize(
    ("day", "clock", "hours", "charges"),
    [
        (0, "00:30", 2, True),  # the check-out day at 00:30 +02:00: the day before in UTC
        (0, "20:00", -5, True),  # the check-out day's evening in UTC-5: the day after in UTC
        (-1, "21:00", -5, False),  # the evening before it in UTC-5: the check-out day in UTC
    ],
)
def test_a_delayed_charge_accepted_when_it_starts_is_judged_at_the_same_moment_when_it_charges(
    engine: tuple[Engine, SimulatorServer], day: int, clock: str, hours: int, charges: bool
) -> None:
    """Invariant 7: the check holds when the money moves, judged by one rule at both moments (docs/flows.md:
    the day in runAt's own offset). The start read runAt in its offset and the charge step the UTC date of
    its moment: a charge at 00:30 +02:00 on the check-out day was accepted at the start and refused, at that
    very moment, when it charged (the day before, in UTC), nothing having changed."""
    flows, sim = engine
    check_out = (datetime.fromtimestamp(flows.clock.now(), UTC) + timedelta(days=3)).date()
    reservation_id = f"res-day{day}{hours}"
    paid_reservation(flows, sim, reservation_id, 20000, checkOutDate=check_out.isoformat())
    on = check_out + timedelta(days=day)
    hour, minute = (int(part) for part in clock.split(":"))
    run_at = datetime(on.year, on.month, on.day, hour, minute, tzinfo=timezone(timedelta(hours=hours)))
    data = {"reservationId": reservation_id, "amount": 5000, "currency": "EUR", "runAt": run_at.isoformat()}
    done = step_until(flows, flows.start("delay_charge", data).id, ENDED)
    if charges:
        assert done.state is FlowState.SUCCEEDED, (done.error, done.summary())
        assert flows.clock.now() >= run_at.timestamp()
        assert [op["orderId"] for op in charged(sim, "delay_charge")] == [reservation_id]
    else:
        assert done.state is FlowState.FAILED and done.step == "original", done.summary()
        assert done.error is not None and done.error["field"] == "runAt", done.error
        assert charged(sim, "delay_charge") == []


# -- item 10: a lost answer is read back, not only replayed -----------------------------------------


def lost_no_show(flows: Engine, sim: SimulatorServer, reservation_id: str) -> str:
    """A no-show whose charge the gateway made but whose answer was lost (a 500), and a gateway that has
    since forgotten the charge's Idempotency-Key."""
    paid_reservation(flows, sim, reservation_id, 20000)
    sim.admin.set_faults(mode="commit_then_fail", operation="create_no_show", count=1)
    started = flows.start("no_show", {"reservationId": reservation_id, "amount": 5000, "currency": "EUR"})
    retrying = step_until(flows, started.id, {FlowState.RETRYING})
    assert retrying.step == "charge" and len(charged(sim, "no_show")) == 1, retrying.summary()
    forget_keys(sim)
    return started.id


def test_a_cancel_after_a_lost_charge_answer_reads_the_reservation_instead_of_charging_again(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    """Confirmed: the cancel's read of a keyed charge was a resend with the key, a second charge once the
    gateway no longer knew the key."""
    flows, sim = engine
    flow_id = lost_no_show(flows, sim, "res-cancel")
    flows.cancel(flow_id)
    done = step_until(flows, flow_id, ENDED)
    (made,) = charged(sim, "no_show")
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == made["operationId"]


def test_a_retry_after_a_lost_charge_answer_reads_the_reservation_before_charging_again(
    engine: tuple[Engine, SimulatorServer],
) -> None:
    """Confirmed: after a lost answer the charge was sent again on the gateway's replay of the key alone
    (the catalogue counts keyed operations as safe to resend, so the runner never reads back first).
    Passes once keyed money calls are read back first (report: gateway/_catalogue.py)."""
    flows, sim = engine
    flow_id = lost_no_show(flows, sim, "res-retry")
    done = step_until(flows, flow_id, ENDED)
    (made,) = charged(sim, "no_show")
    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert done.outcome is not None and done.outcome["operation"]["operationId"] == made["operationId"]
