"""The order index: every order a flow made routes to it, and all of them expire with the flow."""

from __future__ import annotations

from typing import Any

from durapay.gateway import Card, GatewayModel
from durapay.tasks.outcomes import Advance, Finish, NewOrder
from durapay.workflows.clock import ManualClock
from durapay.workflows.compact import Compactor
from durapay.workflows.steps import FlowDefinition
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
    Compactor(engine.redis, engine.keys, engine.orders).run(now=clock.now() + 5)  # the dispatcher's pass
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
    from durapay.workflows.orders import MAX_DERIVED

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
    comes back."""
    pay = ScriptedStep("pay", outcomes=[Advance(PAID), Advance(PAID)])
    then = ScriptedStep("then", outcomes=[Finish(False, "declined"), Advance({})])
    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (pay, then), summary))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "pay") == "ready"
    assert lifetimes(engine, record.id, "op-31") == (-1, -1), "alive: the lookup never expires before the flow"
    assert engine.store.flow_for_operation("op-31") == record.id
    assert engine.run_step(record.id, "then") == "failed"
    assert Compactor(engine.redis, engine.keys, engine.orders).run(now=clock.now() + 5) == 1
    kept, lookup = lifetimes(engine, record.id, "op-31")
    assert 0 < kept <= engine.store.retention_seconds and kept - 2 <= lookup <= kept, "expires with the record"
    engine.retry(record.id)  # back from failed: its first generation's output is cleared, not its lookup
    assert "pay" not in engine.get(record.id).outputs
    assert lifetimes(engine, record.id, "op-31") == (-1, -1)
    assert engine.store.flow_for_operation("op-31") == record.id
