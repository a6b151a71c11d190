"""Connecting to the store: one plain Redis, a Redis Cluster, or a primary found through Sentinel.

Why one place: every process (worker, scheduler, API, heartbeat, CLI) must reach the same store the
same way, and the three topologies need different clients:

* a plain ``redis://`` URL: ``redis.Redis``;
* ``DURAPAY_REDIS_CLUSTER=true`` with ``DURAPAY_REDIS_URL`` naming any node: :class:`ClusterClient`, redis-py's
  ``RedisCluster`` (it learns the slot map from that node and follows ``MOVED``/``ASK``), which also
  waits out a slot migration: a script whose keys are half moved is answered ``TRYAGAIN`` until the
  move ends, and redis-py gives up after 16 quick tries; here a command is tried again for up to
  ``MIGRATION_WAIT`` seconds;
* ``redis+sentinel://[:password@]host:port[,host:port...]/<master name>[/<db>]``: the primary that the
  Sentinels name, asked again after every lost connection, so a failover is followed by itself.

The Celery broker never runs on a cluster (kombu's Redis transport needs all of its keys on one
node): it is a plain Redis, a Sentinel-watched one or RabbitMQ (``config.celery``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException, TryAgainError
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "redis+sentinel"

#: Seconds a command is tried again while its slot is being migrated (``TRYAGAIN``).
MIGRATION_WAIT = 15.0


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: the Sentinels, the master's name, the db, the password."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read ``redis+sentinel://[:password@]host:port[,host:port...]/<master>[/<db>]`` (ValueError if not)."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    where = parts.netloc.rpartition("@")
    password = unquote(where[0].partition(":")[2]) if where[1] else None
    sentinels = []
    for item in where[2].split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not (port.isascii() and port.isdigit()):
            raise ValueError(f"sentinel address {item!r} must be host:port")
        sentinels.append((host, int(port)))
    path = [piece for piece in parts.path.split("/") if piece]
    if not path:
        raise ValueError("name the master after the addresses: redis+sentinel://host:port/<master>")
    if len(path) > 2 or (len(path) == 2 and not (path[1].isascii() and path[1].isdigit())):
        raise ValueError("the path is /<master>[/<db number>]")
    return SentinelTarget(tuple(sentinels), path[0], int(path[1]) if len(path) == 2 else 0, password or None)


def _unreachable(exc: RedisClusterException) -> Exception:
    """redis-py says a cluster "cannot be connected" with RedisClusterException, which is not a
    RedisError: everything that rides out a Redis outage (heartbeats, the receiver, the API's 503, the
    workers' retries) catches RedisError. So the loss of every node becomes the ConnectionError it is;
    any other RedisClusterException (a command no slot can take: a defect) stays what it is."""
    if isinstance(exc.__cause__, redis.ConnectionError | redis.TimeoutError | OSError):
        return redis.ConnectionError(str(exc))
    return exc


class _ClusterPipeline(ClusterPipeline):
    """A cluster pipeline that takes scripts (routed by their first key) and says a lost cluster is a
    ConnectionError. A node that lost its scripts (restarted, promoted) answers NOSCRIPT: the store's
    pipelines load them and run those calls again (``workflows/scripts.py``)."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """Queue a script: redis-py refuses ``EVALSHA`` in a cluster pipeline because it cannot route a
        script whose keys span slots; every durapay script keeps its keys in one slot (``workflows.keys``),
        so it is routed by its first key like any other command (a script with keys in two slots is
        refused by the server with ``CROSSSLOT``)."""
        return self.pipeline_execute_command("EVALSHA", sha, numkeys, *keys_and_args)  # type: ignore[no-untyped-call]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return list(super().execute(raise_on_error))
        except RedisClusterException as exc:
            raise _unreachable(exc) from exc


class ClusterClient(RedisCluster):
    """redis-py's cluster client, waiting out slot migrations."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + MIGRATION_WAIT
        pause = 0.01
        while True:
            try:
                return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
            except RedisClusterException as exc:
                raise _unreachable(exc) from exc
            except (TryAgainError, ClusterError) as exc:
                # TRYAGAIN: a multi-key command (a script) met a slot whose keys are half migrated;
                # redis-py's own tries end with "TTL exhausted". Both end when the migration does.
                migrating = isinstance(exc, TryAgainError) or "TTL exhausted" in str(exc)
                if not migrating or time.monotonic() > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.2)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        if transaction or shard_hint:
            return super().pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]
        return _ClusterPipeline(
            nodes_manager=self.nodes_manager,
            commands_parser=self.commands_parser,
            startup_nodes=self.nodes_manager.startup_nodes,  # type: ignore[arg-type]  # as redis-py's own pipeline()
            result_callbacks=self.result_callbacks,
            cluster_response_callbacks=self.cluster_response_callbacks,
            read_from_replicas=self.read_from_replicas,
            load_balancing_strategy=self.load_balancing_strategy,
            reinitialize_steps=self.reinitialize_steps,
            retry=self.retry,
            lock=self._lock,
        )


def open_redis(url: str, *, cluster: bool = False, **options: Any) -> Any:
    """A client for ``url``: plain, a cluster (``cluster``: ``url`` names any node), or the primary of a
    ``redis+sentinel://`` URL. ``options``: socket timeouts and the like, as redis-py takes them."""
    if url.startswith(SENTINEL_SCHEME + "://"):
        if cluster:
            raise ValueError("a Redis Cluster is not reached through Sentinel: name one of its nodes")
        target = parse_sentinel_url(url)
        timeouts = {name: options[name] for name in ("socket_timeout", "socket_connect_timeout") if name in options}
        sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=timeouts, **timeouts)  # type: ignore[no-untyped-call]
        return sentinel.master_for(target.master, db=target.db, password=target.password, **options)  # type: ignore[no-untyped-call]
    if cluster:
        options.pop("health_check_interval", None)
        return ClusterClient.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)
