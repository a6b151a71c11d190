"""Pinned connections: a write and its durability wait on one connection to the node that took it.

``WAITAOF`` and ``WAIT`` count the writes of the connection they are asked on, on the server that
answers them (``workflows.engine.durability``). So a write that must be durable and its wait share one
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
so a failover costs a step the seconds of the promotion, not a lease. The first one may have run (its
answer lost with the connection), so only a command its caller says is resend-safe is sent again: a
script that ``workflows/engine/scripts.py`` declares so (a claim, a completion: they recognise their own
effect and answer as the first run did) or a plain overwrite. Any other is sent once: a lost connection
is raised, and its caller's own recovery applies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from durapay.config.connect import FAILOVER_WAIT, LOST_NODE, MIGRATION_WAIT, is_cluster, resend_safe

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

    def run(self, key: str, command: Callable[[Any], T], *, resend: bool) -> tuple[T, Any]:
        """``command(pinned)`` on the connection to the server that owns ``key``; returns its answer and
        that pinned client (for the durability wait). ``command`` is repeated after a redirection (it was
        refused, so nothing of it ran); after a lost connection (it may have run) only when ``resend``
        says a second run is harmless (``workflows.engine.scripts.RESEND_SAFE``), else the error is raised."""
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
                if not resend or time.monotonic() - started > FAILOVER_WAIT:
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
        node lacks it); returns the answer and the pinned client. Sent again after a lost connection only
        when ``script`` is declared resend-safe (``workflows.engine.scripts.register``)."""

        def call(pinned: Any) -> Any:
            try:
                return pinned.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                pinned.script_load(script.script)
                return pinned.evalsha(script.sha, len(keys), *keys, *args)

        return self.run(keys[0], call, resend=script.sha in resend_safe(self.client))


def _lost(pinned: Any) -> bool:
    """Whether the pinned connection was dropped after an error. It must then go back to its pool: a
    single-connection client reconnects to the address it had, where the pool asks the Sentinels for the
    primary first (after a failover the old address is a replica)."""
    connection = getattr(pinned, "connection", None)
    return connection is not None and getattr(connection, "_sock", None) is None
