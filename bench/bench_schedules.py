"""Benchmark: N schedules due in the same second; how long until every MIT flow is started?

The scheduler's own cost only: flows are started through ``engine.start`` (validation, the flow record
and its indexes, the order index) but not run (no worker, no sender). Each round uses a fresh key prefix
on one private Valkey (AOF, ``appendfsync everysec``), creates N schedules whose first occurrence is
the same second, moves the clock there and runs ``Schedules.tick`` in ``--schedulers`` processes (each
its own engine and connections, as ``durapay scheduler`` processes are) until every occurrence has its
flow; then checks that there is exactly one flow per schedule.

Prints the time and the per-item cost at each size, and the ratio of the per-item cost at the largest
size to the smallest (target <= 1.5: no cost growth with the backlog). Not a test: machines are noisy.

    .venv/bin/python -m bench.bench_schedules                 # 10,000 and 100,000
    .venv/bin/python -m bench.bench_schedules --sizes 2000 20000 --schedulers 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import redis

from config import load_settings
from config.embedded import EmbeddedValkey
from workflows.clock import ManualClock
from workflows.engine import Engine
from workflows.flows import REGISTRY
from workflows.schedules import Schedules

CREATED = datetime(2030, 1, 1, tzinfo=UTC).timestamp()
DUE = datetime(2030, 1, 31, 9, 0, tzinfo=UTC)


def spec(n: int) -> dict[str, object]:
    return {
        "contractId": f"ctr-{n}",
        "amount": 1990,
        "currency": "EUR",
        "description": "Monthly plan",
        "rule": {"every": "month", "day": 31},
        "timezone": "UTC",
        "start": DUE.isoformat(),
    }


def started_flows(client: redis.Redis, engine: Engine) -> int:
    return sum(int(client.zcard(engine.keys.by_kind(p, "mit"))) for p in range(engine.keys.partitions))


def _scheduler(url: str, prefix: str, partitions: int, size: int, now: float) -> None:
    """One scheduler process: tick until every schedule has its flow."""
    engine = Engine(
        load_settings({"engine": {"key_prefix": prefix, "partitions": partitions}}), redis.Redis.from_url(url), REGISTRY
    )
    engine.clock = ManualClock(now)
    schedules = Schedules(engine)
    while started_flows(engine.redis, engine) < size:
        if not schedules.tick():
            time.sleep(0.001)


def one_round(url: str, size: int, schedulers: int, partitions: int) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    prefix = "b" + uuid.uuid4().hex[:8]
    engine = Engine(load_settings({"engine": {"key_prefix": prefix, "partitions": partitions}}), client, REGISTRY)
    engine.clock = ManualClock(CREATED)
    creator = Schedules(engine)
    began = time.perf_counter()
    for n in range(size):
        creator.create(spec(n), key=f"bench-{n}")
    create_seconds = time.perf_counter() - began

    context = multiprocessing.get_context("fork")
    children = [
        context.Process(target=_scheduler, args=(url, prefix, partitions, size, DUE.timestamp())) for _ in range(schedulers)
    ]
    began = time.perf_counter()
    for child in children:
        child.start()
    for child in children:
        child.join()
    fire_seconds = time.perf_counter() - began
    flows = started_flows(client, engine)
    fired = sum(record.counts.get("fired", 0) for record in creator.list(limit=size))
    if flows != size or fired != size or any(child.exitcode for child in children):
        raise SystemExit(f"expected {size} flows and occurrences fired, found {flows} and {fired}: one was lost or charged twice")
    client.flushdb()
    client.close()
    return {"size": size, "create": create_seconds, "fire": fire_seconds, "per_item_us": fire_seconds / size * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--schedulers", type=int, default=1, help="scheduler processes ticking at once")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="durapay-bench-") as folder, EmbeddedValkey(Path(folder)) as valkey:
        results = [one_round(valkey.url, size, args.schedulers, args.partitions) for size in sorted(args.sizes)]
    print(f"schedules due in the same second, {args.schedulers} scheduler(s), {args.partitions} partitions")
    print(f"{'due':>9}  {'create (s)':>10}  {'all started (s)':>15}  {'per item (us)':>13}  {'flows/s':>8}")
    for row in results:
        rate = row["size"] / row["fire"]
        print(f"{row['size']:>9,.0f}  {row['create']:>10.1f}  {row['fire']:>15.2f}  {row['per_item_us']:>13.0f}  {rate:>8,.0f}")
    if len(results) > 1:
        ratio = results[-1]["per_item_us"] / results[0]["per_item_us"]
        verdict = "ok" if ratio <= 1.5 else "ABOVE TARGET"
        sizes = f"{results[-1]['size']:,.0f} / at {results[0]['size']:,.0f}"
        print(f"per-item cost at {sizes}: {ratio:.2f} (target <= 1.5: {verdict})")


if __name__ == "__main__":
    main()
