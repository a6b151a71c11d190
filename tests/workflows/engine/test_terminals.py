"""Gateway terminals (``workflows.engine.terminals``): a flow's start names its terminal, its record keeps it (only
off ``default``), every step's client and gate are its terminal's, and a terminal removed from the settings
while flows use it is refused at start, and parks (never reroutes) a flow met anyway."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.service.runtime import admit_terminals
from durapay.workflows.engine import Engine, InputError
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import StartConflict
from durapay.workflows.engine.terminals import TerminalRemoved, gateway_settings, health_settings, stranded
from tests.workflows.engine_support import ScriptedStep, Sent, flow

IT = {"api_key": "key-of-terminal-it", "base_url": "http://127.0.0.1:9/it", "rate_per_second": 5, "outage_seconds": 60}


@pytest.fixture
def engine_with(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Callable[..., Engine]:
    def make(terminals: dict[str, Any], *steps: Any) -> Engine:
        settings = load_settings(
            {
                "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
                "retry": {"base_seconds": 1, "cap_seconds": 10, "max_attempts": 3, "reconcile_attempts": 3},
                "terminals": terminals,
            }
        )
        definition = flow(*(steps or (ScriptedStep("pay"),)))
        return Engine(settings, redis_client, {definition.kind: definition}, sender=Sent(), clock=clock)

    return make


def test_a_start_names_its_terminal_and_the_record_keeps_it_only_off_default(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with({"it": IT})
    plain = engine.start("demo", {"amount": 3})
    assert "terminal" not in plain.fields and plain.terminal == "default", "one terminal: not one byte more"
    named = engine.start("demo", {"amount": 3}, terminal="it")
    assert named.fields["terminal"] == "it" and engine.get(named.id).terminal == "it"
    assert (
        engine.start("demo", {"amount": 3}, "k-1", terminal="it").id
        == engine.start("demo", {"amount": 3}, "k-1", terminal="it").id
    )
    with pytest.raises(StartConflict):  # a key names one request: the same input on another terminal is another
        engine.start("demo", {"amount": 3}, "k-1")


def test_an_unknown_terminal_is_refused_naming_the_known_ones_before_anything_is_written(
    engine_with: Callable[..., Engine],
) -> None:
    engine = engine_with({"it": IT})
    with pytest.raises(InputError) as refused:
        engine.start("demo", {"amount": 3}, "k-2", terminal="fr")
    assert refused.value.field == "terminal"
    assert refused.value.reason == "unknown terminal 'fr'; known terminals: default, it"
    assert not engine.redis.keys(f"{engine.keys.prefix}:*"), "nothing written"


def test_each_step_uses_its_flows_terminal_client_and_gate(engine_with: Callable[..., Engine]) -> None:
    seen: list[tuple[str, str, str]] = []
    step = ScriptedStep(
        "pay",
        during=lambda ctx: seen.append(
            (ctx.client.settings.api_key.get_secret_value(), ctx.client.settings.base_url, ctx.gate.terminal)
        ),
    )
    engine = engine_with({"it": IT}, step)
    on_it = engine.start("demo", {"amount": 3}, terminal="it")
    on_default = engine.start("demo", {"amount": 4})
    assert engine.run_step(on_it.id, "pay") == "succeeded"
    assert engine.run_step(on_default.id, "pay") == "succeeded"
    default = engine.settings.gateway
    assert seen == [
        ("key-of-terminal-it", "http://127.0.0.1:9/it", "it"),
        (default.api_key.get_secret_value(), default.base_url, "default"),
    ]
    it_gate, default_gate = engine.terminals.gate("it"), engine.terminals.gate("default")
    assert it_gate.key != default_gate.key, "a gate of its own"
    assert it_gate.settings.rate_per_second == 5 and it_gate.settings.outage_seconds == 60
    assert default_gate.settings == engine.settings.gateway_health
    assert engine.gate is default_gate


def test_a_terminal_takes_the_gateways_timeouts_and_the_breakers_thresholds() -> None:
    settings = load_settings({"terminals": {"it": {"api_key": "key-of-it"}}, "gateway": {"timeout": 4}})
    it = gateway_settings(settings, "it")
    assert it.base_url == settings.gateway.base_url and it.timeout == 4 and it.api_key.get_secret_value() == "key-of-it"
    assert health_settings(settings, "it") == settings.gateway_health


def test_a_removed_terminal_with_flows_in_flight_is_refused_at_start_and_parks_what_it_meets(
    engine_with: Callable[..., Engine], clock: ManualClock
) -> None:
    before = engine_with({"it": IT})
    waiting = [before.start("demo", {"amount": n}, terminal="it") for n in (1, 2)]
    before.start("demo", {"amount": 9})  # on default: not counted
    after = engine_with({})
    with pytest.raises(TerminalRemoved) as refused:
        admit_terminals(after)
    assert str(refused.value).startswith(
        "DURAPAY_TERMINALS: terminal 'it': 2 flows in flight (demo 2), and the settings no longer"
    )
    assert after.run_step(waiting[0].id, "pay") == "parked", "never run on another terminal's key"
    parked = after.get(waiting[0].id)
    assert parked.state is FlowState.PARKED and parked.attempt == 0
    assert "terminal 'it' is not in this process's settings" in after.history(parked.id)[-1]["what"]
    clock.advance(60)
    for record in waiting:
        assert before.run_step(record.id, "pay") == "succeeded", "a process declaring it takes it on"
    admit_terminals(after)  # drained: the start goes on
    assert stranded(after.redis, after.keys, ["default"]) == {}
    # Never forgotten: a start under way in a process still declaring it may be about to create a flow on it.
    assert after.redis.smembers(after.keys.terminals()) == {b"it"}


def test_events_of_a_flow_off_default_name_its_terminal(engine_with: Callable[..., Engine]) -> None:
    engine = engine_with({"it": IT})
    on_it = engine.start("demo", {"amount": 3}, terminal="it")
    on_default = engine.start("demo", {"amount": 4})
    for record in (on_it, on_default):
        assert engine.run_step(record.id, "pay") == "succeeded"
    events = [event for event, _ in engine.events()]
    of_it = [event.wire() for event in events if event.body.get("flow") == on_it.id]
    of_default = [event.wire() for event in events if event.body.get("flow") == on_default.id]
    assert [event["type"] for event in of_it] == ["flow.created", "flow.succeeded"]
    assert all(event["terminal"] == "it" for event in of_it)
    assert of_default and all("terminal" not in event for event in of_default), "default: not one byte more"


def test_a_packed_flow_keeps_its_terminal_plain_for_those_who_read_it_alone(
    engine_with: Callable[..., Engine], clock: ManualClock
) -> None:
    """A finished flow is packed (``workflows.engine.compact``): its terminal stays a plain field, as the receiver (a
    late notification's read-back) and a reconciliation's slice of succeeded flows read only that field."""
    from durapay.workflows.engine.compact import Compactor
    from durapay.workflows.reconciliation.run import Ended

    engine = engine_with({"it": IT})
    on_it = engine.start("demo", {"amount": 3}, terminal="it")
    on_default = engine.start("demo", {"amount": 4})
    for record in (on_it, on_default):
        assert engine.run_step(record.id, "pay") == "succeeded"
    assert Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder, delay=0.0).run(now=clock.now()) == 2
    raw = engine.redis.hgetall(engine.keys.flow(on_it.id))
    assert b"z" in raw and raw[b"terminal"] == b"it", "packed, its terminal plain"
    assert b"terminal" not in engine.redis.hgetall(engine.keys.flow(on_default.id)), "default: not one byte more"
    assert engine.get(on_it.id).terminal == "it"
    slices = [row for rows in Ended(engine, clock.now() - 60, clock.now() + 1, "it").down_to(clock.now() - 60) for row in rows]
    assert [flow_id for _, flow_id in slices] == [on_it.id]


def test_a_notification_for_a_flow_on_a_terminal_no_longer_declared_asks_for_it_again(
    engine_with: Callable[..., Engine],
) -> None:
    """A late notification for a flow of a terminal removed from the settings (a finished flow still kept:
    a process starts with those) was answered 500 (the read-back asked for an unknown terminal's client).
    Now 503 saying why, the claim released: the gateway sends it again, and a process declaring the
    terminal verifies it with that terminal's key (never another's)."""
    import json

    from durapay.service.receiver import NotificationReceiver

    before = engine_with({"it": IT})
    flow_id = before.start("demo", {"amount": 3}, terminal="it").id
    before.orders.claim("ord-it-1", flow_id)
    before.orders.keep_token("ord-it-1", flow_id, {"securityToken": "tok-it-1"})
    after = engine_with({})
    receiver = NotificationReceiver(after, after.settings.receiver)
    operation = {
        "operationId": "800000000000000011",
        "orderId": "ord-it-1",
        "operationType": "CAPTURE",
        "operationResult": "EXECUTED",
        "operationAmount": "300",
        "operationCurrency": "EUR",
    }
    body = {"eventId": "ev-it-1", "eventTime": "2026-12-02T16:00:00.000Z", "securityToken": "tok-it-1", "operation": operation}
    receipt = receiver.receive(json.dumps(body).encode())
    assert receipt.status == 503, receipt
    assert "terminal 'it'" in json.dumps(receipt.body), receipt.body
    assert receiver.receive(json.dumps(body).encode()).status == 503, "the claim was released: a retry is processed"
