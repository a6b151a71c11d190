"""Benchmark: the notification receiver reading each notified operation back from the gateway, against
the same receiver path without the read.

Run: ``.venv/bin/python -m bench.bench_receiver`` (two or three minutes with the defaults). Everything
is measured in this run, on one private Valkey (``appendfsync always``, as durapay's own runs) and one
simulator process (its notifications logged, not sent: ``notify_drop``), and printed as ratios; never a
timed assertion (machines are shared and noisy). Two receivers on the same engine, each served over
HTTP by uvicorn in this process on its own port, as ``durapay api`` serves the receiver route:

* **read-back**: :class:`service.receiver.NotificationReceiver`, which asks the gateway
  ``GET /operations/{operationId}`` of every notified operation before it signals the flow;
* **no read**: the same class with ``read_back`` answering the operation as the body notified it
  (what the receiver did before the read-back).

Each notification is the simulator's own body for a real ``hpp`` flow waiting on its hosted page (the
flows made and their pages paid before any timing), so both sides do the same work but the read: the
body read, the token check, the event claim, the signal and its fsync, the resumed flow's Celery message.

* **latency**: one notification at a time, the two sides alternating (A B, then B A, ...), median and
  p90 of ``--latency`` notifications per side, at each ``--gateway-ms`` (latency the simulator adds
  to the read only: 0 shows the read's own cost on this host, 20 a gateway as far as in
  ``bench_engine``'s rounds);
* **throughput**: ``--rounds`` rounds per side of ``--burst`` notifications posted from ``--senders``
  threads, the sides alternating, with the gateway answering at once; notifications per second, the
  median ratio and its spread, and this process's CPU time per notification on each side (the API
  and the senders run here: the difference is the read's CPU in the receiver).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
from fastapi import FastAPI

from bench._harness import Processes, bench_settings, median, percentile, start_simulator, valkey
from durapay.gateway import Operation
from durapay.service.api_receiver import receiver_router
from durapay.service.receiver import NotificationReceiver
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorAdmin
from durapay.workflows.engine import FlowState

APPROVE = "4349940199004549"


class NoReadBack(NotificationReceiver):
    """The same receiver, believing the notified operation as the body has it (no gateway read)."""

    def read_back(self, notified: Operation) -> Operation:
        return notified


def receiver_app(receiver: NotificationReceiver) -> FastAPI:
    """The receiver route alone, as ``create_app`` mounts it."""
    app = FastAPI()
    app.include_router(receiver_router(receiver))
    return app


class Bench:
    def __init__(self) -> None:
        self.stack = ExitStack()
        self.procs = Processes()
        self.stack.callback(self.procs.stop)
        self.valkey = valkey("always")
        self.stack.callback(self.valkey.stop)
        self.sim_root = start_simulator(self.procs)
        self.admin = SimulatorAdmin(self.sim_root, timeout=60)
        self.stack.callback(self.admin.close)
        self.runtime: Runtime = build_runtime(bench_settings(self.sim_root, self.valkey.url, "br"), redis_url=self.valkey.url)
        self.stack.callback(self.runtime.close)
        self.stack.callback(lambda: self.runtime.engine.gateway().close())
        engine, settings = self.runtime.engine, self.runtime.settings.receiver
        self.urls = {
            "read-back": self.stack.enter_context(ApiServer(receiver_app(NotificationReceiver(engine, settings)))).url,
            "no read": self.stack.enter_context(ApiServer(receiver_app(NoReadBack(engine, settings)))).url,
        }
        self.made = 0
        self.gateway_ms(0)

    def close(self) -> None:
        self.stack.close()

    def gateway_ms(self, latency_ms: int) -> None:
        """The simulator's latency on ``GET /operations/{operationId}`` only; notifications never sent."""
        self.admin.clear_faults()
        self.admin.set_faults(mode="notify_drop")
        if latency_ms:
            self.admin.set_faults(mode="latency", operation="get_operation", latency_ms=latency_ms)

    def bodies(self, count: int) -> list[dict[str, Any]]:
        """``count`` hpp flows waiting on their pages, each page paid: the simulator's notification bodies."""
        engine = self.runtime.engine
        orders = [f"br{self.made + n:07d}" for n in range(count)]
        self.made += count
        sender, engine.sender = engine.sender, None  # no Celery messages while the flows are made

        def waiting(order_id: str) -> None:
            data = {
                "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
                "paymentSession": {
                    "actionType": "PAY",
                    "amount": "1500",
                    "language": "eng",
                    "resultUrl": "https://shop.example/r",
                },
            }
            record = engine.start("hpp", data)
            engine.run_step(record.id, "create")
            assert engine.run_step(record.id, "payment") == FlowState.WAITING.value
            self.admin.complete_hpp(order_id, pan=APPROVE)

        try:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(waiting, orders))
        finally:
            engine.sender = sender
        wanted = set(orders)
        sent = {note["orderId"]: note["body"] for note in self.admin.notifications() if note["orderId"] in wanted}
        return [sent[order] for order in orders]

    def accepted(self) -> int:
        engine = self.runtime.engine
        return int(engine.redis.get(engine.keys.counter("notifications_accepted")) or 0)


def latency(bench: Bench, count: int) -> dict[str, list[float]]:
    """One notification at a time, the sides alternating; seconds per notification, by side."""
    bodies = {side: bench.bodies(count) for side in bench.urls}
    times: dict[str, list[float]] = {side: [] for side in bench.urls}
    clients = {side: httpx.Client(base_url=url, timeout=30) for side, url in bench.urls.items()}
    try:
        order = list(bench.urls)
        for n in range(count):
            for side in order if n % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                answer = clients[side].post("/notifications", json=bodies[side][n])
                times[side].append(time.perf_counter() - started)
                assert answer.status_code == 200, answer.text
    finally:
        for client in clients.values():
            client.close()
    return times


def burst(url: str, bodies: list[dict[str, Any]], senders: int) -> tuple[float, float]:
    """Post every body from ``senders`` threads; (notifications per second, this process's CPU seconds)."""
    local = threading.local()

    def send(body: dict[str, Any]) -> int:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, timeout=60)
        return int(local.client.post("/notifications", json=body).status_code)

    with ThreadPoolExecutor(max_workers=senders) as pool:
        list(pool.map(send, bodies[:senders]))  # each sender's connection opened before the timing
        cpu, started = time.process_time(), time.perf_counter()
        statuses = list(pool.map(send, bodies[senders:]))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert statuses == [200] * len(statuses), {status: statuses.count(status) for status in set(statuses)}
    return len(statuses) / elapsed, cpu


def throughput(bench: Bench, rounds: int, count: int, senders: int) -> list[float]:
    ratios: list[float] = []
    order = list(bench.urls)
    for n in range(rounds):
        rates: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for side in order if n % 2 == 0 else order[::-1]:
            bodies = bench.bodies(count + senders)
            rates[side], cpu[side] = burst(bench.urls[side], bodies, senders)
            cpu[side] /= count
        ratios.append(rates["read-back"] / rates["no read"])
        print(
            f"  round {n + 1}: read-back {rates['read-back']:.0f}/s, no read {rates['no read']:.0f}/s, "
            f"ratio {ratios[-1]:.3f}; this process's CPU per notification "
            f"{cpu['read-back'] * 1000:.2f} ms against {cpu['no read'] * 1000:.2f} ms",
            flush=True,
        )
    return ratios


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=int, default=200, help="notifications per side for the latency")
    parser.add_argument("--gateway-ms", type=int, nargs="+", default=[0, 20], help="latency of the read at the gateway")
    parser.add_argument("--rounds", type=int, default=6, help="throughput rounds per side (the sides alternate)")
    parser.add_argument("--burst", type=int, default=500, help="notifications per throughput round")
    parser.add_argument("--senders", type=int, default=8, help="threads posting in a throughput round")
    args = parser.parse_args()

    bench = Bench()
    print("Valkey appendfsync always; the receiver over HTTP (uvicorn, this process); the simulator in its own process")
    try:
        latency(bench, 20)  # warm-up, not counted: connections, scripts, the gateway client
        for gateway_ms in args.gateway_ms:
            bench.gateway_ms(gateway_ms)
            print(f"latency, one notification at a time, {args.latency} per side, {gateway_ms} ms gateway latency on the read:")
            times = latency(bench, args.latency)
            for side, values in times.items():
                print(f"  {side:<9} median {median(values) * 1000:.2f} ms (p90 {percentile(values, 0.9) * 1000:.2f} ms)")
            read, plain = times["read-back"], times["no read"]
            quarters = [median(read[i::4]) / median(plain[i::4]) for i in range(4)]
            print(
                f"  read-back / no read: {median(read) / median(plain):.3f} (four interleaved quarters {spread(quarters)}); "
                f"the read adds {(median(read) - median(plain)) * 1000:.2f} ms",
                flush=True,
            )
        bench.gateway_ms(0)
        print(
            f"throughput, {args.rounds} rounds of {args.burst} notifications per side "
            f"from {args.senders} threads, 0 ms gateway latency:"
        )
        ratios = throughput(bench, args.rounds, args.burst, args.senders)
        print(f"  throughput read-back / no read: median {statistics.median(ratios):.3f} ({spread(ratios)})")
        print(f"  notifications accepted: {bench.accepted()} of {bench.made} flows made")
    finally:
        bench.close()


if __name__ == "__main__":
    main()
