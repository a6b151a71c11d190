"""Packing finished flows: less memory, the same record, history and guarantees when read or changed again."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.gateway import GatewayModel
from durapay.tasks.outcomes import Advance, Finish
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.compact import DICTIONARY_VERSION, Compactor, pack, unpack
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition, WaitStep
from durapay.workflows.engine.store import Change, FlowRecord, StartConflict
from durapay.workflows.flows._common import summarize
from tests.workflows.engine_support import DemoInput, HeldGateway, ScriptedStep, flow, wait_step

PAID = {"operation": {"operationId": "op-9", "orderId": "ord-1", "operationResult": "AUTHORIZED", "operationAmount": "500"}}


class OrderInput(GatewayModel):
    orderId: str


def compactor(engine: Any) -> Compactor:
    return Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder, delay=0.0)


def test_a_finished_flow_reads_the_same_once_packed_and_takes_less_memory(make_engine: Any, clock: ManualClock) -> None:
    engine, _ = make_engine(flow(ScriptedStep("first"), ScriptedStep("second")))
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "first")
    engine.run_step(record.id, "second")
    before, history = engine.get(record.id), engine.history(record.id)
    size = int(engine.redis.memory_usage(engine.keys.flow(record.id))) + int(
        engine.redis.memory_usage(engine.keys.log(record.id))
    )
    assert engine.redis.ttl(engine.keys.flow(record.id)) == -1, "no end before the packing pass gives it"
    assert compactor(engine).run(now=clock.now()) == 1
    after = engine.get(record.id)
    assert after.version == before.version + 1, "packing is a change: writers that read before read again"
    assert {**after.summary(), "version": before.version} == before.summary() and engine.history(record.id) == history
    assert engine.redis.exists(engine.keys.log(record.id)) == 0
    assert int(engine.redis.memory_usage(engine.keys.flow(record.id))) < size
    assert 0 < engine.redis.ttl(engine.keys.flow(record.id)) <= engine.store.retention_seconds
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
    assert compactor(engine).run(now=clock.now()) == 1
    assert engine.redis.object("encoding", key) == b"listpack"
    assert 0 < engine.redis.ttl(key) <= engine.store.retention_seconds
    assert engine.get(record.id).outputs["first"]["detail"] == "x" * 200


def test_a_packed_flow_still_accounts_for_money_and_can_be_retried(make_engine: Any, clock: ManualClock) -> None:
    """A payment reported after the flow failed and was packed: needs a person; the operator's retry
    unpacks it and the step takes the payment."""
    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (wait_step(),), summarize), client_factory=HeldGateway)
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


class _Ordered(GatewayModel):
    orderId: str
    amount: int


def test_every_script_answers_a_packed_record_as_it_answers_the_record_unpacked(make_engine: Any, clock: ManualClock) -> None:
    """A packed record keeps only ``PLAIN`` fields plain: every script either reads no more than those of a
    finished flow, or (writing) makes it plain first. Two flows with the same history, one packed: each
    script answers both alike, and what it writes (a late payment's signal, its events' order id and step)
    is the same."""
    later = WaitStep(
        "after", ("later",), lambda ctx, name, payload: Advance({}), lambda ctx: Advance({}), timeout=lambda ctx: 1.0
    )
    steps = (wait_step(), later)  # a signal for the step after the wait is kept: the flow fails before it
    definition = FlowDefinition("demo", _Ordered, steps, summarize, order_id=lambda data: data.orderId)
    engine, _ = make_engine(definition, client_factory=HeldGateway)
    flows = []
    for name in ("packed", "plain"):
        record = engine.start("demo", {"orderId": f"ord-{name}", "amount": 5}, key=name)
        engine.run_step(record.id, "customer")
        engine.signal(record.id, "later", {})  # kept, never consumed: the record ends with a signal
        flows.append(record.id)
    clock.advance(101)
    for flow_id in flows:
        assert engine.run_step(flow_id, "customer") == "failed"
    packed, plain = flows
    engine.redis.zrem(engine.keys.finished(engine.keys.partition(plain)), plain)  # only the first is packed
    assert compactor(engine).run(now=clock.now()) == 1
    assert engine.get(packed).packed and not engine.get(plain).packed

    def both(act: Any) -> tuple[Any, Any]:
        return act(packed, "packed"), act(plain, "plain")

    # claim.lua, renew.lua, request_cancel.lua: a finished flow is not claimed, renewed or asked to stop.
    answers = both(lambda flow_id, _: engine.protocol.claim(flow_id, "customer"))
    assert answers == ("stopped", "stopped")
    answers = both(lambda flow_id, _: engine.store.renew(engine.get(flow_id), lease_until=clock.now() + 30))
    assert answers == (False, False)
    answers = both(lambda flow_id, _: engine.store.request_cancel(flow_id, engine.get(flow_id).version))
    assert answers == (False, False)
    # create.lua: the same start key finds the flow (its input hash compared), another input is refused.
    answers = both(lambda flow_id, name: engine.start("demo", {"orderId": f"ord-{name}", "amount": 5}, key=name).id)
    assert answers == (packed, plain)
    with pytest.raises(StartConflict):
        engine.start("demo", {"orderId": "ord-packed", "amount": 6}, key="packed")
    # compact.lua: packed once.
    assert compactor(engine).run(now=clock.now()) == 0
    # signal.lua: a payment after the end is a late payment, written to the record as written.
    answers = both(lambda flow_id, _: engine.signal(flow_id, "paid", PAID))
    assert answers == ("late_payment", "late_payment")
    for flow_id in flows:
        record = engine.get(flow_id)
        assert [(s.field, s.name) for s in record.signals] == [("sig:1", "later"), ("sig:2", "paid")], record.signals
    events = {flow_id: [e.body for e, _ in engine.events() if e.body["flow"] == flow_id][-2:] for flow_id in flows}
    for flow_id, name in zip(flows, ("packed", "plain"), strict=True):
        assert [e["type"] for e in events[flow_id]] == ["payment.late", "flow.needs_attention"]
        assert all(e["orderId"] == f"ord-{name}" for e in events[flow_id]), events[flow_id]
        assert events[flow_id][1]["data"]["step"] == "customer"
    # transition.lua (through the store, which makes a packed record plain first): a person keeps it.
    answers = both(lambda flow_id, _: engine.keep_late_payment(flow_id).state)
    assert answers == (FlowState.SUCCEEDED, FlowState.SUCCEEDED)


def test_a_flow_that_finished_again_while_a_pass_read_it_is_packed_by_the_next(
    make_engine: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads a finished flow; a late payment brings it back and a person closes it (finished again)
    before the pass's script runs: the script finds another version and must leave the flow in the finished
    set, or it is never packed and its order lookups never expire."""
    import durapay.workflows.engine.compact as compact_module

    engine, _ = make_engine(FlowDefinition("demo", DemoInput, (wait_step(),), summarize), client_factory=HeldGateway)
    record = engine.start("demo", {"amount": 5})
    engine.run_step(record.id, "customer")
    clock.advance(101)
    assert engine.run_step(record.id, "customer") == "failed"
    real = compact_module.pack

    def meanwhile(*args: Any, **kwargs: Any) -> Any:
        assert engine.signal(record.id, "paid", PAID) == "late_payment"
        assert engine.keep_late_payment(record.id).state is FlowState.SUCCEEDED
        return real(*args, **kwargs)

    monkeypatch.setattr(compact_module, "pack", meanwhile)
    assert compactor(engine).run(now=clock.now() + 1) == 0
    monkeypatch.undo()
    assert not engine.get(record.id).packed
    assert compactor(engine).run(now=clock.now() + 2) == 1, "still listed as finished: the next pass packs it"


def test_a_change_read_before_the_packing_pass_is_never_written_on_the_packed_record(
    make_engine: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 review: an operator's retry read a failed flow plain; the dispatcher's pass packed it
    before the retry's compare-and-set, which passed on the packed hash (packing kept the version):
    the retry's deletions (the failed generation's outputs, outcome, error) found nothing plain to
    delete, and the flow went on packed, carrying them, with lookups about to expire. Packing is a
    write like any other (it moves the version): a change read before is refused as stale, and the
    retry reads the flow again, unpacks it, then writes."""
    declined = {"operation": {"operationId": "op-r1", "operationResult": "DECLINED"}}
    pay = ScriptedStep("pay", outcomes=[Advance(declined), Advance(declined), Advance({})])
    then = ScriptedStep("then", outcomes=[Finish(False, "declined"), Finish(False, "declined"), Advance({})])
    engine, _ = make_engine(FlowDefinition("demo", OrderInput, (pay, then), summarize, order_id=lambda data: data.orderId))

    def failed(order_id: str) -> FlowRecord:
        record = engine.start("demo", {"orderId": order_id})
        assert engine.run_step(record.id, "pay") == "ready"
        assert engine.run_step(record.id, "then") == "failed"
        return engine.get(record.id)

    read = failed("ord-r0")
    assert compactor(engine).run(now=clock.now() + 5) == 1
    assert engine.store.transition(read, Change(FlowState.READY, "read before"), now=clock.now(), by="test") is None
    assert engine.get(read.id).packed and engine.get(read.id).state is FlowState.FAILED

    record = failed("ord-r1")
    real = engine.store.transition
    passes = []

    def pass_then_transition(*args: Any, **kwargs: Any) -> Any:
        if not passes:
            passes.append(compactor(engine).run(now=clock.now() + 5))  # the dispatcher's pass lands here
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.store, "transition", pass_then_transition)
    engine.retry(record.id)
    monkeypatch.undo()
    assert passes == [1]
    again = engine.get(record.id)
    assert again.state is FlowState.READY and not again.packed
    assert "pay" not in again.outputs and again.outcome is None and again.error is None, "the failed run's results"
    k = engine.keys
    kept = [k.flow(record.id), k.order("ord-r1"), k.operation(k.partition(record.id), "op-r1")]
    assert [engine.redis.ttl(key) for key in kept] == [-1, -1, -1], "going again: nothing of it expires"
    clock.advance(5)
    assert engine.run_step(record.id, "pay") == "ready"
    assert engine.run_step(record.id, "then") == "succeeded"


def test_a_pass_cut_between_packing_and_the_lookups_end_leaves_no_lookup_without_an_end(
    make_engine: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36, finding 8: a dispatcher that died between packing a finished flow and giving its lookups
    their end left them with none: the record had its end and was off the finished set, so no later pass
    read it again, and the merchant's order id was refused as taken for ever. A flow is unlisted only once
    its lookups have their end, so the next pass gives them one."""
    declined = {"operation": {"operationId": "op-c8", "orderId": "ord-c8", "operationResult": "DECLINED"}}
    pay = ScriptedStep("pay", outcomes=[Advance(declined)])
    then = ScriptedStep("then", outcomes=[Finish(False, "declined")])
    engine, _ = make_engine(FlowDefinition("demo", OrderInput, (pay, then), summarize, order_id=lambda data: data.orderId))
    record = engine.start("demo", {"orderId": "ord-c8"})
    assert engine.run_step(record.id, "pay") == "ready"
    assert engine.run_step(record.id, "then") == "failed"
    k = engine.keys
    lookups = [k.order("ord-c8"), k.operation(k.partition(record.id), "op-c8")]

    def dies(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the dispatcher died before the lookups' end was written")

    monkeypatch.setattr(engine.orders, "expire", dies)
    with pytest.raises(ConnectionError):
        compactor(engine).run(now=clock.now() + 5)
    monkeypatch.undo()
    assert engine.get(record.id).packed, "the pass packed the record before it died"
    assert [engine.redis.ttl(key) for key in lookups] == [-1, -1], "no end yet"
    compactor(engine).run(now=clock.now() + 6)  # the next pass, by any dispatcher
    kept = engine.redis.ttl(k.flow(record.id))
    ends = [engine.redis.ttl(key) for key in lookups]
    assert all(end > 0 and kept - 2 <= end for end in ends), (kept, ends)
    assert not engine.redis.zscore(k.finished(k.partition(record.id)), record.id), "unlisted once the lookups have their end"
