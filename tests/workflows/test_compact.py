"""Packing finished flows: less memory, the same record, history and guarantees when read or changed again."""

from __future__ import annotations

from typing import Any

from tasks.outcomes import Advance
from tests.workflows.engine_support import DemoInput, ScriptedStep, flow, wait_step
from workflows.clock import ManualClock
from workflows.compact import DICTIONARY_VERSION, Compactor, pack, unpack
from workflows.flows._common import summarize
from workflows.states import FlowState
from workflows.steps import FlowDefinition

PAID = {"operation": {"operationId": "op-9", "orderId": "ord-1", "operationResult": "AUTHORIZED", "operationAmount": "500"}}


def compactor(engine: Any) -> Compactor:
    return Compactor(engine.redis, engine.keys, engine.orders, delay=0.0)


def test_a_finished_flow_reads_the_same_once_packed_and_takes_less_memory(make_engine: Any, clock: ManualClock) -> None:
    engine, _ = make_engine(flow(ScriptedStep("first"), ScriptedStep("second")))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "first")
    engine.run_step(record.id, "second")
    before, history = engine.get(record.id), engine.history(record.id)
    size = int(engine.redis.memory_usage(engine.keys.flow(record.id))) + int(
        engine.redis.memory_usage(engine.keys.log(record.id))
    )
    ttl = engine.redis.ttl(engine.keys.flow(record.id))
    assert compactor(engine).run(now=clock.now()) == 1
    after = engine.get(record.id)
    assert after.summary() == before.summary() and engine.history(record.id) == history
    assert engine.redis.exists(engine.keys.log(record.id)) == 0
    assert int(engine.redis.memory_usage(engine.keys.flow(record.id))) < size
    assert 0 < engine.redis.ttl(engine.keys.flow(record.id)) <= ttl
    assert compactor(engine).run(now=clock.now()) == 0, "packed once"


def test_a_packed_record_is_a_compact_listpack_even_when_it_was_not(make_engine: Any, clock: ManualClock) -> None:
    """A long field (here a step's output) makes Redis keep a hash as a hashtable, and removing fields
    never turns it back: packing writes the record anew, so that it is a listpack again."""
    long_output = Advance({"step": "first", "detail": "x" * 200})
    engine, _ = make_engine(flow(ScriptedStep("first", outcomes=[long_output]), ScriptedStep("second")))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "first")
    engine.run_step(record.id, "second")
    key = engine.keys.flow(record.id)
    assert engine.redis.object("encoding", key) == b"hashtable"
    ttl = engine.redis.ttl(key)
    assert compactor(engine).run(now=clock.now()) == 1
    assert engine.redis.object("encoding", key) == b"listpack"
    assert 0 < engine.redis.ttl(key) <= ttl
    assert engine.get(record.id).outputs["first"]["detail"] == "x" * 200


def test_a_packed_flow_still_accounts_for_money_and_can_be_retried(make_engine: Any, clock: ManualClock) -> None:
    """A payment reported after the flow failed and was packed: needs a person; the operator's retry
    unpacks it and the step takes the payment."""
    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (wait_step(),), summarize))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "customer")
    clock.advance(101)
    assert engine.run_step(record.id, "customer") == "failed"
    assert compactor(engine).run(now=clock.now()) == 1
    assert engine.signal(record.id, "paid", PAID) == "late_payment"
    late = engine.get(record.id)
    assert late.state is FlowState.NEEDS_ATTENTION and late.error is not None and late.error["type"] == "LatePayment"
    engine.retry(record.id)
    assert engine.get(record.id).fields.get("z") is None, "unpacked before it changed"
    assert engine.run_step(record.id, "customer") == "succeeded"
    kinds = [entry["to"] for entry in engine.history(record.id)]
    assert kinds[:3] == ["ready", "running", "waiting"] and kinds[-1] == "succeeded"


def test_a_packed_succeeded_flow_still_tells_its_own_payment_from_a_second_one(make_engine: Any, clock: ManualClock) -> None:
    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (wait_step(),), summarize))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "customer")
    engine.signal(record.id, "paid", PAID)
    assert engine.run_step(record.id, "customer") == "succeeded"
    assert compactor(engine).run(now=clock.now()) == 1
    assert engine.signal(record.id, "paid", PAID) == "finished", "its own payment, repeated"
    other = {"operation": {**PAID["operation"], "operationId": "op-10"}}
    assert engine.signal(record.id, "paid", other) == "late_payment"


def test_a_packed_value_names_its_dictionary_and_older_ones_still_read() -> None:
    """Packed values carry the version of the dictionary they were made with; version 0 is none."""
    fields = {"state": "succeeded", "version": "3", "kind": "moto", "input": '{"order": {"orderId": "o1"}}', "outcome": "{}"}
    log = ['{"t": 1, "to": "succeeded"}']
    for version in (0, DICTIONARY_VERSION):
        plain, blob = pack(fields, log, version=version)
        assert blob[0] == version
        cold, entries = unpack(blob)
        assert cold["input"] == fields["input"] and entries == log and plain["state"] == "succeeded"
