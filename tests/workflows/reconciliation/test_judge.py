"""What the judge holds between pages is bounded: past ``MAX_PENDING`` flows held for their check, the
newest-ended are checked at once by id (their findings as they would be later), and it never holds more.
A flow checked by id before the pages reach its payment is reported once, as the whole window would."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from durapay.workflows.reconciliation import judge as judge_module
from durapay.workflows.reconciliation.findings import FLOW_WITHOUT_MONEY, Finding, Lookups, Owners
from durapay.workflows.reconciliation.judge import HORIZON_SECONDS, Judge


def succeeded(flow_id: str, operation_id: str) -> FlowRecord:
    operation = {"operationId": operation_id, "operationAmount": "100", "operationCurrency": "EUR", "operationResult": "EXECUTED"}
    return FlowRecord(
        id=flow_id,
        kind="moto",
        state=FlowState.SUCCEEDED,
        step="pay",
        version=3,
        attempt=0,
        created=0.0,
        updated=0.0,
        input={},
        outcome={"result": "succeeded", "operation": operation, "operationIds": [operation_id]},
    )


def test_the_flows_held_for_their_check_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge_module, "MAX_PENDING", 3)
    records = {f"f{n}": succeeded(f"f{n}", f"o{n}") for n in range(6)}
    gateway = {f"o{n}": {**(records[f"f{n}"].outcome or {})["operation"], "operationType": "CAPTURE"} for n in range(5)}
    fetched: list[str] = []

    def operation(operation_id: str) -> dict[str, Any] | None:
        fetched.append(operation_id)
        return gateway.get(operation_id)

    def nothing(*_: Any) -> Any:
        raise AssertionError("not asked for")

    judge = Judge(Lookups(operation, nothing, nothing, lambda ids: [records[flow_id] for flow_id in ids]))
    found = []
    for n in range(6):  # six flows ended, none met yet: the newest-ended beyond three are checked at once
        found += judge.ended(f"f{n}", float(n))
        assert len(judge.waiting) + len(judge.pending) <= 3
    assert fetched == ["o3", "o4", "o5"] and len(judge.waiting) == 3
    assert [(f.category, f.flow, f.named) for f in found] == [(FLOW_WITHOUT_MONEY, "f5", "o5")]  # the gateway lacks o5
    assert judge.resolve() == [] and sorted(fetched) == [f"o{n}" for n in range(6)] and not judge.waiting


END = 1_800_000_000.0
HELD = {  # the payment the gateway holds instead of the one the flow names, two hours before the flow's end
    "operationId": "op-held",
    "orderId": "ord-a",
    "operationType": "AUTHORIZATION",
    "operationResult": "EXECUTED",
    "operationAmount": "100",
    "operationCurrency": "EUR",
    "operationTime": "2027-01-15T06:00:00Z",
}


def test_a_flow_checked_before_the_pages_reach_its_payment_is_reported_once() -> None:
    """Review of issue 25: a flow whose end came more than HORIZON_SECONDS after its payment was checked by
    id first (named operation missing, no payment "instead" met yet) and forgotten; the older page that
    showed its payment judged it again ("holds ... instead"): one mismatch, two findings, two events. The
    early check now reads the flow's orders for the payment held instead, and the flow once checked is
    not judged again (``Judge.judged``); its finding's key leaves out the operation held instead."""
    record = succeeded("f1", "op-missing")
    record.orders = ["ord-a"]
    orders_read: list[str] = []

    def order(order_id: str) -> list[dict[str, Any]]:
        orders_read.append(order_id)
        return [HELD] if order_id == "ord-a" else []

    judge = Judge(Lookups(lambda _id: None, order, lambda: {}, lambda ids: [record for i in ids if i == "f1"]))
    found = judge.ended("f1", END)
    found += judge.page({}, Owners(), END - 100)  # a page of other money
    found += judge.resolve(END - HORIZON_SECONDS - 100)  # past the horizon: checked by id
    assert orders_read == ["ord-a"]
    found += judge.page({"op-held": HELD}, Owners(by_order={"ord-a": "f1"}, records={"f1": record}), END - 7200)
    found += judge.resolve()
    mine = [(f.category, (f.operation or {}).get("operationId"), f.named) for f in found if f.flow == "f1"]
    assert mine == [(FLOW_WITHOUT_MONEY, "op-held", "op-missing")], mine
    assert "holds AUTHORIZATION op-held" in found[0].what


def test_a_flow_without_its_money_is_one_mismatch_whatever_is_held_instead() -> None:
    """One event and one mark per flow and named operation: found once without, once with the payment
    held instead (two runs that read different parts), it is the same mismatch."""
    missing = Finding(FLOW_WITHOUT_MONEY, "names op-missing", flow="f1", named="op-missing")
    instead = Finding(FLOW_WITHOUT_MONEY, "names op-missing; holds op-held", flow="f1", operation=HELD, named="op-missing")
    assert missing.key == instead.key


def test_the_planted_wrong_operation_is_reported_once_when_its_flow_ended_late(redis_client: Any, key_prefix: str) -> None:
    """Issue 25's plant 'a flow record edited to name a wrong operation', on a flow that ended more than
    an hour after its payment (a notification lost, the payment read back at the wait's deadline), among
    newer operations: one finding naming the payment held instead, as before the run streamed."""
    import json

    from durapay.config.settings import ReconcileSettings
    from durapay.workflows.reconciliation import Reconciler
    from tests.workflows.flows.session_engine import session_engine
    from tests.workflows.reconciliation.test_post_operations import run
    from tests.workflows.reconciliation.test_run import catch_up, moto_input, pay_directly

    with session_engine(redis_client, key_prefix) as (engine, sim):
        since = engine.clock.now() - 60
        flow = run(engine, "moto", moto_input("late-end"))
        paid = flow.outcome["operation"]["operationId"]  # type: ignore[index]
        outcome = json.loads(json.dumps(flow.outcome).replace(paid, "899999999999999999"))
        redis_client.hset(engine.keys.flow(flow.id), "outcome", json.dumps(outcome))
        sim.admin.advance_clock(1800)
        for name in ("newer-a", "newer-b"):  # other money, half an hour later
            pay_directly(engine, name)
            sim.admin.advance_clock(1)
        sim.admin.advance_clock(7200)
        until = catch_up(engine, sim)
        partition = engine.keys.partition(flow.id)
        redis_client.zadd(engine.keys.by_state(partition, "succeeded"), {flow.id: until - 10})  # it ended now
        report = Reconciler(engine, ReconcileSettings(max_records=2)).run(since, until)
        mine = [(f.category, (f.operation or {}).get("operationId"), f.named) for f in report.findings if f.flow == flow.id]
        assert mine == [(FLOW_WITHOUT_MONEY, paid, "899999999999999999")], mine
