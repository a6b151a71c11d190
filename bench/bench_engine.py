"""Engine benchmarks: durable 3-step flows against bare Celery chains making the same gateway calls.

Run: ``.venv/bin/python -m bench.bench_engine`` (about ten minutes with the defaults). Everything is
measured in this run, on one private Valkey (``appendfsync always`` as durapay's own runs, or
``--appendfsync everysec``: then starts and money claims wait for ``WAITAOF``), one simulator process and the
same worker settings, and printed as ratios; never a timed assertion (machines are shared and noisy):

* **throughput**: ``--rounds`` rounds of ``--flows`` flows each with 20 ms gateway latency, one worker
  process (threads ``-c 32``), the flows sent from ``SENDERS`` threads on both sides (a durable
  start waits for its fsync: one thread starting them all timed the starts, not the engine). Bare and
  durable alternate (A B, then B A, ...), so drift in the machine's
  load falls on both; the median ratio and its spread are printed, and how many rounds it would take
  for the spread to be smaller than the gap to the target;
* **latency**: one flow at a time, bare and durable alternating, median of ``--latency-flows``, at
  each ``--latency-gateway-ms`` (0: the gateway answers at once, so durability's own round trips show
  whole; 20: a gateway as slow as in the throughput rounds, what a merchant's flow sees). Each is
  timed from this process's clock before the start to the end's stamp by the worker: a bare chain's
  ``time.time()`` before its last write, a durable flow's completion time (``updated``, the worker's
  ``ServerClock``). On one host the two clocks agree to a few microseconds; until d58ceaa a fresh
  worker's ``ServerClock`` ran ahead by up to a millisecond or more (its first ``TIME`` also opened
  the connection), which the durable side's figures before it carried;
* **worker CPU** per flow, durable and bare, from the worker processes' own CPU time (``/proc``), and
  what durability costs per step beyond the bare task;
* **the store per flow**, durable and bare, from the server's own counters over each batch
  (``bench/_server_cost.py``): Valkey CPU, commands by name (a script's calls among them), reads (the
  round trips), bytes appended to the AOF; and issue 39's targets (``--broker-fsync``: Celery's broker on
  a Valkey of its own, so that the store's figures are durapay's records alone, the broker's printed apart);
* **Redis memory per finished flow**, everything it keeps (record, log, indexes, order lookups, its
  events): the server's ``used_memory`` grown over a batch, per flow; and its parts, by key;
* **events**: durable throughput with merchant events off, on, and on with one webhook endpoint
  subscribed to every event (a receiver in this process on 127.0.0.1, signatures checked with the
  ``standardwebhooks`` package; the durable worker delivers), each against events off, and the last
  against bare chains run in the same round (``--event-rounds``); with the time until every event of
  the batch was delivered.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import threading
import time
from pathlib import Path
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
from bench._server_cost import ServerCost, ServerCounters
from bench._webhook_receiver import WebhookReceiver
from durapay.service.runtime import build_runtime
from durapay.workflows.engine import Dispatcher, FlowState

_orders = itertools.count()
#: Targets of the issue this benchmark reports against.
THROUGHPUT_TARGET = 0.95
LATENCY_TARGET = 1.02
MEMORY_TARGET = 2048
#: The store's cost per 3-step flow on one node (issue 39).
STORE_CPU_TARGET_MS = 0.5
STORE_COMMANDS_TARGET = 25
#: A flow's end states (the durable batch's wait counts them).
ENDS = ("succeeded", "failed", "cancelled", "needs_attention")
#: Threads sending the flows of a throughput round, on both sides.
SENDERS = 4
#: Durable flows with events and one webhook endpoint against bare chains (issue 12).
WEBHOOK_TARGET = 0.85


def body() -> dict[str, Any]:
    # Never thirteen digits in a row: a run of digits that passes the Luhn check is refused as card data.
    order_id = f"b{time.time_ns() % 10**9}x{next(_orders)}"
    return {
        "order": {"orderId": order_id, "amount": "1000", "currency": "EUR"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
    }


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and every live descendant (a prefork pool)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    family = {pid}
    grew = True
    while grew:
        more = {child for child, parent in parents.items() if parent in family} - family
        grew = bool(more)
        family |= more
    return sum(times.get(member, 0.0) for member in family)


class Bench:
    def __init__(
        self,
        pool: str,
        concurrency: int,
        appendfsync: str = "always",
        limiter_rate: float = 2000.0,
        broker_fsync: str | None = None,
    ) -> None:
        self.limiter_rate = limiter_rate
        self.procs = Processes()
        self.server = valkey(appendfsync)
        #: ``--broker-fsync``: Celery's broker on a Valkey of its own (the store then holds durapay's records
        #: only, and its counters say what the records cost, apart from the queues'); None: on the store's.
        self.broker_server = valkey(broker_fsync) if broker_fsync else None
        self.broker_redis = redis.Redis.from_url(self.broker_server.url) if self.broker_server else None
        self.sim = start_simulator(self.procs)
        settings = bench_settings(self.sim, self.server.url)
        if self.broker_server is not None:
            settings = settings.model_copy(update={"broker_url": self.broker_server.url})
        self.settings = settings.model_copy(update={"webhooks": settings.webhooks.model_copy(update={"allow_private": True})})
        url = self.server.url
        self.runtimes = {events: build_runtime(with_events(self.settings, events), redis_url=url) for events in (True, False)}
        self.events = True
        self.bare = make_bare_app(self.settings)
        self.redis = redis.Redis.from_url(self.server.url)
        self.webhooks = self.runtimes[True].webhooks
        self.dispatcher = Dispatcher(self.runtimes[True].engine, tickers=[self.webhooks.tick]).start()
        self.receiver = WebhookReceiver().up()
        self.endpoint: Any = None
        self.subscribed_at = 0
        self.pool, self.concurrency = pool, concurrency
        self.durable: Any = None
        self.bare_worker: Any = None
        #: Polls of the bench's own waits, and what the server spent on the last batch beside them (and the
        #: broker's own server, when it has one).
        self.polls = 0
        self.cost: ServerCost | None = None
        self.broker_cost: ServerCost | None = None
        self.start_workers(pool, concurrency)

    @property
    def engine(self) -> Any:
        return self.runtimes[self.events].engine

    def start_workers(self, pool: str, concurrency: int, *, events: bool = True) -> None:
        for worker in (self.durable, self.bare_worker):
            if worker is not None:
                worker.terminate()
                worker.wait(timeout=30)
        self.pool, self.concurrency, self.events = pool, concurrency, events
        env = child_env(self.settings) | {"DURAPAY_EVENTS__ENABLED": "true" if events else "false"}
        env["DURAPAY_WEBHOOKS__ALLOW_PRIVATE"] = "true"
        # The gateway's shared limiter (workflows.engine.gate) on, at a rate above what the rounds reach: its cost,
        # not its throttling, is measured (0: the limiter off).
        env["DURAPAY_GATEWAY_HEALTH__LIMITER"] = "true" if self.limiter_rate > 0 else "false"
        env["DURAPAY_GATEWAY_HEALTH__RATE_PER_SECOND"] = str(self.limiter_rate or 1)
        env["DURAPAY_GATEWAY_HEALTH__BURST"] = str(max(1, int(self.limiter_rate)))
        self.durable = self.procs.spawn("durable-worker", DURABLE_WORKER, env, pool, str(concurrency))
        self.bare_worker = self.procs.spawn("bare-worker", BARE_WORKER, env, pool, str(concurrency))
        # Both workers answer before timing starts: one flow and one chain each.
        self.durable_once()
        self.bare_once()

    def subscribe(self, on: bool) -> None:
        """One endpoint subscribed to every event (on), or none."""
        if on and self.endpoint is None:
            self.subscribed_at = self.event_count()
            self.endpoint = self.webhooks.endpoints.add(self.receiver.url)
            self.receiver.secrets = [self.endpoint.secret]
        elif not on and self.endpoint is not None:
            self.webhooks.endpoints.remove(self.endpoint.id)
            self.endpoint = None

    def event_count(self) -> int:
        pipe = self.redis.pipeline(transaction=False)
        for key in self.webhooks.feed.streams().values():
            pipe.xlen(key)
        return sum(int(n) for n in pipe.execute())

    def delivered(self, started: float) -> float:
        """Seconds from ``started`` until every event since the subscription was delivered."""
        wanted = self.event_count() - self.subscribed_at
        wait_until(lambda: len(self.receiver.applied) >= wanted and self.webhooks.pending() == 0, 900, "every webhook")
        return time.time() - started

    def close(self) -> None:
        self.receiver.down()
        self.dispatcher.stop()
        self.procs.stop()
        for runtime in self.runtimes.values():
            runtime.close()
        self.server.stop()
        if self.broker_server is not None:
            self.broker_server.stop()

    def broker_counters(self) -> ServerCounters | None:
        return ServerCounters.read(self.broker_redis) if self.broker_redis is not None else None

    def broker_between(self, before: ServerCounters | None, items: int) -> None:
        """What the broker's own server spent over a batch, per item (the bench polls only the store)."""
        after = self.broker_counters()
        self.broker_cost = ServerCost.between(before, after, items, {}, 0) if before and after else None

    def durable_once(self) -> float:
        """One flow, timed from before its start to its completion's own timestamp. The end is awaited
        like the bare side's (``BLPOP``): blocked on the merchant event its completion writes
        (``XREAD BLOCK``), not by polling the record, whose reads would take the CPU the flow needs."""
        engine = self.engine
        streams = [engine.keys.events(partition) for partition in range(engine.keys.partitions)]
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            pipe.xrevrange(stream, count=1)
        after = {stream: (last[0][0] if last else b"0-0") for stream, last in zip(streams, pipe.execute(), strict=True)}
        started = time.time()
        record = engine.start("three_steps", body())
        if self.events:
            stream = engine.keys.events(engine.keys.partition(record.id))
            self._await_end(stream, after[stream], record.id)
        done = wait_until(lambda: self._finished(record.id), 60, "a durable flow")
        return float(done.updated - started)

    def _await_end(self, stream: str, after: bytes, flow_id: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            answer: Any = self.redis.xread({stream: after}, block=60_000)
            for _, entries in answer or []:
                for entry_id, fields in entries:
                    after = entry_id
                    event = json.loads(fields[b"e"])
                    if event["flow"] == flow_id and event["type"] != "flow.created":
                        return
        raise TimeoutError(f"no end event for {flow_id} within 60s")

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

    def durable_batch(self, flows: int) -> tuple[float, float, list[str]]:
        """(seconds, worker CPU seconds, flow ids) of ``flows`` durable flows started at once."""
        ended_before = self._ended()
        cpu = tree_cpu(self.durable.pid)
        polls, counters, broker = self.polls, ServerCounters.read(self.redis), self.broker_counters()
        started = time.time()
        batches: list[list[str]] = [[] for _ in range(SENDERS)]

        def start_some(batch: list[str]) -> None:  # as many senders as the bare side: starts come at once
            batch.extend(self.engine.start("three_steps", body()).id for _ in range(flows // SENDERS))

        senders = [threading.Thread(target=start_some, args=(batch,)) for batch in batches]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        ids = [flow_id for batch in batches for flow_id in batch]
        flows = len(ids)

        # Awaited as cheaply as the bare side's LLEN: the sizes of the state indexes, not the records
        # (reading a thousand records every few milliseconds took the CPU the worker needed).
        wait_until(lambda: self._ended() - ended_before >= flows, 900, "the durable batch")
        watched = {"zcard": (self.polls - polls) * self.engine.keys.partitions * len(ENDS)}
        self.cost = ServerCost.between(counters, ServerCounters.read(self.redis), flows, watched, self.polls - polls)
        self.broker_between(broker, flows)
        records = self.engine.store.many(ids)
        if any(record.state is not FlowState.SUCCEEDED for record in records):
            raise RuntimeError(f"benchmark flows ended {sorted({record.state.value for record in records})}")
        last = max(record.updated for record in records)
        return last - started, tree_cpu(self.durable.pid) - cpu, ids

    def _ended(self) -> int:
        """Flows of this engine that reached an end state, from its state indexes (one round trip)."""
        keys = self.engine.keys
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(keys.partitions):
            for state in ENDS:
                pipe.zcard(keys.by_state(partition, state))
        self.polls += 1
        return sum(pipe.execute())

    def bare_batch(self, flows: int) -> tuple[float, float]:
        """(seconds, worker CPU seconds) of ``flows`` bare chains sent at once."""
        self.redis.delete(DONE)
        cpu = tree_cpu(self.bare_worker.pid)
        polls, counters, broker = self.polls, ServerCounters.read(self.redis), self.broker_counters()
        started = time.time()

        def send_some() -> None:
            for _ in range(flows // SENDERS):
                bare_chain(self.bare, body())

        senders = [threading.Thread(target=send_some) for _ in range(SENDERS)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        wait_until(lambda: self._done() >= flows - flows % SENDERS, 900, "the bare batch")
        self.cost = ServerCost.between(
            counters, ServerCounters.read(self.redis), flows, {"llen": self.polls - polls}, self.polls - polls
        )
        self.broker_between(broker, flows)
        last = max(float(item.split()[1]) for item in self.redis.lrange(DONE, 0, -1))
        return last - started, tree_cpu(self.bare_worker.pid) - cpu

    def _done(self) -> int:
        """Bare chains finished (one LLEN, counted: the server's figures leave the bench's polls out)."""
        self.polls += 1
        return int(self.redis.llen(DONE))

    def memory_parts(self, ids: list[str]) -> dict[str, float]:
        """Mean bytes per finished flow of its own keys (sample of 200): record, log, order lookups."""
        sample = ids[:200]
        keys = self.engine.keys
        parts = {"record": 0.0, "log": 0.0, "order lookups": 0.0}
        for flow_id in sample:
            record = self.engine.get(flow_id)
            parts["record"] += int(self.redis.memory_usage(keys.flow(flow_id), samples=0) or 0)
            parts["log"] += int(self.redis.memory_usage(keys.log(flow_id), samples=0) or 0)
            for order_id in record.orders:
                parts["order lookups"] += int(self.redis.memory_usage(keys.order(order_id), samples=0) or 0)
                parts["order lookups"] += int(self.redis.memory_usage(keys.tokens(order_id), samples=0) or 0)
        return {name: total / len(sample) for name, total in parts.items()}


def with_events(settings: Any, enabled: bool) -> Any:
    return settings.model_copy(update={"events": settings.events.model_copy(update={"enabled": enabled})})


def used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def rounds_needed(ratios: list[float], target: float) -> str:
    """How many rounds make the 95% interval of the median ratio narrower than its gap to the target."""
    if len(ratios) < 3:
        return "n/a (fewer than 3 rounds)"
    gap = abs(statistics.median(ratios) - target)
    spread = statistics.stdev(ratios)
    if gap == 0:
        return "unbounded (the median sits on the target)"
    return str(max(len(ratios), math.ceil((1.96 * spread / gap) ** 2)))


def throughput(
    bench: Bench,
    rounds: int,
    flows: int,
    costs: list[tuple[ServerCost, ServerCost]],
    broker_costs: list[tuple[ServerCost, ServerCost]] | None = None,
) -> tuple[list[float], list[dict[str, float]], list[str]]:
    """Alternating rounds; returns the ratios, each round's figures, and the last durable batch's ids;
    appends each round's store cost per flow (bare, durable) to ``costs``, and the broker's own server's
    to ``broker_costs`` when it has one."""
    ratios: list[float] = []
    rows: list[dict[str, float]] = []
    ids: list[str] = []
    for n in range(rounds):
        bare_first = n % 2 == 0
        if bare_first:
            bare_seconds, bare_cpu = bench.bare_batch(flows)
            bare_cost, bare_broker = bench.cost, bench.broker_cost
            durable_seconds, durable_cpu, ids = bench.durable_batch(flows)
            durable_cost, durable_broker = bench.cost, bench.broker_cost
        else:
            durable_seconds, durable_cpu, ids = bench.durable_batch(flows)
            durable_cost, durable_broker = bench.cost, bench.broker_cost
            bare_seconds, bare_cpu = bench.bare_batch(flows)
            bare_cost, bare_broker = bench.cost, bench.broker_cost
        assert bare_cost is not None and durable_cost is not None
        costs.append((bare_cost, durable_cost))
        if broker_costs is not None and bare_broker is not None and durable_broker is not None:
            broker_costs.append((bare_broker, durable_broker))
        row = {
            "bare": flows / bare_seconds,
            "durable": flows / durable_seconds,
            "bare_cpu": bare_cpu / flows,
            "durable_cpu": durable_cpu / flows,
        }
        rows.append(row)
        ratios.append(row["durable"] / row["bare"])
        order = "bare, durable" if bare_first else "durable, bare"
        print(
            f"  round {n + 1} ({order}): bare {row['bare']:.1f} flows/s, durable {row['durable']:.1f} flows/s, "
            f"ratio {ratios[-1]:.3f}; worker CPU per flow bare {row['bare_cpu'] * 1000:.2f} ms, "
            f"durable {row['durable_cpu'] * 1000:.2f} ms"
        )
        print(f"    the store per flow, bare:    {bare_cost.line()}")
        print(f"    the store per flow, durable: {durable_cost.line()}")
        if bare_broker is not None and durable_broker is not None:
            print(f"    the broker per flow, bare:    {bare_broker.line()}")
            print(f"    the broker per flow, durable: {durable_broker.line()}")
    return ratios, rows, ids


def store_summary(costs: list[tuple[ServerCost, ServerCost]], what: str = "the store") -> None:
    """The medians over the rounds of what the server spent per flow, each side, and the targets (the
    store's: ``what`` is the broker's own server otherwise, printed without them)."""
    for label, side in (("bare", 0), ("durable", 1)):
        cpu = statistics.median(pair[side].cpu_ms for pair in costs)
        commands = statistics.median(pair[side].commands for pair in costs)
        reads = statistics.median(pair[side].reads for pair in costs)
        aofs = [grown for pair in costs if (grown := pair[side].aof_bytes) is not None]
        aof = f"{statistics.median(aofs):,.0f} B" if aofs else "n/a"
        print(
            f"  {what} per flow, {label} (median): Valkey CPU {cpu:.3f} ms, commands {commands:.1f}, reads {reads:.1f}, AOF {aof}"
        )
    if what != "the store":
        return
    durable_cpu = statistics.median(pair[1].cpu_ms for pair in costs)
    durable_commands = statistics.median(pair[1].commands for pair in costs)
    print(
        f"  store targets: Valkey CPU per 3-step flow <= {STORE_CPU_TARGET_MS} ms: "
        f"{'ok' if durable_cpu <= STORE_CPU_TARGET_MS else 'ABOVE TARGET'}; commands <= {STORE_COMMANDS_TARGET}: "
        f"{'ok' if durable_commands <= STORE_COMMANDS_TARGET else 'ABOVE TARGET'}"
    )


def summary(name: str, ratios: list[float], target: float, above: bool) -> None:
    verdict = (
        ("ok" if statistics.median(ratios) >= target else "BELOW TARGET")
        if above
        else ("ok" if statistics.median(ratios) <= target else "ABOVE TARGET")
    )
    sign = ">=" if above else "<="
    print(
        f"  {name}: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
        f"spread {max(ratios) - min(ratios):.3f}) target {sign} {target}: {verdict}; "
        f"rounds for a spread below the gap to target: {rounds_needed(ratios, target)}"
    )


def events_rows(bench: Bench, rounds: int, flows: int, pool: str, concurrency: int) -> None:
    """Events off, on, and on with one endpoint, in rotating order each round; and bare chains."""
    print(f"events: {rounds} rounds of {flows} flows: events off, on, on + one webhook endpoint; bare chains:")
    modes = ("off", "on", "webhook")
    ratios: dict[str, list[float]] = {"on": [], "webhook": [], "webhook_bare": []}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    for n in range(rounds):
        rates: dict[str, float] = {}
        lag = 0.0
        for mode in modes[n % 3 :] + modes[: n % 3]:
            bench.start_workers(pool, concurrency, events=mode != "off")
            bench.subscribe(mode == "webhook")
            started, before = time.time(), tree_cpu(bench.durable.pid)
            seconds, _, _ = bench.durable_batch(flows)
            rates[mode] = flows / seconds
            if mode == "webhook":
                lag = bench.delivered(started) - seconds
                bench.subscribe(False)
            cpu[mode].append((tree_cpu(bench.durable.pid) - before) / flows)
        bare_seconds, _ = bench.bare_batch(flows)
        rates["bare"] = flows / bare_seconds
        ratios["on"].append(rates["on"] / rates["off"])
        ratios["webhook"].append(rates["webhook"] / rates["off"])
        ratios["webhook_bare"].append(rates["webhook"] / rates["bare"])
        print(
            f"  round {n + 1}: off {rates['off']:.1f}, on {rates['on']:.1f}, on + endpoint {rates['webhook']:.1f}, "
            f"bare {rates['bare']:.1f} flows/s; every event delivered {lag:.2f} s after the last flow finished"
        )
    per_flow = {mode: statistics.median(values) * 1000 for mode, values in cpu.items()}
    print(
        f"  worker CPU per flow (deliveries included): off {per_flow['off']:.2f} ms, on {per_flow['on']:.2f} ms, "
        f"on + endpoint {per_flow['webhook']:.2f} ms"
    )
    print(f"  events on / off: median {statistics.median(ratios['on']):.3f}")
    print(f"  events on + one endpoint / off: median {statistics.median(ratios['webhook']):.3f}")
    summary("durable with events and one endpoint / bare", ratios["webhook_bare"], WEBHOOK_TARGET, above=True)
    print(f"  repeats seen by the receiver: {bench.receiver.repeats}; signatures refused: {bench.receiver.refused}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-flows", type=int, default=200)
    parser.add_argument("--flows", type=int, default=1000, help="flows per throughput round")
    parser.add_argument("--rounds", type=int, default=6, help="throughput rounds (bare and durable alternate)")
    parser.add_argument("--event-rounds", type=int, default=2, help="rounds of events on against off (0: skip)")
    parser.add_argument(
        "--latency-gateway-ms",
        type=int,
        nargs="+",
        default=[0, 20],
        help="gateway latencies to measure the latency at (0: durability's own time shows whole; 20: as the throughput rounds)",
    )
    parser.add_argument("--latency-pool", default="prefork")
    parser.add_argument("--latency-concurrency", type=int, default=2)
    parser.add_argument("--throughput-pool", default="threads")
    parser.add_argument("--throughput-concurrency", type=int, default=32)
    parser.add_argument("--appendfsync", choices=("always", "everysec"), default="always", help="the Valkey's AOF fsync")
    parser.add_argument(
        "--broker-fsync",
        choices=("always", "everysec", "no"),
        default=None,
        help="Celery's broker on a private Valkey of its own with this AOF fsync (default: on the store's Valkey); "
        "the store's figures are then durapay's records alone, the broker's printed apart",
    )
    parser.add_argument(
        "--limiter-rate", type=float, default=2000.0, help="the durable worker's shared gateway rate limit, calls/s (0: off)"
    )
    args = parser.parse_args()

    bench = Bench(args.latency_pool, args.latency_concurrency, args.appendfsync, args.limiter_rate, args.broker_fsync)
    print(f"gateway limiter: {f'{args.limiter_rate:g} calls/s' if args.limiter_rate > 0 else 'off'}")
    print(f"Valkey appendfsync {args.appendfsync}")
    if args.broker_fsync:
        print(f"the broker on a Valkey of its own, appendfsync {args.broker_fsync}")
    try:
        for gateway_ms in args.latency_gateway_ms:
            set_latency(bench.sim, gateway_ms)
            print(
                f"latency, {args.latency_flows} flows each, {gateway_ms} ms gateway latency, "
                f"{args.latency_pool} -c {args.latency_concurrency}, alternating:"
            )
            durable, bare = bench.latency(args.latency_flows)
            d, b = median(durable), median(bare)
            print(f"  durable median {d * 1000:.1f} ms (p90 {percentile(durable, 0.9) * 1000:.1f} ms)")
            print(f"  bare    median {b * 1000:.1f} ms (p90 {percentile(bare, 0.9) * 1000:.1f} ms)")
            halves = [median(durable[i::4]) / median(bare[i::4]) for i in range(4)]
            name = f"latency durable / bare, {gateway_ms} ms gateway (four interleaved quarters)"
            summary(name, halves, LATENCY_TARGET, above=False)

        bench.start_workers(args.throughput_pool, args.throughput_concurrency)
        set_latency(bench.sim, 20)
        print(
            f"throughput, {args.rounds} rounds of {args.flows} flows, 20 ms gateway latency, "
            f"{args.throughput_pool} -c {args.throughput_concurrency}:"
        )
        before = used_memory(bench.redis)
        costs: list[tuple[ServerCost, ServerCost]] = []
        broker_costs: list[tuple[ServerCost, ServerCost]] = []
        ratios, rows, ids = throughput(bench, args.rounds, args.flows, costs, broker_costs)
        summary("throughput durable / bare", ratios, THROUGHPUT_TARGET, above=True)
        store_summary(costs)
        if broker_costs:
            store_summary(broker_costs, "the broker's own server")
        bare_cpu = statistics.median(row["bare_cpu"] for row in rows)
        durable_cpu = statistics.median(row["durable_cpu"] for row in rows)
        steps = 2  # init and payment (validation and settle are skipped for a frictionless card)
        print(
            f"  worker CPU per flow: bare {bare_cpu * 1000:.2f} ms, durable {durable_cpu * 1000:.2f} ms; "
            f"durability costs {(durable_cpu - bare_cpu) * 1000 / steps:.2f} ms per step beyond the bare task"
        )

        # Memory: everything the flows left behind (records, logs, indexes, lookups, events) over the
        # durable batches, per flow; the bare chains leave nothing but their finish times (deleted).
        bench.redis.delete(DONE)
        grown = (used_memory(bench.redis) - before) / (args.rounds * args.flows)
        parts = bench.memory_parts(ids)
        listed = ", ".join(f"{name} {size:.0f}" for name, size in parts.items())
        verdict = "ok" if grown <= MEMORY_TARGET else "ABOVE TARGET"
        print(
            f"memory per finished flow, everything it keeps: {grown:.0f} bytes (target <= {MEMORY_TARGET}: {verdict}); "
            f"its own keys: {listed}; the rest: indexes and its events"
        )

        if args.event_rounds:
            events_rows(bench, args.event_rounds, args.flows, args.throughput_pool, args.throughput_concurrency)
    finally:
        bench.close()


if __name__ == "__main__":
    main()
