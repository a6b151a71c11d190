"""Fairness benchmark (issue 40): a trickle of one key's flows behind another key's 20,000-flow backlog.

Run: ``.venv/bin/python -m bench.bench_fairness`` (a few minutes with the defaults on a 2-core machine;
``--backlog 2000 --trickle 30`` for a short run). Everything is measured in this run, on one private
Valkey, one simulator process and one durable worker process (``--pool``, ``--concurrency``), with
fairness on (``workflows.engine.fairness``) and the two keys named in the weights (``default/bulk``,
``default/shop``, weight 1 each):

1. **alone**: the trickle, ``--trickle`` one-call flows (moto) of ``default/shop`` started every
   ``--gap`` seconds, nothing else queued;
2. **behind a backlog**: the worker stopped, ``--backlog`` flows of ``default/bulk`` started (their
   messages wait on their queue), the worker started again, and once it runs the backlog the same
   trickle. The backlog must outlast the trickle (said when it did not: the figure is then void);
3. with ``--compare-off``, phase 2 again with fairness off (one queue, first in first out): what the
   trickle waited without it.

Per trickle flow, *due to step start* is the time from its start (its record's creation, due at once) to
its step's claim (the first ``running`` entry of its log); both are the server's clock (``ServerClock``).
Printed: each phase's p50 and p95, and the ratio of phase 2's p95 to phase 1's (target <= 2x), and per
phase how many backlog flows were claimed between a trickle flow's start and its claim (the
interleaving; what tests/bench/test_fairness.py asserts, never a time). A ratio, measured in one run:
never an assertion (machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

import redis

from bench._harness import Processes, bench_settings, child_env, percentile, set_latency, start_simulator, valkey, wait_until
from durapay.service.runtime import Runtime, build_runtime

#: The issue's target: the trickle's p95 behind the backlog at most this many times its p95 alone.
RATIO_TARGET = 2.0
BULK, SHOP = "bulk", "shop"
#: Threads starting the backlog (a start waits for its write: one thread would time the starts).
SENDERS = 4

FAIR_WORKER = """
import sys
from durapay.config import load_settings
from durapay.service.runtime import build_runtime
settings = load_settings()
runtime = build_runtime(settings, redis_url=settings.redis_url)
queues = ",".join(runtime.engine.fairness.step_queues())
runtime.celery.worker_main(["worker", "-P", sys.argv[1], "-c", sys.argv[2], "-Q", queues, "-l", "warning",
                            "--without-mingle", "--without-gossip", "-n", "fair@%h"])
"""

_orders = iter(range(10**9))


def body() -> dict[str, Any]:
    # Never thirteen digits in a row: a run of digits that passes the Luhn check is refused as card data.
    return {
        "order": {"orderId": f"fb{time.time_ns() % 10**9}x{next(_orders)}", "amount": "1000", "currency": "EUR"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
    }


@dataclass
class Phase:
    """One phase's trickle: due to step start per flow (seconds), and backlog claims between."""

    name: str
    waits: list[float]
    between: list[int]
    backlog_left: int | None = None

    def p(self, fraction: float) -> float:
        return percentile(self.waits, fraction)


class FairBench:
    def __init__(self, pool: str, concurrency: int, latency_ms: int, *, cap: int = 0, backlog: int = 0) -> None:
        self.procs = Processes()
        self.server = valkey()
        self.sim = start_simulator(self.procs, latency_ms)
        base = bench_settings(self.sim, self.server.url, prefix="fair")
        fairness: dict[str, Any] = {"enabled": True, "weights": {f"default/{BULK}": 1, f"default/{SHOP}": 1}}
        if cap:
            fairness |= {"caps": {f"default/{BULK}": cap}, "max_held": max(1, backlog)}
        self.settings = {
            on: base.model_copy(update={"fairness": base.fairness.model_copy(update=fairness | {"enabled": on})})
            for on in (True, False)
        }
        self.runtimes: dict[bool, Runtime] = {
            on: build_runtime(settings, redis_url=self.server.url) for on, settings in self.settings.items()
        }
        self.redis = redis.Redis.from_url(self.server.url)
        self.pool, self.concurrency = pool, concurrency
        self.worker: Any = None

    def start_worker(self, on: bool, running: list[str] | None = None) -> None:
        """Start the worker and wait until it runs: one flow of its own claimed, or with ``running`` one of
        those (a backlog: a flow of its own would wait behind it with fairness off)."""
        self.stop_worker()
        self.worker = self.procs.spawn("worker", FAIR_WORKER, child_env(self.settings[on]), self.pool, str(self.concurrency))
        watched = running[: self.concurrency * 4] if running else [self.runtimes[on].engine.start("moto", body(), tenant=SHOP).id]
        wait_until(lambda: any(at is not None for at in self.claimed_at(on, watched)), 120, "the worker's first flow")

    def stop_worker(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()
            self.worker.wait(timeout=30)
        self.worker = None

    def close(self) -> None:
        self.stop_worker()
        self.procs.stop()
        for runtime in self.runtimes.values():
            runtime.close()
        self.server.stop()

    def claimed_at(self, on: bool, ids: list[str]) -> list[float | None]:
        """Per flow, when its first step was claimed (its log's first ``running`` entry), or None."""
        keys = self.runtimes[on].engine.keys
        pipe = self.redis.pipeline(transaction=False)
        for flow_id in ids:
            pipe.lrange(keys.log(flow_id), 0, 3)
        found: list[float | None] = []
        for entries in pipe.execute():
            times = [entry for entry in map(_parse, entries) if entry.get("to") == "running"]
            found.append(float(times[0]["t"]) if times else None)
        return found

    def created_at(self, on: bool, ids: list[str]) -> list[float]:
        return [record.created for record in self.runtimes[on].engine.store.many(ids)]

    def backlog(self, on: bool, flows: int) -> list[str]:
        """Start ``flows`` flows of the bulk key with no worker running: their messages wait queued."""
        engine = self.runtimes[on].engine
        batches: list[list[str]] = [[] for _ in range(SENDERS)]

        def start_some(batch: list[str], count: int) -> None:
            batch.extend(engine.start("moto", body(), tenant=BULK).id for _ in range(count))

        senders = [
            threading.Thread(target=start_some, args=(batch, flows // SENDERS + (index < flows % SENDERS)))
            for index, batch in enumerate(batches)
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        return [flow_id for batch in batches for flow_id in batch]

    def trickle(self, on: bool, flows: int, gap: float) -> list[str]:
        engine = self.runtimes[on].engine
        ids = []
        for _ in range(flows):
            ids.append(engine.start("moto", body(), tenant=SHOP).id)
            time.sleep(gap)  # the trickle's pace, not a wait for a condition
        wait_until(lambda: all(at is not None for at in self.claimed_at(on, ids)), 900, "every trickle flow's claim")
        return ids

    def phase(self, name: str, on: bool, trickle: list[str], backlog: list[str]) -> Phase:
        created = self.created_at(on, trickle)
        claimed = [at for at in self.claimed_at(on, trickle) if at is not None]
        waits = [max(0.0, end - start) for start, end in zip(created, claimed, strict=True)]
        backlog_claims = sorted(at for at in self.claimed_at(on, backlog) if at is not None) if backlog else []
        between = [
            bisect_right(backlog_claims, end) - bisect_left(backlog_claims, start)
            for start, end in zip(created, claimed, strict=True)
        ]
        left = len(backlog) - len(backlog_claims) if backlog else None
        return Phase(name, waits, between, left)


def run(args: argparse.Namespace, say: Any = print) -> dict[str, Phase]:
    """The phases (alone, behind the backlog, and with ``compare_off`` the same without fairness)."""
    if args.cap < 0:
        args.cap = max(1, args.concurrency - 1)
    bench = FairBench(args.pool, args.concurrency, args.latency_ms, cap=args.cap, backlog=args.backlog)
    phases: dict[str, Phase] = {}
    try:
        set_latency(bench.sim, args.latency_ms)
        bench.start_worker(True)
        phases["alone"] = bench.phase("alone", True, bench.trickle(True, args.trickle, args.gap), [])
        for name, on in (("backlog", True), ("backlog, fairness off", False)):
            if not on and not args.compare_off:
                continue
            bench.stop_worker()
            began = time.monotonic()
            backlog = bench.backlog(on, args.backlog)
            say(f"  {name}: {len(backlog)} flows of default/{BULK} queued in {time.monotonic() - began:.1f} s")
            bench.start_worker(on, backlog)
            trickle = bench.trickle(on, args.trickle, args.gap)
            phases[name] = bench.phase(name, on, trickle, backlog)
        bench.stop_worker()
    finally:
        bench.close()
    return phases


def report(phases: dict[str, Phase], say: Any = print) -> None:
    for phase in phases.values():
        left = "" if phase.backlog_left is None else f"; backlog flows not yet claimed at the end: {phase.backlog_left}"
        say(
            f"  {phase.name}: due to step start p50 {phase.p(0.5) * 1000:.1f} ms, p95 {phase.p(0.95) * 1000:.1f} ms; "
            f"backlog claims between a trickle flow's start and its claim: max {max(phase.between)}, "
            f"median {sorted(phase.between)[len(phase.between) // 2]}{left}"
        )
        if phase.name == "backlog" and phase.backlog_left == 0:  # without fairness it drains first: that is the point
            say(f"  {phase.name}: VOID, the backlog was drained before the trickle ended (use a larger --backlog)")
    alone = phases["alone"].p(0.95)
    for name in ("backlog", "backlog, fairness off"):
        if name in phases:
            ratio = phases[name].p(0.95) / alone if alone > 0 else float("inf")
            verdict = "ok" if ratio <= RATIO_TARGET else "ABOVE TARGET"
            target = f" (target <= {RATIO_TARGET:g}: {verdict})" if name == "backlog" else ""
            say(f"  trickle p95 {name} / alone: {ratio:.2f}{target}")


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parsed.add_argument("--backlog", type=int, default=20_000, help="flows of the bulk key queued before the trickle")
    parsed.add_argument("--trickle", type=int, default=60, help="flows of the trickle key, per phase")
    parsed.add_argument("--gap", type=float, default=0.1, help="seconds between two trickle starts")
    parsed.add_argument("--pool", default="threads")
    parsed.add_argument("--concurrency", type=int, default=8)
    parsed.add_argument("--latency-ms", type=int, default=20, help="the simulator's latency per gateway call")
    parsed.add_argument(
        "--cap",
        type=int,
        default=-1,
        help="the bulk key's concurrency cap (DURAPAY_FAIRNESS__CAPS; 0: none; default: the worker's threads less one, "
        "so one thread is always free for another key)",
    )
    parsed.add_argument("--compare-off", action="store_true", help="also run the backlog phase with fairness off")
    return parsed


def _parse(entry: bytes) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(entry)
    return parsed


def main() -> None:
    args = parser().parse_args()
    print(
        f"fairness: a trickle of {args.trickle} flows every {args.gap:g} s behind {args.backlog} queued flows of another key, "
        f"{args.pool} -c {args.concurrency}, {args.latency_ms} ms gateway latency, the backlog's key capped at "
        f"{args.cap if args.cap >= 0 else max(1, args.concurrency - 1)} (0: no cap)"
    )
    report(run(args))


if __name__ == "__main__":
    main()
