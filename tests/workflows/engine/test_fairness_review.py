"""Review of issue 40's fairness caps (review40f): each test here failed on the fairness branch's tip.

There, a capped key's places (``Caps``, ``engine/lua/fair_admit.lua``, ``engine/lua/fair_release.lua``) were kept apart
from the step's own claim and lease: a place was taken when a step was sent, lapsed a lease after that
whatever the step's lease did, and was given back by ``StepProtocol.run_step`` after any claim that
succeeded, even one whose run lost its lease. The tests: a cancelled admitted flow's place is given to a
held flow (a lease on, by the dispatcher); a stale run does not give away the place of its flow running
elsewhere (a place is its claim's); a step that renews its lease keeps its place; a flow beyond the held
list is not passed by every later one while the key is busy.
"""

from __future__ import annotations

from typing import Any

import redis

from durapay.config import load_settings
from durapay.config.celery import QUEUE
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from tests.workflows.engine_support import ScriptedStep, flow


class QueuedSent:
    """A sender that records the queue each chain was sent to."""

    def __init__(self) -> None:
        self.chains: list[tuple[str, list[tuple[str, str]], str]] = []

    def send(self, task_name: str, flow_id: str, step: str) -> None:
        raise AssertionError("the engine sends chains")

    def send_chain(self, flow_id: str, links: list[tuple[str, str]], *, queue: str = QUEUE) -> None:
        self.chains.append((flow_id, list(links), queue))


def _engine(redis_client: redis.Redis, key_prefix: str, clock: ManualClock, sent: QueuedSent, **fairness: Any) -> Engine:
    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "caps": {"default/bulk": 1}, "hold_seconds": 300, **fairness},
        }
    )
    return Engine(settings, redis_client, {"demo": flow(ScriptedStep("one"))}, sender=sent, clock=clock)


def test_a_cancel_of_an_admitted_flow_gives_its_place_to_the_held_one(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """Moves: cap 1; A started (admitted, sent), B started (held); A cancelled before its message runs; A's
    message delivered (refused: cancelled). Nothing of the key runs, yet B is not sent, not when A's place
    lapses (the lease, 30 s) either: B waits for its due entry, 300 s after its hold, and a cap of N loses a
    place this way for every admitted flow cancelled, paused, or retired before it ran."""
    sent = QueuedSent()
    engine = _engine(redis_client, key_prefix, clock, sent)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    second = engine.start("demo", {"amount": 1}, tenant="bulk").id
    assert [c[0] for c in sent.chains] == [first] and engine.caps.held("default/bulk") == 1
    sent.chains.clear()

    assert engine.cancel(first, by="test").state.value == "cancelled"
    assert engine.run_step(first, "one", worker="w") != "succeeded"  # its message: refused, runs nothing
    clock.advance(31)  # A's admission lapsed too
    engine.dispatch_due()
    assert [c[0] for c in sent.chains] == [second], (
        "the key runs nothing, yet its held flow is not sent until its hold (300 s) is over: "
        f"held {engine.caps.held('default/bulk')}, running {engine.redis.zrange(engine.keys.fair_running('default/bulk'), 0, -1)}"
    )


def test_a_stale_run_does_not_give_away_the_place_of_its_flow_running_elsewhere(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """Moves: cap 1; A started (admitted, sent), B started (held); worker w1 runs A's step, which outlives
    its lease (30 s): the dispatcher sends A again (admitted again: its place is A's), worker w2 takes it.
    w1's step ends: its result dropped (``stale``, the lease lost), and ``run_step``'s ``finally`` releases
    A's place although A runs on w2: B is sent, two of the key's steps at once under a cap of 1."""
    sent = QueuedSent()
    calls: list[str] = []

    def outlive_the_lease(ctx: Any) -> None:
        if calls:
            return
        calls.append("w1")
        clock.advance(31)
        assert engine.dispatch_due() >= 1  # A's lease lapsed: sent again, its place A's again
        taken = engine.protocol.claim(first, "one", worker="w2")
        assert not isinstance(taken, str), taken  # w2 holds A now

    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "caps": {"default/bulk": 1}, "hold_seconds": 300},
        }
    )
    definition = flow(ScriptedStep("one", during=outlive_the_lease))
    engine = Engine(settings, redis_client, {"demo": definition}, sender=sent, clock=clock)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    second = engine.start("demo", {"amount": 1}, tenant="bulk").id
    assert [c[0] for c in sent.chains] == [first]
    sent.chains.clear()

    assert engine.run_step(first, "one", worker="w1") == "stale"
    assert second not in [c[0] for c in sent.chains], (
        "A still runs on w2 (cap 1), yet its stale run on w1 gave its place to B: "
        f"running {engine.redis.zrange(engine.keys.fair_running('default/bulk'), 0, -1)}"
    )


def test_a_step_that_renews_its_lease_keeps_its_place_under_the_cap(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """Moves: cap 1; A started (admitted at t0, its place lapsing at t0 + lease); A's step makes several calls
    and renews its lease before the second (``StepContext.call``), so it still rightly runs at t0 + 36; a
    new flow C of the key starts then: ``fair_admit.lua`` drops A's place as lapsed (the admission is never
    renewed with the lease) and admits C, sent while A runs: two of the key's steps at once under a cap of 1."""
    sent = QueuedSent()
    started: list[str] = []
    sent_while_a_ran: list[str] = []

    def a_long_step(ctx: Any) -> None:
        if started:
            return
        clock.advance(25)
        assert ctx.renew_lease is not None
        ctx.renew_lease()  # what StepContext.call does before a step's second call
        clock.advance(11)  # t0 + 36: A's lease (renewed at t0 + 25) holds until t0 + 55
        started.append(engine.start("demo", {"amount": 3}, tenant="bulk").id)
        sent_while_a_ran.extend(c[0] for c in sent.chains)

    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "caps": {"default/bulk": 1}, "hold_seconds": 300},
        }
    )
    definition = flow(ScriptedStep("one", during=a_long_step))
    engine = Engine(settings, redis_client, {"demo": definition}, sender=sent, clock=clock)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    assert [c[0] for c in sent.chains] == [first]
    sent.chains.clear()

    assert engine.run_step(first, "one", worker="w1") == "succeeded"  # its lease held throughout: not stale
    (late,) = started
    assert late not in sent_while_a_ran, (
        "C was sent while A still ran (cap 1): A's place had lapsed at its admission's lease although its step renewed its own"
    )


def test_a_flow_beyond_the_held_list_is_not_passed_by_every_later_one(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """Moves: cap 1, ``max_held`` 1; A admitted, B held (listed), C held unlisted (the list full: it comes
    back by its due entry, 300 s on). Then the key's steady traffic: each time a step ends, the held flow
    takes the place and a new start takes the freed list slot, so when C's due entry brings it back, the
    place and the list are full again: held unlisted once more. Every flow started after C runs before it,
    round after round: C waits as long as the key is busy (no bound), the "oldest first" the docs promise
    kept for the listed ones only."""
    sent = QueuedSent()
    engine = _engine(redis_client, key_prefix, clock, sent, max_held=1)
    running = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    engine.start("demo", {"amount": 2}, tenant="bulk")  # B: listed
    clock.advance(1)
    late = engine.start("demo", {"amount": 3}, tenant="bulk").id  # C: beyond the list
    assert engine.caps.held("default/bulk") == 1 and late not in [c[0] for c in sent.chains]
    started_after: list[str] = []
    for round_ in range(40):  # 400 s of the key's traffic, a step ending every 10 s
        sent.chains.clear()
        assert engine.run_step(running, "one", worker="w") == "succeeded"
        (running,) = [c[0] for c in sent.chains]  # the listed flow took the place
        started_after.append(engine.start("demo", {"amount": 10 + round_}, tenant="bulk").id)  # the list's slot
        clock.advance(10)
        engine.dispatch_due()  # at 300 s C's due entry is reached: held unlisted again
    ran_before = [flow_id for flow_id in started_after if engine.get(flow_id).state.value == "succeeded"]
    assert engine.get(late).state.value == "succeeded" or late in [c[0] for c in sent.chains], (
        f"C (started before them) still not sent after 400 s while {len(ran_before)} flows started after it ran"
    )
