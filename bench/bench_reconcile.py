"""Benchmark: reconcile 10,000 flows against the gateway; how long, and how many gateway calls?

Run: ``.venv/bin/python -m bench.bench_reconcile`` (``--flows N``; a few minutes, most of it making the
flows). One private Valkey (``appendfsync everysec``, the engine's durability waits off: the flows are
the bench's fixture, not what it measures) and the simulator in its own process. ``--flows`` MOTO flows
run to ``succeeded`` from ``--threads`` threads through the real engine (start, claim, the gateway call,
completion); then one of each mismatch is planted as the acceptance test does (a payment no flow
claims, a record naming an operation the gateway does not have, a flow marked failed whose payment
executed, a second payment on one flow), and ``Reconciler.run`` reads the whole window back and
judges it page by page, timed. Printed: the time of the run and of its parts (the gateway's pages and
single reads, the flows' lookups and records, judging, the mismatches' events and moves), the gateway
calls and pages, the operations and flows, the run's peak of traced memory (``--memory``: tracemalloc,
which slows the run), and whether exactly the four planted mismatches were found. Not a test: machines
are noisy.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from bench._harness import Processes, bench_settings, start_simulator, valkey
from durapay.gateway import Catalogue
from durapay.workflows.engine import Engine
from durapay.workflows.flows import REGISTRY
from durapay.workflows.reconciliation import Reconciler
from durapay.workflows.reconciliation import judge as judge_module
from durapay.workflows.reconciliation import window as window_module

APPROVE = "4349940199004549"


def moto_input(order_id: str, amount: int) -> dict[str, Any]:
    return {
        "order": {"orderId": order_id, "amount": str(amount), "currency": "EUR"},
        "card": {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"},
    }


def make_flows(engine: Engine, count: int, threads: int) -> list[str]:
    def one(n: int) -> str:
        record = engine.start("moto", moto_input(f"bench-{n}", 1000 + n % 5000))
        engine.run_step(record.id, record.step, follow=5)
        return record.id

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(count)))


def plant(engine: Engine, client: redis.Redis, ids: list[str]) -> None:
    """One of each mismatch, as tests/workflows/reconciliation/test_run.py plants them."""
    engine.gateway().call(Catalogue.create_moto_order, request=moto_input("stray-bench", 700))
    wrong = engine.get(ids[10])
    real = str((wrong.outcome or {})["operation"]["operationId"])
    client.hset(engine.keys.flow(wrong.id), "outcome", json.dumps(wrong.outcome).replace(real, "899999999999999999"))
    failed = engine.get(ids[20])
    client.hset(engine.keys.flow(failed.id), mapping={"state": "failed", "outcome": json.dumps({"reason": "planted"})})
    twice = engine.get(ids[30])
    engine.orders.point(f"{twice.order_id}-2", twice.id)
    engine.gateway().call(Catalogue.create_moto_order, request=moto_input(f"{twice.order_id}-2", 1500))


class Timed:
    """Wall time spent in the functions a run calls (the gateway's pages, the flows' lookups, judging),
    wrapped for the bench."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flows", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--memory", action="store_true", help="Trace the run's memory (tracemalloc; slower).")
    args = parser.parse_args()
    procs = Processes()
    server = valkey("everysec")
    try:
        sim_root = start_simulator(procs)
        settings = bench_settings(sim_root, server.url, prefix="rec")
        settings = settings.model_copy(update={"engine": settings.engine.model_copy(update={"sync_aof": "no"})})
        client = redis.Redis.from_url(server.url)
        engine = Engine(settings, client, REGISTRY)
        since = engine.clock.now() - 60
        started = time.perf_counter()
        ids = make_flows(engine, args.flows, args.threads)
        made = time.perf_counter() - started
        plant(engine, client, ids)

        timed = Timed()
        reads = window_module.GatewayReads
        reads.list_operations = timed.wrap("gateway pages", reads.list_operations)  # type: ignore[method-assign]
        reads.get_operation = timed.wrap("single reads", reads.get_operation)  # type: ignore[method-assign]
        judge_module.Judge.page = timed.wrap("judging pages", judge_module.Judge.page)  # type: ignore[method-assign]
        reconciler = Reconciler(engine)
        reconciler.owners = timed.wrap("flow lookups and records", reconciler.owners)  # type: ignore[method-assign]
        reconciler.act = timed.wrap("events and moves of mismatches", reconciler.act)  # type: ignore[method-assign]
        if args.memory:
            tracemalloc.start()
        started = time.perf_counter()
        report = reconciler.run(since, engine.clock.now() + 1)
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1] if args.memory else None
        tracemalloc.stop()
        found = sorted((finding.category, finding.flow or "") for finding in report.mismatches)
        result = {
            "flows": args.flows,
            "make_flows_seconds": round(made, 1),
            "reconcile_seconds": round(took, 2),
            "parts_seconds": {name: round(value, 2) for name, value in timed.seconds.items()},
            "gateway_calls": report.calls,
            "pages": report.pages,
            "operations": report.operations,
            "flows_matched": report.flows,
            "mismatches": len(report.mismatches),
            "exactly_the_four_planted": len(found) == 4 and not report.gaps and report.error is None,
            "per_flow_ms": round(took / args.flows * 1000, 3),
            "peak_traced_mib": round(peak / 2**20, 1) if peak is not None else None,
        }
        print(json.dumps(result, indent=2))
        print(
            f"reconciled {report.operations} operations of {args.flows} flows in {took:.2f} s "
            f"({result['per_flow_ms']} ms a flow) with {report.calls} gateway calls; "
            f"{len(report.mismatches)} mismatches (the 4 planted: {result['exactly_the_four_planted']})"
        )
    finally:
        procs.stop()
        server.stop()


if __name__ == "__main__":
    main()
