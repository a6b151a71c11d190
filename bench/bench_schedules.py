"""Benchmark: N schedules due in the same second; how long until every MIT flow is started?

The scheduler's own cost only: flows are started through ``engine.start`` (validation, the flow record
and its indexes, the order index) but not run (no worker, no sender). Each round uses a fresh key prefix
on one private Valkey (AOF, ``appendfsync everysec``), creates N schedules whose first occurrence is
the same second, moves the clock there and runs ``Schedules.tick`` in ``--schedulers`` processes (each
its own engine and connections, as ``durapay scheduler`` processes are) until every occurrence has its
flow; then checks that there is exactly one flow per schedule.

The baseline, measured in the same run at each size: the same N MIT flows (the start keys and inputs of
the attempts the scheduler just started, read from the schedules) started directly with ``engine.start``
by one process, on a fresh key prefix of the same Valkey, with no schedule involved: the floor the
scheduler cannot go below, since it starts every flow the same way.

Prints the time and the per-item cost at each size, the scheduler's cost over the baseline's, and the
ratio of the per-item cost at the largest size to the smallest (the issue's metric, target <= 1.5: no
cost growth with the backlog), with the baseline's own ratio beside it. Not a test: machines are noisy.

    .venv/bin/python -m bench.bench_schedules                 # 10,000 and 100,000 (about 5 minutes)
    .venv/bin/python -m bench.bench_schedules --sizes 1000 10000 --schedulers 2
    .venv/bin/python -m bench.bench_schedules --no-baseline
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
from workflows.schedules import MIT_KIND, Attempt, Schedules

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
    return sum(int(client.zcard(engine.keys.by_kind(p, MIT_KIND))) for p in range(engine.keys.partitions))


def _engine(url: str, prefix: str, partitions: int, now: float) -> Engine:
    settings = load_settings({"engine": {"key_prefix": prefix, "partitions": partitions}})
    engine = Engine(settings, redis.Redis.from_url(url), REGISTRY)
    engine.clock = ManualClock(now)
    return engine


def _scheduler(url: str, prefix: str, partitions: int, size: int, now: float) -> None:
    """One scheduler process: tick until every schedule has its flow."""
    engine = _engine(url, prefix, partitions, now)
    schedules = Schedules(engine)
    while started_flows(engine.redis, engine) < size:
        if not schedules.tick():
            time.sleep(0.001)


def _direct(url: str, prefix: str, partitions: int, todo: list[Attempt]) -> None:
    """The baseline process: start every flow with ``engine.start``, no schedules."""
    engine = _engine(url, prefix, partitions, DUE.timestamp())
    for attempt in todo:
        engine.start(MIT_KIND, attempt.data, key=attempt.key)


def baseline(url: str, todo: list[Attempt], partitions: int) -> float:
    """Seconds for one process to start the round's MIT flows directly (see the module docstring)."""
    size = len(todo)
    prefix = "b" + uuid.uuid4().hex[:8]
    child = multiprocessing.get_context("fork").Process(target=_direct, args=(url, prefix, partitions, todo))
    began = time.perf_counter()
    child.start()
    child.join()
    seconds = time.perf_counter() - began
    client = redis.Redis.from_url(url)
    engine = _engine(url, prefix, partitions, DUE.timestamp())
    flows = started_flows(client, engine)
    if child.exitcode or flows != size:
        raise SystemExit(f"baseline: expected {size} flows, found {flows} (exit code {child.exitcode})")
    client.flushdb()
    client.close()
    return seconds


def one_round(url: str, size: int, schedulers: int, partitions: int, with_baseline: bool) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    prefix = "b" + uuid.uuid4().hex[:8]
    engine = _engine(url, prefix, partitions, CREATED)
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
    records = creator.list(limit=size)
    fired = sum(record.counts.get("fired", 0) for record in records)
    todo = [attempt for record in records for attempt in record.open]  # what the scheduler started
    if flows != size or fired != size or any(child.exitcode for child in children):
        raise SystemExit(f"expected {size} flows and occurrences fired, found {flows} and {fired}: one was lost or charged twice")
    client.flushdb()
    client.close()
    row = {"size": size, "create": create_seconds, "fire": fire_seconds, "per_item_us": fire_seconds / size * 1e6}
    if with_baseline:
        row["bare"] = baseline(url, todo, partitions)
        row["bare_us"] = row["bare"] / size * 1e6
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--schedulers", type=int, default=1, help="scheduler processes ticking at once")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--no-baseline", action="store_true", help="skip starting the same flows directly")
    args = parser.parse_args()
    with_baseline = not args.no_baseline
    with tempfile.TemporaryDirectory(prefix="durapay-bench-") as folder, EmbeddedValkey(Path(folder)) as valkey:
        results = [one_round(valkey.url, size, args.schedulers, args.partitions, with_baseline) for size in sorted(args.sizes)]
    print(f"schedules due in the same second, {args.schedulers} scheduler(s), {args.partitions} partitions")
    header = f"{'due':>9}  {'create (s)':>10}  {'all started (s)':>15}  {'per item (us)':>13}  {'flows/s':>8}"
    if with_baseline:
        header += f"  {'baseline (s)':>12}  {'baseline/item (us)':>18}  {'x baseline':>10}"
    print(header)
    for row in results:
        rate = row["size"] / row["fire"]
        line = f"{row['size']:>9,.0f}  {row['create']:>10.1f}  {row['fire']:>15.2f}  {row['per_item_us']:>13.0f}  {rate:>8,.0f}"
        if with_baseline:
            line += f"  {row['bare']:>12.2f}  {row['bare_us']:>18.0f}  {row['fire'] / row['bare']:>10.2f}"
        print(line)
    if with_baseline:
        print("baseline: the same flows started with engine.start by one process, no schedules (same run, same Valkey)")
    if len(results) > 1:
        first, last = results[0], results[-1]
        ratio = last["per_item_us"] / first["per_item_us"]
        verdict = "ok" if ratio <= 1.5 else "ABOVE TARGET"
        sizes = f"{last['size']:,.0f} / at {first['size']:,.0f}"
        print(f"per-item cost at {sizes}: {ratio:.2f} (target <= 1.5: {verdict})")
        if with_baseline:
            print(f"baseline per-item cost at {sizes}: {last['bare_us'] / first['bare_us']:.2f}")


if __name__ == "__main__":
    main()
