"""Final money review (reviewfinal) of the fairness caps: each test here fails on main (d6e770b).

A release (``engine/lua/fair_release.lua``) admits the oldest held flows into the room there is and
``StepProtocol._send_admitted`` sends them; a flow among them that ended meanwhile (cancelled while held)
gives its place back (``Caps.forget``), but the room it took is not offered to the next held flow.
"""

from __future__ import annotations

from dataclasses import replace

import redis

from durapay.config import load_settings
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from tests.workflows.engine.test_fairness_review import QueuedSent, _engine
from tests.workflows.engine_support import ScriptedStep, flow


def test_a_place_given_to_a_cancelled_held_flow_goes_to_the_next_held_one(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """Moves: cap 1; A started (admitted, sent), B and C started (held, in that order); B cancelled while
    held; A's step runs and ends. Its release admits B (the oldest held), B has ended so its place is
    forgotten, and C, the one flow that could run, is not sent: the key runs nothing until a dispatcher's
    pass refills it (the docs: a held step is sent "when one of the key's steps ends")."""
    sent = QueuedSent()
    engine = _engine(redis_client, key_prefix, clock, sent)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    second = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    third = engine.start("demo", {"amount": 1}, tenant="bulk").id
    assert [c[0] for c in sent.chains] == [first] and engine.caps.held("default/bulk") == 2
    sent.chains.clear()

    assert engine.cancel(second, by="test").state.value == "cancelled"
    assert engine.run_step(first, "one", worker="w") == "succeeded"
    assert [c[0] for c in sent.chains] == [third], (
        "A's step ended and freed its place, C is held and could run, yet C is not sent: "
        f"sent {sent.chains}, held {engine.caps.held('default/bulk')}, "
        f"running {engine.redis.zrange(engine.keys.fair_running('default/bulk'), 0, -1)}"
    )


def test_a_held_flow_of_a_paused_kind_does_not_take_the_place_of_a_held_flow_that_can_run(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """Moves: cap 1, two kinds on one fairness key; A (``demo``) started (admitted, sent), B (``other``) and
    C (``demo``) started (held, in that order); ``other`` paused; A's step ends. Its release admits B and
    ``_send_admitted`` sends it without asking the pauses (the dispatcher's pass does ask,
    ``Pauses.hold``); B's message is refused (``paused``) and its place stays taken, unclaimed, until it
    lapses a lease (30 s) on: C, which could run, waits that long behind a flow that cannot."""
    sent = QueuedSent()
    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "caps": {"default/bulk": 1}, "hold_seconds": 300},
        }
    )
    kinds = {"demo": flow(ScriptedStep("one")), "other": replace(flow(ScriptedStep("one")), kind="other")}
    engine = Engine(settings, redis_client, kinds, sender=sent, clock=clock)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    second = engine.start("other", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    third = engine.start("demo", {"amount": 1}, tenant="bulk").id
    assert [c[0] for c in sent.chains] == [first] and engine.caps.held("default/bulk") == 2
    sent.chains.clear()

    engine.pauses.pause("other", "maintenance window", by="ops")
    assert engine.run_step(first, "one", worker="w") == "succeeded"
    if second in [c[0] for c in sent.chains]:
        assert engine.run_step(second, "one", worker="w") != "succeeded"  # its message: refused, paused
    engine.dispatch_due()
    assert third in [c[0] for c in sent.chains], (
        "A's place went to B, whose kind is paused; C could run but waits for B's place to lapse: "
        f"sent {sent.chains}, running {engine.redis.zrange(engine.keys.fair_running('default/bulk'), 0, -1)}"
    )
