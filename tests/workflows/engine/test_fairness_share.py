"""A capped key's share while another key is waiting (``workflows.engine.fairness.Caps``, issue 40 item 2).

The benchmark (``bench/bench_fairness.py``): a backlog of one key capped at the threads less one still
doubled another key's latency and more, because the backlog's steps ran beside the other key's in the
same worker process and took its CPU (one interpreter lock), not its thread. A cap that holds while
another key is active is the bound on that: here, how many of the backlog's steps are in flight while
another key's steps are being sent, and that the whole cap comes back when that key is quiet (the
backlog alone still uses every place). No time is measured: the clock is the test's.
"""

from __future__ import annotations

from typing import Any

import redis

from durapay.config import load_settings
from durapay.config.celery import QUEUE
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.fairness import ACTIVE_SECONDS
from tests.workflows.engine_support import ScriptedStep, flow

BULK, SHOP = "default/bulk", "default/shop"
CAP = 6


class QueuedSent:
    """A sender that records the flows sent."""

    def __init__(self) -> None:
        self.flows: list[str] = []

    def send(self, task_name: str, flow_id: str, step: str) -> None:
        raise AssertionError("the engine sends chains")

    def send_chain(self, flow_id: str, links: list[tuple[str, str]], *, queue: str = QUEUE) -> None:
        self.flows.append(flow_id)


def _engine(redis_client: redis.Redis, key_prefix: str, clock: ManualClock, sent: QueuedSent, **fairness: Any) -> Engine:
    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "weights": {BULK: 1, SHOP: 1}, "caps": {BULK: CAP}, **fairness},
        }
    )
    return Engine(settings, redis_client, {"demo": flow(ScriptedStep("one"))}, sender=sent, clock=clock)


def _in_flight(engine: Engine) -> int:
    return int(engine.redis.zcard(engine.keys.fair_running(BULK)))


def _run_bulk(engine: Engine, sent: QueuedSent, bulk: set[str], rounds: int) -> list[int]:
    """Run the oldest sent bulk flow's step ``rounds`` times; the bulk places in flight after each."""
    seen = []
    for _ in range(rounds):
        flow_id = next(f for f in sent.flows if f in bulk)
        sent.flows.remove(flow_id)
        engine.run_step(flow_id, "one", worker="w")
        seen.append(_in_flight(engine))
    return seen


def test_a_capped_backlog_yields_to_its_share_while_another_key_waits_and_takes_its_cap_back_after(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    sent = QueuedSent()
    engine = _engine(redis_client, key_prefix, clock, sent)
    bulk = {engine.start("demo", {"amount": 1}, tenant="bulk").id for _ in range(40)}
    assert _in_flight(engine) == CAP  # alone: the whole cap
    assert _run_bulk(engine, sent, bulk, 4) == [CAP] * 4  # each end admits the next: the cap stays full

    engine.start("demo", {"amount": 2}, tenant="shop")  # another key's step is sent: the backlog yields
    clock.advance(0.5)
    share = CAP // 2  # two active keys of weight 1
    seen = _run_bulk(engine, sent, bulk, 8)
    assert max(seen[CAP - share :]) <= share, f"bulk places in flight while {SHOP} is active: {seen}"
    assert seen[-1] == share, seen  # ... and keeps its share (it is not starved)

    clock.advance(ACTIVE_SECONDS + 1)  # the shop is quiet: the backlog takes the whole cap again
    seen = _run_bulk(engine, sent, bulk, 2)
    assert seen[-1] == CAP, f"bulk places in flight once {SHOP} is quiet: {seen}"


def test_the_dispatcher_refills_the_whole_cap_once_the_other_key_is_quiet(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    sent = QueuedSent()
    engine = _engine(redis_client, key_prefix, clock, sent)
    engine.start("demo", {"amount": 2}, tenant="shop")
    bulk = {engine.start("demo", {"amount": 1}, tenant="bulk").id for _ in range(20)}
    assert _in_flight(engine) == CAP // 2  # admitted while the shop is active: its share
    clock.advance(ACTIVE_SECONDS + 1)
    engine.dispatch_due()  # nothing of the bulk ended: the dispatcher's refill gives the rest
    assert _in_flight(engine) == CAP
    assert len([f for f in sent.flows if f in bulk]) == CAP
