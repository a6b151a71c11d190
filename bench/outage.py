"""A gateway outage in the middle of mixed flows: the acceptance run of issue 28 (docs/durability.md,
"Gateway health").

Run: ``.venv/bin/python -m bench.outage`` (defaults: 500 flows, a 150 s outage, about five minutes).
A private Valkey, the simulator and ``--workers`` durable worker processes (threads, ``-c 16``) with the
default settings (breaker after 5 failures, open 15 s, 8 attempts with backoff up to 300 s), and a
dispatcher in this process. Half the flows (MOTO, card verification, wallet in turn) start before the
outage; the simulator then answers every call 503 for the first half of the outage and lets every call
hang past the client's timeout for the second, while the other half start; then it is healthy again.

Printed (and ``--json``): the flows' states, flows charged twice (orders with more than one executed
payment at the simulator), attempts used per flow (log entries "will be retried"), deferrals per flow
("gateway unavailable"), the gateway events, the gate's counters, and how long the backlog took to
drain once the gateway was back. What must hold: 0 failed, 0 needs_attention, 0 charged twice, every
flow finished by itself.

``--outage-seconds`` below ``--bound`` shows the other half: with ``--bound 30`` and a 60 s outage,
flows end ``failed`` (or ``needs_attention`` where money may have moved) with the reason.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from collections import Counter
from typing import Any

import httpx

from bench._harness import DURABLE_WORKER, Processes, bench_settings, child_env, start_simulator, valkey, wait_until
from durapay.service.runtime import build_runtime
from durapay.workflows.dispatcher import Dispatcher
from durapay.workflows.states import STOPPED, FlowState

APPROVE = "4349940199004549"
_ids = itertools.count()


def flow_input(number: int) -> tuple[str, dict[str, Any]]:
    order = {"orderId": f"o{int(time.time()) % 100000}x{next(_ids)}", "amount": "1500", "currency": "EUR"}
    card = {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"}
    kind = ("moto", "card_verification", "wallet")[number % 3]
    if kind == "moto":
        return kind, {"order": order, "card": card}
    if kind == "card_verification":
        return kind, {"order": {**order, "amount": "0"}, "card": card}
    return kind, {"order": order, "walletPaymentData": {"pan": APPROVE}}


def faults(root: str, body: dict[str, Any] | None) -> None:
    httpx.delete(root + "/_sim/faults", timeout=5).raise_for_status()
    if body:
        httpx.post(root + "/_sim/faults", json=body, timeout=5).raise_for_status()


def run(flows: int, outage: float, workers: int, bound: float | None) -> dict[str, Any]:
    procs = Processes()
    server = valkey()
    try:
        sim = start_simulator(procs)
        settings = bench_settings(sim, server.url, prefix="outage")
        env = child_env(settings)
        if bound is not None:
            env["DURAPAY_GATEWAY_HEALTH__OUTAGE_SECONDS"] = str(bound)
        for n in range(workers):
            procs.spawn(f"worker{n}", DURABLE_WORKER, env, "threads", "16")
        runtime = build_runtime(settings, redis_url=server.url)
        engine = runtime.engine
        dispatcher = Dispatcher(engine, interval=0.2)
        dispatcher.start()
        try:
            half = flows // 2
            ids = [engine.start(*flow_input(n)).id for n in range(half)]
            began = time.monotonic()
            faults(sim, {"mode": "error", "status": 503})
            starter = threading.Thread(
                target=lambda: ids.extend(engine.start(*flow_input(n)).id for n in range(half, flows)), daemon=True
            )
            starter.start()
            time.sleep(outage / 2)
            faults(sim, {"mode": "hang", "seconds": settings.gateway.timeout + 5})
            time.sleep(outage / 2)
            faults(sim, None)
            ended = time.monotonic()
            starter.join()
            wait_until(lambda: all(engine.get(f).state in STOPPED for f in ids), timeout=1800, what="every flow to stop")
            drained = time.monotonic() - ended
            return report(engine, sim, ids, ended - began, drained)
        finally:
            dispatcher.stop()
            runtime.close()
    finally:
        procs.stop()
        server.stop()


def report(engine: Any, sim: str, ids: list[str], outage: float, drained: float) -> dict[str, Any]:
    records = [engine.get(f) for f in ids]
    histories = [engine.history(f) for f in ids]
    retried = [sum("will be retried" in (e.get("what") or "") for e in h) for h in histories]
    deferred = [sum("gateway unavailable" in (e.get("what") or "") for e in h) for h in histories]
    operations = httpx.get(sim + "/_sim/operations", timeout=30).json()["operations"]
    executed = Counter(
        op.get("orderId") for op in operations if op.get("operationResult") == "EXECUTED" and op.get("operationType") != "REFUND"
    )
    events = [event.type for event, _ in engine.events(types=["gateway.unavailable", "gateway.recovered"])]
    reasons = Counter((r.outcome or {}).get("reason", "") for r in records if r.state is not FlowState.SUCCEEDED)
    return {
        "flows": len(ids),
        "outage_seconds": round(outage, 1),
        "drained_seconds": round(drained, 1),
        "states": {str(state): n for state, n in Counter(r.state for r in records).items()},
        "reasons": dict(reasons),
        "charged_twice": sum(1 for n in executed.values() if n > 1),
        "attempts_used_max": max(retried),
        "attempts_used_mean": round(sum(retried) / len(retried), 2),
        "deferrals_max": max(deferred),
        "deferrals_mean": round(sum(deferred) / len(deferred), 2),
        "events": events,
        "gate": engine.gate.status().counters,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=500)
    parser.add_argument("--outage-seconds", type=float, default=150.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bound", type=float, default=None, help="DURAPAY_GATEWAY_HEALTH__OUTAGE_SECONDS (default 3600)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.flows, args.outage_seconds, args.workers, args.bound)
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
