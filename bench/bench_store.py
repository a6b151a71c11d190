"""The store's cost per 3-step flow when many flows share it: Valkey CPU per flow at rising concurrency.

Run: ``.venv/bin/python -m bench.bench_store`` (a minute or two). What sizes a deployment is the store
(issue 39: "one Valkey core carries 2,000 flows/s"). ``bench_engine`` measures it under Celery at the
rate one worker on this machine reaches (about 100 flows/s, 32 in flight), where each acknowledged write
waits for an fsync of its own: under ``appendfsync always`` Valkey fsyncs once per pass of its event
loop, for every client's writes of that pass, so the cost per flow falls as more flows share a pass.
This bench takes Celery and the gateway out and drives the store's own path as fast as clients can: in
``--processes`` processes of ``--threads`` threads each, every client starts a flow, then runs its three
steps as a worker does (the first claimed alone, each later claim in the completion's round trip, the
middle step's call marked as moving money; the steps' bodies answer at once), then the next flow. After
each level the finished flows are packed (the compaction pass a dispatcher runs), and its cost is counted
with theirs. Printed per level: flows/s, and per flow Valkey CPU (``INFO cpu``: main thread and I/O
threads), commands, round trips and AOF bytes (``bench/_server_cost.py``); and flows/s one Valkey core
would carry at that cost (1 / CPU per flow).

What it leaves out: the broker (Celery's queues: on a Valkey of its own in a sizing, ``bench_engine
--broker-fsync``), merchant events (``--events`` turns them on), webhooks, the dispatcher's ticks. The
clients share the machine with the server (2 cores here): the rate a level reaches is the clients'
limit as much as the server's; the CPU per flow is the server's own figure either way.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from typing import Any

import redis

from bench._harness import valkey
from bench._server_cost import ServerCost, ServerCounters
from durapay.config import load_settings
from durapay.service.runtime import freeze_startup_heap
from durapay.workflows.engine import Engine
from durapay.workflows.engine.compact import Compactor
from tests.workflows.engine_support import ScriptedStep, flow

#: Issue 39's target: Valkey CPU per 3-step flow on one node.
CPU_TARGET_MS = 0.5


class NoSender:
    """The steps are run here, not sent: a start's and a completion's sends go nowhere."""

    def send(self, task_name: str, flow_id: str, step: str, *, queue: str = "") -> None:
        return None

    def send_chain(self, flow_id: str, links: list[tuple[str, str]], *, queue: str = "") -> None:
        return None


def engine_for(url: str, prefix: str, events: bool) -> Engine:
    settings = load_settings({"engine": {"key_prefix": prefix}, "events": {"enabled": events}})
    steps = (ScriptedStep("a", op=None), ScriptedStep("b"), ScriptedStep("c", op=None))
    return Engine(settings, redis.Redis.from_url(url), {"demo": flow(*steps)}, sender=NoSender())


def client_process(url: str, prefix: str, events: bool, threads: int, flows: int, ready: Any, go: Any, done: Any) -> None:
    """One process of ``threads`` clients, ``flows`` flows each, one after the other."""
    freeze_startup_heap()
    engine = engine_for(url, prefix, events)
    engine.start("demo", {"amount": 100})  # scripts loaded, durability read, a connection made
    failures: list[str] = []

    def run() -> None:
        for n in range(flows):
            started = engine.start("demo", {"amount": 101 + n})
            engine.run_step(started.id, "a", worker="bench", follow=5)
            if engine.get(started.id).state.value != "succeeded":
                failures.append(started.id)

    ready.release()
    go.wait()
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done.put(failures)


def level(url: str, prefix: str, events: bool, processes: int, threads: int, flows: int) -> tuple[float, ServerCost, int]:
    """(flows/s, the server's cost per flow with the packing of them, flows run) of one concurrency level."""
    context = multiprocessing.get_context("spawn")
    ready, go, done = context.Semaphore(0), context.Event(), context.Queue()
    children = [
        context.Process(target=client_process, args=(url, prefix, events, threads, flows, ready, go, done))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    for _ in children:
        if not ready.acquire(timeout=120):
            raise TimeoutError("a client process did not start within 120 s")
    server = redis.Redis.from_url(url)
    before = ServerCounters.read(server)
    started = time.perf_counter()
    go.set()
    failures = [flow_id for _ in children for flow_id in done.get(timeout=900)]
    seconds = time.perf_counter() - started
    for child in children:
        child.join(timeout=60)
    if failures:
        raise RuntimeError(f"{len(failures)} flows did not succeed, e.g. {failures[:3]}")
    engine = engine_for(url, prefix, events)
    compactor = Compactor(server, engine.keys, engine.orders, tell=engine.tell_holder)
    total = processes * threads * flows
    packed = 0
    for _ in range(1000):  # bounded: each pass packs a batch of finished flows
        done_now = compactor.run(now=time.time() + 3600)
        packed += done_now
        if not done_now:
            break
    cost = ServerCost.between(before, ServerCounters.read(server), total, {}, 0)
    return total / seconds, cost, packed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=["1x1", "1x8", "2x16", "2x32"], help="processes x threads")
    parser.add_argument("--flows", type=int, default=2000, help="flows per level (split between the clients)")
    parser.add_argument("--appendfsync", choices=("always", "everysec", "no"), default="always")
    parser.add_argument("--events", action="store_true", help="merchant events on (off: the records alone)")
    args = parser.parse_args()
    server = valkey(args.appendfsync)
    print(f"Valkey appendfsync {args.appendfsync}; merchant events {'on' if args.events else 'off'}; 3-step flows")
    try:
        for n, text in enumerate(args.levels):
            processes, threads = (int(part) for part in text.split("x"))
            each = max(1, args.flows // (processes * threads))
            rate, cost, packed = level(server.url, f"store{n}", args.events, processes, threads, each)
            verdict = "ok" if cost.cpu_ms <= CPU_TARGET_MS else "ABOVE TARGET"
            print(
                f"  {processes} x {threads} clients: {rate:,.0f} flows/s; per flow {cost.line()} (packed {packed}); "
                f"one Valkey core at this cost: {1000 / max(cost.cpu_ms, 1e-6):,.0f} flows/s "
                f"(target <= {CPU_TARGET_MS} ms: {verdict})"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
