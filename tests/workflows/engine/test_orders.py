"""The order index: every order a flow made routes to it, and all of them expire with the flow."""

from __future__ import annotations

import time
from typing import Any

import pytest

from durapay.gateway import Card, GatewayModel
from durapay.tasks.outcomes import Advance, Finish, NewOrder
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.compact import Compactor
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary


class CardInput(GatewayModel):
    orderId: str
    card: Card


def test_every_order_of_a_flow_expires_with_it_even_once_its_card_is_erased(make_engine: Any, clock: ManualClock) -> None:
    """The flow moved to ``<orderId>-2``, then ended: its card data is erased (the input no longer
    validates), and the lookups of both orders must still get the record's retention."""
    pay = ScriptedStep("pay", outcomes=[NewOrder("the answer was lost"), Advance({})])
    definition = FlowDefinition("demo", CardInput, (pay,), summary, order_id=lambda data: data.orderId)
    engine, _ = make_engine(definition)
    record = engine.start("demo", {"orderId": "ord-9", "card": {"pan": "4349940199004549", "expiryDate": "1230"}})
    assert engine.run_step(record.id, "pay") == "ready"
    assert engine.run_step(record.id, "pay") == "succeeded"
    done = engine.get(record.id)
    assert done.orders == ["ord-9", "ord-9-2"]
    assert "expiryDate" not in done.input["card"], "card data erased at the end"
    Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder).run(now=clock.now() + 5)  # the dispatcher's pass
    for order_id in done.orders:
        assert engine.flow_for_order(order_id) == record.id
        assert 0 < engine.redis.ttl(engine.keys.order(order_id)) <= engine.store.retention_seconds


def test_a_start_retried_after_a_crash_before_its_order_lookup_writes_it(make_engine: Any) -> None:
    """On a cluster the API writes the flow, then the order lookup (a separate write: the lookup lives
    in the order id's slot), and may die between the two. The merchant, never answered, retries the
    start with its key: the flow exists already, and its order lookup is written now, so the gateway's
    notifications find it. (On a single server one script writes both; the crash is the lookup taken
    away after it.)"""
    definition = FlowDefinition("demo", CardInput, (ScriptedStep("pay"),), summary, order_id=lambda data: data.orderId)
    engine, _ = make_engine(definition)
    data = {"orderId": "ord-crash", "card": {"pan": "4349940199004549", "expiryDate": "1230"}}
    now = engine.clock.now()
    written, created = engine.store.create(engine._new_flow("demo", data, "key-1", None, now), now=now)
    assert created.flow and created.order and engine.flow_for_order("ord-crash") == written.id
    engine.redis.delete(engine.keys.order("ord-crash"))  # the crash: no lookup
    again = engine.start("demo", data, "key-1")
    assert again.id == written.id
    assert engine.flow_for_order("ord-crash") == written.id


def test_a_merchant_order_id_over_the_gateways_limit_is_refused_before_anything_is_written(make_engine: Any) -> None:
    """Issue 23, item 5: the gateway's orderId limit is a setting (default 18, what the two client libraries
    written for the live gateway say); a longer merchant order id is an input error naming the field."""
    import pytest

    from durapay.workflows.engine import InputError

    definition = FlowDefinition("demo", CardInput, (ScriptedStep("pay"),), summary, order_id=lambda data: data.orderId)
    engine, sent = make_engine(definition)
    card = {"pan": "4349940199004549", "expiryDate": "1230"}
    assert engine.orders.max_length == 18
    with pytest.raises(InputError) as refused:
        engine.start("demo", {"orderId": "o" * 19, "card": card})
    assert refused.value.field == "order.orderId" and "at most 18 characters" in refused.value.reason
    assert sent.chains == [] and engine.list() == [], "nothing written, nothing sent"
    assert engine.start("demo", {"orderId": "o" * 18, "card": card}).order_id == "o" * 18


def test_every_derived_order_id_fits_the_limit_and_is_one_flows(make_engine: Any) -> None:
    """A derived id (``-2``, ``-3`` ... ``-21``) is cut to the limit, and two merchant ids that differ only in
    their last characters never share one (``OrderIndex.take``)."""
    from durapay.workflows.engine.orders import MAX_DERIVED

    definition = FlowDefinition("demo", CardInput, (ScriptedStep("pay"),), summary, order_id=lambda data: data.orderId)
    engine, _ = make_engine(definition, gateway={"order_id_max_length": 18})
    taken = {}
    for flow_id, base in (("fa", "a" * 17 + "1"), ("fb", "a" * 17 + "2")):
        for seq in range(1, MAX_DERIVED):
            _, order_id = engine.orders.take(base, seq, flow_id)
            assert len(order_id) <= 18, order_id
            assert taken.setdefault(order_id, flow_id) == flow_id, f"{order_id} held by two flows"


PAID = {"operation": {"operationId": "op-31", "orderId": "ord-31", "operationResult": "EXECUTED", "operationAmount": "5"}}


def lifetimes(engine: Any, flow_id: str, operation_id: str) -> tuple[int, int]:
    """(the record's TTL, the operation lookup's TTL) in seconds; -1 is no expiry."""
    partition = engine.keys.partition(flow_id)
    return engine.redis.ttl(engine.keys.flow(flow_id)), engine.redis.ttl(engine.keys.operation(partition, operation_id))


def test_an_operation_lookup_lives_as_long_as_its_flow(make_engine: Any, clock: ManualClock) -> None:
    """Issue 29, item 4: the operation id a step recorded finds its flow for as long as the flow lives.
    It used to be given the finished flows' retention at the transition that recorded it, so a flow that
    then lived longer (waiting on a long link, stopped for a person) lost it while still alive. Now it
    has no expiry while the record has none, gets the record's once the flow has finished and is packed,
    keeps it over a retry (which clears the step's output that named it) and is kept again when the flow
    comes back. (The operation is a decline: a flow whose money moved never ends failed, transition.lua.)"""
    declined = {"operation": {**PAID["operation"], "operationResult": "DECLINED"}}
    pay = ScriptedStep("pay", outcomes=[Advance(declined), Advance(declined)])
    then = ScriptedStep("then", outcomes=[Finish(False, "declined"), Advance({})])
    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (pay, then), summary))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "pay") == "ready"
    assert lifetimes(engine, record.id, "op-31") == (-1, -1), "alive: the lookup never expires before the flow"
    assert engine.store.flow_for_operation("op-31") == record.id
    assert engine.run_step(record.id, "then") == "failed"
    assert Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder).run(now=clock.now() + 5) == 1
    kept, lookup = lifetimes(engine, record.id, "op-31")
    assert 0 < kept <= engine.store.retention_seconds and kept - 2 <= lookup <= kept, "expires with the record"
    engine.retry(record.id)  # back from failed: its first generation's output is cleared, not its lookup
    assert "pay" not in engine.get(record.id).outputs
    assert lifetimes(engine, record.id, "op-31") == (-1, -1)
    assert engine.store.flow_for_operation("op-31") == record.id


# -- issue 29 review: a live flow's lookups never expire; a gone flow's always do -----------------------


class OrderOnly(GatewayModel):
    orderId: str


def failed_flow(make_engine: Any, order_id: str, operation_id: str) -> tuple[Any, Any]:
    paid = {"operation": {"operationId": operation_id, "orderId": order_id, "operationResult": "DECLINED"}}
    pay = ScriptedStep("pay", outcomes=[Advance(paid), Advance({})])
    then = ScriptedStep("then", outcomes=[Finish(False, "declined"), Advance({})])
    engine, _ = make_engine(FlowDefinition("demo", OrderOnly, (pay, then), summary, order_id=lambda data: data.orderId))
    record = engine.start("demo", {"orderId": order_id})
    assert engine.run_step(record.id, "pay") == "ready"
    assert engine.run_step(record.id, "then") == "failed"
    return engine, record


def ttls(engine: Any, flow_id: str, order_id: str, operation_id: str) -> dict[str, int]:
    k = engine.keys
    return {
        "record": engine.redis.ttl(k.flow(flow_id)),
        "order": engine.redis.ttl(k.order(order_id)),
        "tokens": engine.redis.ttl(k.tokens(order_id)),
        "op": engine.redis.ttl(k.operation(k.partition(flow_id), operation_id)),
    }


def test_a_late_payment_whose_lookups_a_crash_left_expiring_gets_them_kept_by_the_next_pass(
    make_engine: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A late payment brings a packed failed flow back (needs_attention, record persisted by signal.lua);
    its lookups, in other slots, are kept by a second round trip, and a crash between the two left a
    live flow whose lookups expired (its later notifications: unknown order). A flow that leaves a
    packed end is unpacked first, which lists it for the dispatcher's pass again: the pass keeps the
    lookups of every listed flow it finds going."""
    engine, record = failed_flow(make_engine, "ord-c1", "op-c1")
    engine.redis.sadd(engine.keys.tokens("ord-c1"), "tok-1")
    assert Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder).run(now=clock.now() + 5) == 1
    assert all(ttl > 0 for ttl in ttls(engine, record.id, "ord-c1", "op-c1").values())

    def crash(*args: Any, **kwargs: Any) -> None:
        raise SystemExit("receiver killed")

    monkeypatch.setattr(engine.orders, "keep", crash)
    late = {"operation": {"operationId": "op-late", "orderId": "ord-c1", "operationResult": "EXECUTED", "operationAmount": "5"}}
    with pytest.raises(SystemExit):
        engine.signal(record.id, "notification", late, by="notification")
    monkeypatch.undo()
    assert engine.get(record.id).state is FlowState.NEEDS_ATTENTION
    clock.advance(5)
    Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder).run(
        now=clock.now() + 5
    )  # the dispatcher's next pass
    assert ttls(engine, record.id, "ord-c1", "op-c1") == {"record": -1, "order": -1, "tokens": -1, "op": -1}


def test_a_renewed_link_keeps_the_lookups_of_a_finished_flow_past_its_packing_pass(make_engine: Any, clock: ManualClock) -> None:
    """Another flow renews the link of an order a finished flow (not yet packed) made: the finished flow
    is kept until the renewed link's end, lookups with it. The pass that packed it then gave the lookups
    the plain retention (the record never said how long to keep it), so a payment on the renewed link
    after the retention found no flow. The record keeps ``keep_until``, the pass gives record and lookups
    that end, and an end is never shortened."""
    engine, record = failed_flow(make_engine, "ord-t1", "op-t1")
    ends = clock.now() + 200 * 86400
    expiry = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ends))
    engine.tell_holder("link_changed", {"orderId": "ord-t1", "paymentLink": {"expirationDate": expiry}})
    assert engine.get(record.id).keep_until >= ends
    assert Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder).run(now=clock.now() + 5) == 1
    after = ttls(engine, record.id, "ord-t1", "op-t1")
    assert after["record"] > 199 * 86400, after
    assert after["order"] >= after["record"] - 5 and after["op"] >= after["record"] - 5, after
    engine.orders.expire(engine.get(record.id).lookups, 60)  # a shorter end asked later
    assert engine.redis.ttl(engine.keys.order("ord-t1")) > 199 * 86400, "never shortened"


def test_a_finished_flow_is_kept_until_the_packing_pass_gave_its_lookups_their_end(make_engine: Any, clock: ManualClock) -> None:
    """With no scheduler for longer than the retention, a finished record expired before its packing
    pass, which then had nothing to read the lookups from: they stayed for ever. A finished record gets
    its end from the pass, with its lookups: until then it stays, and a pass that comes late gives
    record and lookups the retention from then, by Redis's clock (a process's clock, moved months ahead
    by the demo, has no say)."""
    engine, record = failed_flow(make_engine, "ord-x1", "op-x1")
    assert ttls(engine, record.id, "ord-x1", "op-x1") == {"record": -1, "order": -1, "tokens": -2, "op": -1}
    late = clock.now() + engine.store.retention_seconds + 3600
    assert Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder).run(now=late) == 1
    got = ttls(engine, record.id, "ord-x1", "op-x1")
    retention = engine.store.retention_seconds
    assert retention - 5 <= got["record"] <= retention and got["order"] == got["op"] == got["record"], got
