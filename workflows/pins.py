"""Pinned connections: a write and its durability wait on one connection to the node that took it.

``WAITAOF`` and ``WAIT`` count the writes of the connection they are asked on, on the server that
answers them (``workflows.durability``). So a write that must be durable and its wait share one
connection: per thread, a client bound to a single connection of the store's pool; with a Redis
Cluster, one such client per node, and the write is sent to the node that owns its keys' slot.

On a cluster the slot may move (a resharding): the node answers ``MOVED`` (the slot map is refreshed
and the write goes to the new owner), ``ASK`` (this key already moved: ``ASKING`` and the write go to
the importing node, and so does the wait) or ``TRYAGAIN`` (a script's keys are split between the two
nodes for an instant: tried again shortly). Either way the wait goes to the node whose answer said the
write was done.

A node may also fail (killed, its replica promoted after ``cluster-node-timeout``): the pinned
connection to it breaks, and until the promotion nothing answers for its slots. A lost connection is
taken like a redirection: the pinned client is dropped, the slot map read anew, and the command sent
again on a fresh connection to whichever node owns the key then, for up to ``FAILOVER_WAIT`` seconds;
so a failover costs a step the seconds of the promotion, not a lease. The commands sent here may be
sent again although the first one may have run (its answer lost with the connection): they are
scripts that check before they write (``config.connect.resendable`` says why each kind is safe).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from durapay.config.connect import FAILOVER_WAIT, LOST_NODE, MIGRATION_WAIT, is_cluster

T = TypeVar("T")


class Pins:
    """This thread's single-connection clients of ``client`` (one per node of a cluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        self._local = threading.local()

    def _pinned(self, name: str, pool: Any) -> Any:
        pinned: dict[str, Any] | None = getattr(self._local, "clients", None)
        if pinned is None:
            pinned = self._local.clients = {}
        found = pinned.get(name)
        if found is not None and (found.connection_pool is not pool or _lost(found)):
            found.close()  # back to its pool, which connects it anew (through Sentinel: to the primary now)
            found = None
        if found is None:
            found = pinned[name] = redis.Redis(connection_pool=pool, single_connection_client=True)
        return found

    def _drop(self, pinned: Any) -> None:
        clients: dict[str, Any] = getattr(self._local, "clients", {})
        for name, found in list(clients.items()):
            if found is pinned:
                del clients[name]

    def plain(self) -> Any:
        """The pinned client of a single server (not a cluster)."""
        return self._pinned("", self.client.connection_pool)

    def _node_client(self, host: str, port: int) -> Any:
        manager = self.client.nodes_manager
        node = self.client.get_node(host=host, port=port)
        if node is None:
            manager.initialize()
            node = self.client.get_node(host=host, port=port)
        if node is None:
            raise redis.ConnectionError(f"cluster node {host}:{port} is not in the slot map")
        return self._pinned(node.name, node.redis_connection.connection_pool)

    def run(self, key: str, command: Callable[[Any], T]) -> tuple[T, Any]:
        """``command(pinned)`` on the connection to the server that owns ``key``; returns its answer and
        that pinned client (for the durability wait). ``command`` must be safe to repeat after a
        redirection (it was refused, so nothing of it ran) and after a lost connection (it may have run:
        a script that checks before it writes, ``config.connect.resendable``)."""
        if not self.cluster:
            return command(self.plain()), self.plain()
        started = time.monotonic()
        deadline = started + MIGRATION_WAIT
        node = self.client.get_node_from_key(key)
        pinned = self._pinned(node.name, node.redis_connection.connection_pool)
        asking = False
        pause = 0.01
        while True:
            try:
                if asking:
                    pinned.execute_command("ASKING")
                return command(pinned), pinned
            except MovedError as moved:
                self.client.nodes_manager.initialize()
                pinned, asking = self._node_client(moved.host, moved.port), False
            except AskError as ask:
                pinned, asking = self._node_client(ask.host, ask.port), True
            except TryAgainError:
                node = self.client.get_node_from_key(key)
                pinned, asking = self._pinned(node.name, node.redis_connection.connection_pool), False
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
            except LOST_NODE:
                if time.monotonic() - started > FAILOVER_WAIT:
                    raise
                pinned.close()  # back to its pool, disconnected: the next one connects afresh
                self._drop(pinned)
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                if not self.client.lost_node():  # the slot map anew: the promoted replica, once it is
                    raise  # no node answers: an outage, not a failover
                node = self.client.get_node_from_key(key)
                pinned, asking = self._pinned(node.name, node.redis_connection.connection_pool), False
                deadline = max(deadline, time.monotonic() + MIGRATION_WAIT)
                continue
            if time.monotonic() > deadline:
                raise redis.ConnectionError(f"the slot of {key} kept moving for {MIGRATION_WAIT}s; try again")

    def script(self, script: Any, keys: list[str], args: list[Any]) -> tuple[Any, Any]:
        """Run a registered ``script`` on the pinned connection of its keys' node (loading it there if that
        node lacks it); returns the answer and the pinned client."""

        def call(pinned: Any) -> Any:
            try:
                return pinned.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                pinned.script_load(script.script)
                return pinned.evalsha(script.sha, len(keys), *keys, *args)

        return self.run(keys[0], call)


def _lost(pinned: Any) -> bool:
    """Whether the pinned connection was dropped after an error. It must then go back to its pool: a
    single-connection client reconnects to the address it had, where the pool asks the Sentinels for the
    primary first (after a failover the old address is a replica)."""
    connection = getattr(pinned, "connection", None)
    return connection is not None and getattr(connection, "_sock", None) is None
