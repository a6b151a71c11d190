"""Payment flows beside hostile webhook endpoints (issue 37, finding 3): as fast as with no endpoint.

Deliveries run on workers of their own (``durapay worker --webhooks``: their own queue and pool), and
each attempt has one deadline for connect, send and read together. This measures what that buys: batches
of ``--flows`` MOTO payments (200) started at once, timed until every one has ended, with no webhook
endpoint, and with two endpoints subscribed to every event, one that trickles its answer a byte every
half second and one that never answers. Rounds alternate the two (each round runs both, in turn), in
one run on one machine, and the ratio of the medians is printed (slow endpoints / none: 1.0 is "as
fast"). Never an assertion: machines are shared and noisy.

The parts are processes, as deployed: a steps worker (``-Q durapay``, prefork), a deliveries worker
(``-Q durapay.webhooks``, threads), the simulator; the dispatcher with the webhook ticker runs here.

    .venv/bin/python -m bench.bench_webhook_isolation [--flows 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import socket
import statistics
import subprocess
import time
from typing import Any

from bench._harness import Processes, bench_settings, child_env, start_simulator, valkey, wait_until
from durapay.config.embedded import free_port
from durapay.service.runtime import build_runtime
from durapay.workflows.engine import Dispatcher, FlowState

#: The hostile endpoints, in a process of their own (as an endpoint is elsewhere): the bench's clock and
#: starts share no interpreter with them.
ENDPOINTS = """
import sys, threading
from bench._slow_receiver import SlowReceiver
trickling = SlowReceiver("trickle", every=0.5, length=100_000, port=int(sys.argv[1]))
with trickling, SlowReceiver("silent", every=1.0, port=int(sys.argv[2])):
    threading.Event().wait()
"""

WORKER = """
import sys
from durapay.config import load_settings
from durapay.service.runtime import build_runtime
settings = load_settings()
runtime = build_runtime(settings, redis_url=settings.redis_url)
runtime.celery.worker_main(["worker", "-P", sys.argv[1], "-c", sys.argv[2], "-Q", sys.argv[3], "-l", "warning",
                            "--without-mingle", "--without-gossip", "-n", sys.argv[4] + "@%h"])
"""

_orders = itertools.count()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def moto() -> dict[str, Any]:
    order = {"orderId": f"iso{time.time_ns() % 10**9}n{next(_orders)}", "amount": "1500", "currency": "EUR"}
    return {"order": order, "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}}


class Bench:
    def __init__(self, steps_concurrency: int, delivery_threads: int) -> None:
        self.procs = Processes()
        self.server = valkey()
        sim = start_simulator(self.procs)
        settings = bench_settings(sim, self.server.url, prefix="iso")
        hooks = settings.webhooks.model_copy(update={"allow_private": True})
        self.settings = settings.model_copy(update={"webhooks": hooks})
        self.runtime = build_runtime(self.settings, redis_url=self.server.url)
        env = child_env(self.settings) | {"DURAPAY_WEBHOOKS__ALLOW_PRIVATE": "true"}
        self.workers: list[subprocess.Popen[bytes]] = [
            self.procs.spawn("steps-worker", WORKER, env, "prefork", str(steps_concurrency), "durapay", "steps"),
            self.procs.spawn("webhooks-worker", WORKER, env, "threads", str(delivery_threads), "durapay.webhooks", "webhooks"),
        ]
        self.dispatcher = Dispatcher(self.runtime.engine, tickers=[self.runtime.webhooks.tick]).start()
        ports = (free_port(), free_port())
        self.procs.spawn("endpoints", ENDPOINTS, env, *map(str, ports))
        self.urls = [f"http://127.0.0.1:{port}/hook" for port in ports]
        wait_until(lambda: all(_listening(port) for port in ports), 30, "the slow endpoints to listen")
        self.endpoints: list[str] = []
        self.batch(5)  # the workers answer before timing starts

    def subscribe(self, slow: bool) -> None:
        endpoints = self.runtime.webhooks.endpoints
        for endpoint_id in self.endpoints:
            endpoints.remove(endpoint_id)
        self.endpoints = [endpoints.add(url).id for url in self.urls] if slow else []

    def batch(self, flows: int) -> float:
        """Seconds from the first start to the last flow's end (its completion's own time)."""
        engine = self.runtime.engine
        started = time.time()
        ids = [engine.start("moto", moto()).id for _ in range(flows)]

        def ended() -> list[Any] | None:
            records = engine.store.many(ids)
            if any(not record.finished for record in records):
                return None
            bad = [record for record in records if record.state is not FlowState.SUCCEEDED]
            if bad:
                raise RuntimeError(f"benchmark flow ended {bad[0].state}: {bad[0].summary()}")
            return records

        records = wait_until(ended, 600, f"{flows} flows to end")
        return max(record.updated for record in records) - started

    def close(self) -> None:
        self.dispatcher.stop()
        self.procs.stop()
        self.runtime.close()
        self.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2, help="the steps worker's prefork processes")
    parser.add_argument("--delivery-threads", type=int, default=8)
    args = parser.parse_args()
    bench = Bench(args.concurrency, args.delivery_threads)
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        print(f"{args.rounds} rounds of {args.flows} MOTO flows: no endpoint, and a trickling + a silent endpoint")
        for n in range(args.rounds):
            for slow in (n % 2 == 1, n % 2 == 0):
                bench.subscribe(slow)
                times[slow].append(bench.batch(args.flows))
            print(
                f"  round {n + 1}: none {times[False][-1]:.2f} s, slow endpoints {times[True][-1]:.2f} s "
                f"(deliveries pending: {bench.runtime.webhooks.pending()})"
            )
        none, slow = statistics.median(times[False]), statistics.median(times[True])
        print(f"  median: none {none:.2f} s ({args.flows / none:.1f} flows/s), slow endpoints {slow:.2f} s")
        print(f"  slow endpoints / none: {slow / none:.3f} (1.0: as fast as with no endpoint)")
    finally:
        bench.close()


if __name__ == "__main__":
    main()
