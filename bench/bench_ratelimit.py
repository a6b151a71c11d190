"""A 429 storm: the gateway's own rate limit met by a burst of flows, with the shared limiter on and off.

Run: ``.venv/bin/python -m bench.bench_ratelimit`` (about three minutes with the defaults). A private Valkey,
the simulator (its ``throttle`` fault: beyond ``--gateway-rate`` calls a second (10), a bucket of
``--gateway-burst`` (5), every call is answered 429 with ``Retry-After: 1``: a gateway slower than the
worker on a loaded machine, so that the storm does not depend on the machine's speed) and one durable worker process
(threads ``-c 32``), with the default retry settings. Each round starts ``--flows`` MOTO flows at once (200)
(started as delayed starts due at one moment: the 09:00 batch of MIT charges, or a backlog after an
outage) and waits until every one has finished;
rounds alternate limiter off and on (``DURAPAY_GATEWAY_HEALTH__LIMITER``, the limiter's rate
``--rate``, a little under the gateway's: 8, burst 4), each on a fresh key prefix and a fresh throttle bucket, so
that drift in the machine's load falls on both.

Printed: per round and in total, the 429s the gateway answered per 1,000 flows (the throttle rule's count:
the same number the workers saw), the flows' states, and the time to finish the batch; and the ratio
off / on, which must be at least 10 (issue 28). No timed assertion: figures, as the other benches.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections import Counter
from typing import Any

import httpx

from bench._harness import DURABLE_WORKER, Processes, bench_settings, child_env, start_simulator, valkey, wait_until
from durapay.service.runtime import build_runtime
from durapay.workflows.engine import STOPPED, Dispatcher

APPROVE = "4349940199004549"
_ids = itertools.count()


def moto() -> dict[str, Any]:
    order = {"orderId": f"r{int(time.time()) % 100000}x{next(_ids)}", "amount": "1500", "currency": "EUR"}
    return {"order": order, "card": {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"}}


def one_round(sim: str, redis_url: str, prefix: str, flows: int, limiter: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One batch of flows against a fresh throttle bucket; the 429s it met and how it ended."""
    httpx.delete(sim + "/_sim/faults", timeout=5).raise_for_status()
    rule = {"mode": "throttle", "per_second": args.gateway_rate, "burst": args.gateway_burst, "retry_after": 1}
    httpx.post(sim + "/_sim/faults", json=rule, timeout=5).raise_for_status()
    procs = Processes()
    settings = bench_settings(sim, redis_url, prefix=prefix)
    env = child_env(settings) | {
        "DURAPAY_GATEWAY_HEALTH__LIMITER": "true" if limiter else "false",
        "DURAPAY_GATEWAY_HEALTH__RATE_PER_SECOND": str(args.rate),
        "DURAPAY_GATEWAY_HEALTH__BURST": str(args.burst),
    }
    procs.spawn(f"worker-{prefix}", DURABLE_WORKER, env, "threads", "32")
    runtime = build_runtime(settings, redis_url=redis_url)
    engine = runtime.engine
    dispatcher = Dispatcher(engine, interval=0.1)
    dispatcher.start()
    try:
        # Every flow due at one moment (a delayed start, as schedules' occurrences at 09:00): the dispatcher
        # sends them together once they are all written.
        at = time.time() + 5 + flows * 0.05
        ids = [engine.start("moto", moto(), run_at=at).id for _ in range(flows)]
        time.sleep(max(0.0, at - time.time()))
        began = time.monotonic()
        wait_until(lambda: all(engine.get(f).state in STOPPED for f in ids), timeout=1800, what="the batch to stop")
        seconds = time.monotonic() - began
        fired = httpx.get(sim + "/_sim/faults", timeout=5).json()["rules"][0]["fired"]
        states = Counter(str(engine.get(f).state) for f in ids)
        return {
            "limiter": limiter,
            "flows": flows,
            "429s": fired,
            "per_1000": round(fired * 1000 / flows, 1),
            "seconds": round(seconds, 1),
            "states": dict(states),
        }
    finally:
        dispatcher.stop()
        runtime.close()
        procs.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of rounds (off, on)")
    parser.add_argument("--gateway-rate", type=float, default=10.0, help="the simulator's own limit, calls a second")
    parser.add_argument("--gateway-burst", type=int, default=5)
    parser.add_argument("--rate", type=float, default=8.0, help="DURAPAY_GATEWAY_HEALTH__RATE_PER_SECOND")
    parser.add_argument("--burst", type=int, default=4, help="DURAPAY_GATEWAY_HEALTH__BURST")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    procs = Processes()
    server = valkey()
    rounds: list[dict[str, Any]] = []
    try:
        sim = start_simulator(procs)
        for n in range(args.rounds):
            order = (False, True) if n % 2 == 0 else (True, False)
            for limiter in order:
                rounds.append(one_round(sim, server.url, f"rl{n}{int(limiter)}", args.flows, limiter, args))
                if not args.json:
                    print(rounds[-1], flush=True)
    finally:
        procs.stop()
        server.stop()
    off = sum(r["429s"] for r in rounds if not r["limiter"])
    on = sum(r["429s"] for r in rounds if r["limiter"])
    flows = args.flows * args.rounds
    summary = {
        "flows_each_side": flows,
        "per_1000_off": round(off * 1000 / flows, 1),
        "per_1000_on": round(on * 1000 / flows, 1),
        "ratio_off_on": round(off / on, 1) if on else None,
        "seconds_off": sum(r["seconds"] for r in rounds if not r["limiter"]),
        "seconds_on": sum(r["seconds"] for r in rounds if r["limiter"]),
        "rounds": rounds,
    }
    print(json.dumps(summary, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
