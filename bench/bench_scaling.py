"""Scaling benchmark: 3-step flows with 1, 2 and 4 worker processes on 1 and 3 store nodes.

Run: ``.venv/bin/python -m bench.bench_scaling`` (a few minutes). Everything is measured in this run and
printed as ratios against a baseline of the same run (never a timed assertion):

* **throughput** of ``--flows`` 3-step flows (frictionless ``three_steps``: two gateway calls,
  ``--latency`` ms each) started at once, per topology: the store on one Valkey (plain client) or on a
  3-primary Valkey Cluster (``DURAPAY_REDIS_CLUSTER``), with 1, 2 and 4 worker processes (threads pool,
  ``--concurrency`` each); the broker is one plain Valkey in every case (kombu does not run on a
  cluster). Ratios against 1 worker on 1 node. Each cell is the median of ``--rounds`` batches;
* **cluster client cost**: worker CPU seconds per flow (``/proc``) with the plain client on one node,
  the cluster client on a one-node cluster (the same server work: what the client adds) and on three
  nodes, as ratios to the plain client; and the store servers' own CPU per flow (``INFO cpu``), the
  figure that sizes a cluster;
* **partitions**: the dispatcher's tick (take due entries, pack finished flows, trim indexes) with 4,
  16 and 64 partitions on one node with nothing due (the median of 300 ticks), as ratios to 4.

The machine this runs on matters: on 2 shared cores, 4 worker processes, 3 Valkey nodes, a simulator
and the dispatcher all compete for the same CPUs, so the figures show the overheads, not the capacity
of a real deployment (docs/performance.md, "Scaling", has the arithmetic for one).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

from bench._harness import Processes, bench_settings, child_env, set_latency, start_simulator, valkey
from bench.bench_engine import body, tree_cpu
from durapay.config.embedded import EmbeddedValkey
from durapay.service.runtime import build_runtime
from durapay.workflows.engine import Dispatcher, FlowState
from tests.workflows.integration.topology import ValkeyCluster

WORKER = """
import sys
from durapay.config import load_settings
from durapay.service.runtime import build_runtime
settings = load_settings()
runtime = build_runtime(settings, redis_url=settings.redis_url)
runtime.celery.worker_main(["worker", "-P", "threads", "-c", sys.argv[2], "-Q", "durapay", "-l", "warning",
                            "--without-mingle", "--without-gossip", "-n", sys.argv[1] + "@%h"])
"""

_prefixes = itertools.count()


class Topology:
    """A store (one node, a one-node cluster, or three nodes), a broker, a simulator, a dispatcher."""

    def __init__(self, stack: ExitStack, sim: str, broker: EmbeddedValkey, nodes: int, cluster: bool) -> None:
        self.stack = stack
        self.nodes, self.cluster = nodes, cluster
        if cluster:
            self.store = stack.enter_context(ValkeyCluster(Path(tempfile.mkdtemp(prefix="durapay-bench-cluster-")), nodes))
            url = self.store.url
        else:
            server = valkey()
            stack.callback(server.stop)
            url = server.url
        self.url = url
        self.sim = sim
        self.broker = broker
        self.procs = Processes()
        stack.callback(self.procs.stop)
        self.runtime: Any = None
        self.dispatcher: Any = None

    def configure(self, partitions: int = 16) -> None:
        """A fresh key prefix (each batch on empty indexes) and a dispatcher in this process."""
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.runtime.close()
        settings = bench_settings(self.sim, self.url, prefix=f"s{next(_prefixes)}")
        engine = settings.engine.model_copy(update={"partitions": partitions})
        self.settings = settings.model_copy(
            update={"redis_cluster": self.cluster, "broker_url": self.broker.url, "engine": engine}
        )
        self.runtime = build_runtime(self.settings, redis_url=self.url)
        self.dispatcher = Dispatcher(self.runtime.engine).start()

    def workers(self, count: int, concurrency: int) -> list[Any]:
        for child in self.procs.children:
            child.terminate()
        for child in self.procs.children:
            child.wait(timeout=30)
        self.procs.children.clear()
        env = child_env(self.settings) | {
            "DURAPAY_REDIS_CLUSTER": "true" if self.cluster else "false",
            "DURAPAY_BROKER_URL": self.broker.url,
            "DURAPAY_ENGINE__PARTITIONS": str(self.settings.engine.partitions),
        }
        children = [self.procs.spawn(f"w{index}", WORKER, env, f"w{index}", str(concurrency)) for index in range(count)]
        self.batch(2 * count)  # every worker answers before timing starts
        return children

    def batch(self, flows: int) -> float:
        """Flows per second of ``flows`` flows started at once (polls only the unfinished, ten times a
        second, so that the polling costs the store little)."""
        engine = self.runtime.engine
        started = time.perf_counter()
        pending = {engine.start("three_steps", body()).id for _ in range(flows)}
        deadline = time.monotonic() + 600
        while pending:
            for record in engine.store.many(sorted(pending)):
                if record.state is FlowState.SUCCEEDED:
                    pending.discard(record.id)
                elif record.finished:
                    raise RuntimeError(f"a benchmark flow ended {record.state}: {record.summary()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} of {flows} flows unfinished after 600 s")
            if pending:
                time.sleep(0.1)
        return flows / (time.perf_counter() - started)

    def close(self) -> None:
        """Stop this topology's workers (they share the broker's queue with the next topology's) and
        its dispatcher."""
        self.procs.stop()
        self.procs.children.clear()
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.runtime.close()


def throughput(args: argparse.Namespace, stack: ExitStack, sim: str, broker: EmbeddedValkey) -> None:
    rates: dict[tuple[int, int], float] = {}
    for nodes in (1, 3):
        topology = Topology(stack, sim, broker, nodes, cluster=nodes > 1)
        for count in (1, 2, 4):
            topology.configure()
            topology.workers(count, args.concurrency)
            rates[(nodes, count)] = statistics.median(topology.batch(args.flows) for _ in range(args.rounds))
            print(f"  {nodes} node(s), {count} worker(s): {rates[(nodes, count)]:.0f} flows/s", flush=True)
        topology.close()
    base = rates[(1, 1)]
    print(f"\nthroughput of {args.flows} 3-step flows, as a ratio to 1 worker on 1 node ({base:.0f} flows/s)")
    print("  workers   1 node   3 nodes")
    for count in (1, 2, 4):
        print(f"  {count:7}   {rates[(1, count)] / base:6.2f}   {rates[(3, count)] / base:7.2f}")


def server_cpu(urls: list[str]) -> float:
    """CPU seconds the store's servers have used (``INFO cpu``), summed over ``urls``."""
    total = 0.0
    for url in urls:
        client = redis.Redis.from_url(url)
        info = client.info("cpu")
        client.close()
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def client_cost(args: argparse.Namespace, stack: ExitStack, sim: str, broker: EmbeddedValkey) -> None:
    costs: dict[str, list[float]] = {}
    store: dict[str, list[float]] = {}
    setups = {
        "plain client, 1 node": (1, False),
        "cluster client, 1-node cluster": (1, True),
        "cluster client, 3 nodes": (3, True),
    }
    for name, (nodes, cluster) in setups.items():
        topology = Topology(stack, sim, broker, nodes, cluster)
        topology.configure()
        (worker,) = topology.workers(1, args.concurrency)
        urls = [node.url for node in topology.store.nodes] if cluster else [topology.url]
        for _ in range(args.rounds):
            cpu, server = tree_cpu(worker.pid), server_cpu(urls)
            topology.batch(args.flows)
            costs.setdefault(name, []).append((tree_cpu(worker.pid) - cpu) / args.flows)
            store.setdefault(name, []).append((server_cpu(urls) - server) / args.flows)
        topology.close()
    base = statistics.median(costs["plain client, 1 node"])
    print(f"\nworker CPU per flow, as a ratio to the plain client ({base * 1000:.2f} ms per flow)")
    for name, values in costs.items():
        print(f"  {name:32} {statistics.median(values) * 1000:6.2f} ms   {statistics.median(values) / base:5.2f}")
    print("store servers' CPU per flow (INFO cpu, all nodes; the dispatcher's packing included)")
    for name, values in store.items():
        print(f"  {name:32} {statistics.median(values) * 1000:6.2f} ms")


def partitions(args: argparse.Namespace, stack: ExitStack, sim: str, broker: EmbeddedValkey) -> None:
    topology = Topology(stack, sim, broker, 1, cluster=False)
    idle: dict[int, float] = {}
    for count in (4, 16, 64):
        topology.configure(partitions=count)
        topology.dispatcher.stop()  # ticked by hand below
        times = []
        for _ in range(300):
            started = time.perf_counter()
            topology.dispatcher.tick()
            times.append(time.perf_counter() - started)
        idle[count] = statistics.median(times)  # the median: a shared machine's pauses fall on a few ticks
    topology.close()
    print("\ndispatcher tick with nothing due (median of 300), as a ratio to 4 partitions")
    for count, seconds in idle.items():
        print(f"  {count:3} partitions: {seconds * 1e6:7.0f} us   {seconds / idle[4]:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flows", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency", type=int, default=20, help="gateway latency, ms")
    args = parser.parse_args()
    with ExitStack() as stack:
        procs = Processes()
        stack.callback(procs.stop)
        sim = start_simulator(procs)
        set_latency(sim, args.latency)
        broker = valkey()
        stack.callback(broker.stop)
        partitions(args, stack, sim, broker)
        client_cost(args, stack, sim, broker)
        throughput(args, stack, sim, broker)


if __name__ == "__main__":
    main()
