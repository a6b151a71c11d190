"""Engine benchmarks: latency and throughput of durable 3-step flows against bare Celery chains.

Run: ``.venv/bin/python -m bench.bench_engine`` (about two to four minutes). Prints, measured in this run:

* latency: one 3-step flow (frictionless card) end to end against the simulator with no injected
  latency, median of N (default 200), durable / bare (target <= 1.3);
* throughput: M flows (default 2,000) with 20 ms injected gateway latency, one worker, durable / bare
  (target >= 0.8), and flows per second;
* Redis memory per finished flow, record and log (target <= 4 KB).

Durable and bare runs alternate (latency) or follow each other (throughput) on the same Valkey, the
same simulator process and the same worker pool settings.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from typing import Any

import redis

from bench._bare import DONE, bare_chain, make_bare_app
from bench._harness import (
    BARE_WORKER,
    DURABLE_WORKER,
    Processes,
    bench_settings,
    child_env,
    median,
    percentile,
    set_latency,
    start_simulator,
    valkey,
    wait_until,
)
from service.runtime import build_runtime
from workflows.dispatcher import Dispatcher
from workflows.states import FlowState

_orders = itertools.count()


def body() -> dict[str, Any]:
    order_id = f"b{time.time_ns() % 10**9}{next(_orders)}"
    return {
        "order": {"orderId": order_id, "amount": "1000", "currency": "EUR"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
    }


class Bench:
    def __init__(self, pool: str, concurrency: int) -> None:
        self.procs = Processes()
        self.server = valkey()
        self.sim = start_simulator(self.procs)
        self.settings = bench_settings(self.sim, self.server.url)
        self.runtime = build_runtime(self.settings, redis_url=self.server.url)
        self.engine = self.runtime.engine
        self.bare = make_bare_app(self.settings)
        self.redis = redis.Redis.from_url(self.server.url)
        self.dispatcher = Dispatcher(self.engine).start()
        self.workers: list[Any] = []
        self.start_workers(pool, concurrency)

    def start_workers(self, pool: str, concurrency: int) -> None:
        for worker in self.workers:
            worker.terminate()
            worker.wait(timeout=30)
        env = child_env(self.settings)
        self.workers = [
            self.procs.spawn("durable-worker", DURABLE_WORKER, env, pool, str(concurrency)),
            self.procs.spawn("bare-worker", BARE_WORKER, env, pool, str(concurrency)),
        ]
        # Both workers answer before timing starts: one flow and one chain each.
        self.durable_once()
        self.bare_once()

    def close(self) -> None:
        self.dispatcher.stop()
        self.procs.stop()
        self.runtime.close()
        self.server.stop()

    def durable_once(self) -> float:
        started = time.time()
        record = self.engine.start("three_steps", body())
        done = wait_until(lambda: self._finished(record.id), 60, "a durable flow")
        return float(done.updated - started)

    def _finished(self, flow_id: str) -> Any:
        record = self.engine.get(flow_id)
        if record.state is FlowState.SUCCEEDED:
            return record
        if record.finished or record.state is FlowState.NEEDS_ATTENTION:
            raise RuntimeError(f"benchmark flow ended {record.state}: {record.summary()}")
        return None

    def bare_once(self) -> float:
        started = time.time()
        bare_chain(self.bare, body())
        popped: Any = self.redis.blpop([DONE], timeout=60)
        if popped is None:
            raise TimeoutError("a bare chain did not finish in 60s")
        return float(popped[1].split()[1]) - started

    def latency(self, flows: int) -> tuple[list[float], list[float]]:
        durable, bare = [], []
        for _ in range(flows):
            durable.append(self.durable_once())
            bare.append(self.bare_once())
        return durable, bare

    def durable_batch(self, flows: int) -> tuple[float, list[str]]:
        started = time.time()
        ids = [self.engine.start("three_steps", body()).id for _ in range(flows)]

        def all_done() -> bool:
            return sum(record.state is FlowState.SUCCEEDED for record in self.engine.store.many(ids)) == flows

        wait_until(all_done, 900, "the durable batch")
        last = max(record.updated for record in self.engine.store.many(ids))
        return last - started, ids

    def bare_batch(self, flows: int) -> float:
        self.redis.delete(DONE)
        started = time.time()

        def send_some() -> None:
            for _ in range(flows // 4):
                bare_chain(self.bare, body())

        senders = [threading.Thread(target=send_some) for _ in range(4)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        wait_until(lambda: self.redis.llen(DONE) >= flows - flows % 4, 900, "the bare batch")
        last = max(float(item.split()[1]) for item in self.redis.lrange(DONE, 0, -1))
        return last - started

    def memory_per_flow(self, ids: list[str]) -> tuple[float, float, float]:
        """Mean bytes of (record, log, log entries) over a sample of finished flows."""
        sample = ids[:200]
        record = log = entries = 0
        for flow_id in sample:
            record += int(self.redis.memory_usage(self.engine.keys.flow(flow_id), samples=0) or 0)
            log += int(self.redis.memory_usage(self.engine.keys.log(flow_id), samples=0) or 0)
            entries += int(self.redis.llen(self.engine.keys.log(flow_id)))
        return record / len(sample), log / len(sample), entries / len(sample)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-flows", type=int, default=200)
    parser.add_argument("--throughput-flows", type=int, default=2000)
    parser.add_argument("--latency-pool", default="prefork")
    parser.add_argument("--latency-concurrency", type=int, default=2)
    parser.add_argument("--throughput-pool", default="threads")
    parser.add_argument("--throughput-concurrency", type=int, default=32)
    args = parser.parse_args()

    bench = Bench(args.latency_pool, args.latency_concurrency)
    try:
        durable, bare = bench.latency(args.latency_flows)
        d, b = median(durable), median(bare)
        print(f"latency, {args.latency_flows} flows each, {args.latency_pool} -c {args.latency_concurrency}:")
        print(f"  durable median {d * 1000:.1f} ms (p90 {percentile(durable, 0.9) * 1000:.1f} ms)")
        print(f"  bare    median {b * 1000:.1f} ms (p90 {percentile(bare, 0.9) * 1000:.1f} ms)")
        print(f"  durable / bare = {d / b:.2f}   (target <= 1.3)")

        bench.start_workers(args.throughput_pool, args.throughput_concurrency)
        set_latency(bench.sim, 20)
        flows = args.throughput_flows
        bare_seconds = bench.bare_batch(flows)
        durable_seconds, ids = bench.durable_batch(flows)
        bare_rate, durable_rate = flows / bare_seconds, flows / durable_seconds
        print(f"throughput, {flows} flows, 20 ms gateway latency, {args.throughput_pool} -c {args.throughput_concurrency}:")
        print(f"  durable {durable_rate:.1f} flows/s ({durable_seconds:.1f} s)")
        print(f"  bare    {bare_rate:.1f} flows/s ({bare_seconds:.1f} s)")
        print(f"  durable / bare = {durable_rate / bare_rate:.2f}   (target >= 0.8)")
        record, log, entries = bench.memory_per_flow(ids)
        print(
            f"memory per finished flow (mean of 200): {record + log:.0f} bytes = record {record:.0f} + log {log:.0f}"
            f" ({entries:.1f} entries)   (target <= 4096)"
        )
    finally:
        bench.close()


if __name__ == "__main__":
    main()
