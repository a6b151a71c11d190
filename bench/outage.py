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

``--terminals 2`` is issue 40's first acceptance point: two terminals on one simulator, which checks each
terminal's key (``default`` and ``it``); the flows alternate between them, and the outage is ``it``'s only
(its fault rules name the terminal). The same run is made twice, first with no outage, then with it, and
what is printed is per terminal: the healthy terminal's p95 (and p50) from start to end in both runs and
their ratio (must be at most 1.2), its flows deferred or held by a gate (must be 0) and attempts used; the
outage terminal's states (the outage rules: none failed below the bound); orders charged twice (0), and
the keys checked (every order made with its flow's terminal's key, no call refused as another's).
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
from pydantic import SecretStr

from bench._harness import DURABLE_WORKER, Processes, bench_settings, child_env, start_simulator, valkey, wait_until
from durapay.config.settings import TerminalSettings
from durapay.service.runtime import build_runtime
from durapay.workflows.engine import STOPPED, Dispatcher, FlowState

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


def run_terminals(flows: int, outage: float, workers: int, bound: float | None) -> dict[str, Any]:
    """Two terminals, the same flows twice: with no outage, then with ``it``'s; the ratios of the two runs."""
    calm = run(flows, outage, workers, bound, terminals=True, faulty=False)  # the same timeline, no fault
    stormy = run(flows, outage, workers, bound, terminals=True)
    healthy, calm_healthy = stormy["terminals"]["default"], calm["terminals"]["default"]
    return {
        "flows": flows,
        "outage_seconds": stormy["outage_seconds"],
        "healthy_p95_ratio": round(healthy["p95_seconds"] / max(calm_healthy["p95_seconds"], 1e-6), 3),
        "healthy_p50_ratio": round(healthy["p50_seconds"] / max(calm_healthy["p50_seconds"], 1e-6), 3),
        "without_outage": calm,
        "with_outage": stormy,
    }


#: Log entries of a flow kept by a gate (a breaker, a 429 hold or a far slot, Redis before a call).
GATED = ("gateway unavailable", "gateway rate limit", "Redis unreachable before")
IT_KEY = "bench-key-of-terminal-it"


def quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def run(
    flows: int, outage: float, workers: int, bound: float | None, *, terminals: bool = False, faulty: bool = True
) -> dict[str, Any]:
    procs = Processes()
    server = valkey()
    try:
        sim = start_simulator(procs, terminal_keys={IT_KEY: "it"} if terminals else None)
        settings = bench_settings(sim, server.url, prefix="outage")
        if terminals:
            settings = settings.model_copy(update={"terminals": {"it": TerminalSettings(api_key=SecretStr(IT_KEY))}})
        # Alternate terminals (with two), the outage only it's; with one, every flow on default.
        scope = {"terminal": "it"} if terminals else {}

        def begin(n: int) -> str:
            if not terminals:
                return str(engine.start(*flow_input(n)).id)
            return str(engine.start(*flow_input(n // 2), terminal=("default", "it")[n % 2]).id)

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
            if terminals:
                # Warm up first (not counted): the workers' boot would otherwise be in the first flows' times.
                warm = [begin(n) for n in range(-8, 0)]
                wait_until(lambda: all(engine.get(f).state in STOPPED for f in warm), timeout=120, what="the warm-up flows")
            half = flows // 2
            ids = [begin(n) for n in range(half)]
            began = time.monotonic()
            if faulty:
                faults(sim, {"mode": "error", "status": 503, **scope})
            # With two terminals the second half is spread over the outage (a steady trickle, the same in the
            # run without it); with one, started at once as issue 28's run did.
            pace = outage / max(1, flows - half) if terminals else 0.0

            def later() -> None:
                for n in range(half, flows):
                    ids.append(begin(n))
                    if pace:
                        time.sleep(pace)  # the bench's own pacing of starts, not a wait on a condition

            starter = threading.Thread(target=later, daemon=True)
            starter.start()
            time.sleep(outage / 2)
            if faulty:
                faults(sim, {"mode": "hang", "seconds": settings.gateway.timeout + 5, **scope})
            time.sleep(outage / 2)
            faults(sim, None)
            ended = time.monotonic()
            starter.join()
            wait_until(lambda: all(engine.get(f).state in STOPPED for f in ids), timeout=1800, what="every flow to stop")
            drained = time.monotonic() - ended
            result = report(engine, sim, ids, ended - began, drained)
            if terminals:
                result["terminals"] = per_terminal(engine, sim, ids)
            return result
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


def per_terminal(engine: Any, sim: str, ids: list[str]) -> dict[str, Any]:
    """Per terminal: states, p50/p95 from start to end, flows kept by a gate, attempts used; the keys checked."""
    records = [engine.get(f) for f in ids]
    operations = httpx.get(sim + "/_sim/operations", timeout=30).json()["operations"]
    made_by = {op["orderId"]: op.get("terminal", "default") for op in operations}
    shown: dict[str, Any] = {}
    for name in ("default", "it"):
        mine = [r for r in records if r.terminal == name]
        histories = [engine.history(r.id) for r in mine]
        took = [r.updated - r.created for r in mine if r.state is FlowState.SUCCEEDED]
        shown[name] = {
            "flows": len(mine),
            "states": {str(state): n for state, n in Counter(r.state for r in mine).items()},
            "p50_seconds": round(quantile(took, 0.5), 3),
            "p95_seconds": round(quantile(took, 0.95), 3),
            "kept_by_a_gate": sum(any(g in (e.get("what") or "") for g in GATED for e in h) for h in histories),
            "attempts_used": sum(sum("will be retried" in (e.get("what") or "") for e in h) for h in histories),
            "gate": engine.terminals.gate(name).status().counters,
        }
    wrong = sum(1 for r in records if r.order_id in made_by and made_by[r.order_id] != r.terminal)
    shown["orders_made_with_another_terminals_key"] = wrong
    shown["orders_checked"] = sum(1 for r in records if r.order_id in made_by)
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=500)
    parser.add_argument("--outage-seconds", type=float, default=150.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bound", type=float, default=None, help="DURAPAY_GATEWAY_HEALTH__OUTAGE_SECONDS (default 3600)")
    parser.add_argument("--terminals", type=int, choices=(1, 2), default=1, help="2: issue 40's run (see above)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.terminals == 2:
        result = run_terminals(args.flows, args.outage_seconds, args.workers, args.bound)
    else:
        result = run(args.flows, args.outage_seconds, args.workers, args.bound)
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
