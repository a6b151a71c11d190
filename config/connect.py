"""Connecting to the store: one plain Redis, a Redis Cluster, or a primary found through Sentinel.

Why one place: every process (worker, scheduler, API, heartbeat, CLI) must reach the same store the
same way, and the three topologies need different clients:

* a plain ``redis://`` URL: ``redis.Redis`` (it sends a command once: a lost connection is raised, never
  resent, since the command may have run; tests/config/test_connect.py holds redis-py to that);
* ``DURAPAY_REDIS_CLUSTER=true`` with ``DURAPAY_REDIS_URL`` naming one node or several
  (``redis://[:password@]host:port[,host:port...]/0``, the startup nodes: any reachable one will do,
  so a process starts while the first is down): :class:`ClusterClient`, redis-py's ``RedisCluster``
  (it learns the slot map from a startup node and follows ``MOVED``/``ASK``), which also
  waits out a slot migration: a script whose keys are half moved is answered ``TRYAGAIN`` until the
  move ends, and redis-py gives up after 16 quick tries; here a command is tried again for up to
  ``MIGRATION_WAIT`` seconds. It also waits out a failover: a node killed, its replica promoted some
  seconds later (``cluster-node-timeout`` and an election), and meanwhile redis-py's three quick tries
  on a fresh connection fail; here a command that may be sent again (:func:`resendable`: a read or a
  script declared resend-safe) is tried
  again on a fresh connection, the slot map read anew, for up to ``FAILOVER_WAIT`` seconds while some
  node answers (when none does, the whole cluster is out: the error is raised at once, as before);
* ``redis+sentinel://[:password@]host:port[,host:port...]/<master name>[/<db>]``: the primary that the
  Sentinels name, asked again after every lost connection, so a failover is followed by itself.

The Celery broker never runs on a cluster (kombu's Redis transport needs all of its keys on one
node): it is a plain Redis, a Sentinel-watched one or RabbitMQ (``config.celery``).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.commands.cluster import READ_COMMANDS
from redis.exceptions import ClusterDownError, ClusterError, RedisClusterException, SlotNotCoveredError, TryAgainError
from redis.retry import Retry
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "redis+sentinel"

#: Seconds a command is tried again while its slot is being migrated (``TRYAGAIN``).
MIGRATION_WAIT = 15.0
#: Seconds a command is tried again on a fresh connection while a cluster node fails over (its replica
#: is promoted after ``cluster-node-timeout``, 15 s by default, plus an election of a second or two).
FAILOVER_WAIT = 30.0
#: What a cluster says while a node is lost and not yet replaced: nothing answers on its address, or
#: the others answer CLUSTERDOWN (its slots are not served). redis-py sends the command again after
#: these, three times in quick succession.
LOST_NODE = (redis.ConnectionError, redis.TimeoutError, ClusterDownError, SlotNotCoveredError)


def resendable(args: Sequence[Any], safe: Collection[Any]) -> bool:
    """Whether the command ``args`` may be sent again after its connection was lost, when it may have run
    (its answer lost with the connection): a read, or a script whose SHA is in ``safe``, the scripts
    declared resend-safe (``workflows.engine.scripts.RESEND_SAFE``: a second run after a lost answer changes
    nothing and answers as the first did). Any other script, and a bare write (``XADD``, ``INCR``...),
    is not resent: its caller's own recovery applies (a step's lease, a tick that comes again, the
    merchant's retry), since a second run would count, keep or log twice."""
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        sha = args[1] if len(args) > 1 else None
        return (sha.decode() if isinstance(sha, bytes) else sha) in safe
    return name in READ_COMMANDS


def resend_safe(client: Any) -> set[str]:
    """The SHAs of the scripts ``client`` may send again after a lost connection (filled by
    ``workflows.engine.scripts.register``; empty: no script is resent)."""
    safe: set[str] | None = getattr(client, "resend_safe_scripts", None)
    if safe is None:
        safe = set()
        client.resend_safe_scripts = safe
    return safe


def _script(args: Sequence[Any]) -> bool:
    return str(args[0]).upper() in ("EVALSHA", "EVAL")


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


def split_addresses(url: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """``redis://[auth@]h1:p1,h2:p2,.../<db>`` as the URL of its first address (auth, db and options
    kept) and every address; a URL of one address is itself, and no list. ValueError names a bad address."""
    parts = urlsplit(url)
    auth, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return url, ()
    addresses = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not (port.isascii() and port.isdigit()):
            raise ValueError(f"address {item.strip()!r} must be host:port (several are separated by commas)")
        addresses.append((host, int(port)))
    first = parts._replace(netloc=f"{auth}{at}{addresses[0][0]}:{addresses[0][1]}").geturl()
    return first, tuple(addresses)


def several_addresses(url: str) -> bool:
    """Whether a ``redis://`` URL names several addresses (a cluster's startup nodes)."""
    return not url.startswith(SENTINEL_SCHEME + "://") and "," in urlsplit(url).netloc


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
    pipelines load them and run those calls again (``workflows/engine/scripts.py``)."""

    #: Set while a script not declared resend-safe is queued: the pipeline is then sent once.
    _once = False
    #: The client's resend-safe scripts (:func:`resend_safe`).
    resend_safe_scripts: set[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parent = self.parent_execute_command

        def one_at_a_time(*command: Any, **options: Any) -> Any:
            # redis-py sends a pipeline's failed commands again one at a time (a redirection, or a lost
            # connection): a script that is not resend-safe whose connection was lost is not.
            if _script(command) and not resendable(command, resend_safe(self)):
                for queued in self._execution_strategy.command_queue:
                    if queued.args == command and isinstance(queued.result, redis.ConnectionError | redis.TimeoutError):
                        raise queued.result
            return parent(*command, **options)  # type: ignore[no-untyped-call]

        self.parent_execute_command = one_at_a_time

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """Queue a script: redis-py refuses ``EVALSHA`` in a cluster pipeline because it cannot route a
        script whose keys span slots; every durapay script keeps its keys in one slot (``workflows.engine.keys``),
        so it is routed by its first key like any other command (a script with keys in two slots is
        refused by the server with ``CROSSSLOT``)."""
        if not resendable(("EVALSHA", sha), resend_safe(self)):
            self._once = True
        return self.pipeline_execute_command("EVALSHA", sha, numkeys, *keys_and_args)  # type: ignore[no-untyped-call]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """redis-py sends the whole pipeline again after a lost connection (its quick tries): not when it
        holds a script that is not resend-safe (its first run may have counted, kept or logged)."""
        retry = self.retry
        if self._once:
            self.retry = Retry(NoBackoff(), 0)
        try:
            return list(super().execute(raise_on_error))
        except RedisClusterException as exc:
            raise _unreachable(exc) from exc
        finally:
            self.retry, self._once = retry, False


class ClusterClient(RedisCluster):
    """redis-py's cluster client, waiting out slot migrations and failovers."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        pause = 0.01
        # A script not declared resend-safe is sent to its key's node with redis-py's own quick tries
        # off (it sends a command again after a lost connection, when it may have run); a refusal
        # (CLUSTERDOWN, an uncovered slot: nothing ran) is still waited out below.
        once = _script(args) and "target_nodes" not in kwargs and not resendable(args, resend_safe(self))
        while True:
            try:
                if once and int(args[2]) > 0:
                    kwargs["target_nodes"] = self.get_node_from_key(args[3])  # type: ignore[no-untyped-call]
                return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
            except LOST_NODE as exc:
                # CLUSTERDOWN and an uncovered slot are refusals (nothing ran); a lost connection may
                # have lost the answer of a command that ran.
                refused = isinstance(exc, ClusterDownError | SlotNotCoveredError)
                if not (refused or resendable(args, resend_safe(self))) or time.monotonic() - started > FAILOVER_WAIT:
                    raise
                if not self.lost_node():
                    raise
            except RedisClusterException as exc:
                lost = _unreachable(exc)
                if lost is exc or not resendable(args, resend_safe(self)) or time.monotonic() - started > FAILOVER_WAIT:
                    raise lost from exc
                if not self.lost_node():
                    raise lost from exc
            except (TryAgainError, ClusterError) as exc:
                # TRYAGAIN: a multi-key command (a script) met a slot whose keys are half migrated;
                # redis-py's own tries end with "TTL exhausted". Both end when the migration does.
                migrating = isinstance(exc, TryAgainError) or "TTL exhausted" in str(exc)
                if not migrating or time.monotonic() - started > MIGRATION_WAIT:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def lost_node(self) -> bool:
        """After a lost node: read the slot map anew from any node that answers. False when none does: the
        whole cluster is unreachable, an outage that callers ride out as such (the API's 503, the
        workers' and schedulers' retries), not a failover to wait for here."""
        try:
            self.nodes_manager.initialize()
        except (redis.RedisError, RedisClusterException):
            return False
        return True

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        if transaction or shard_hint:
            return super().pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]
        pipe = _ClusterPipeline(
            nodes_manager=self.nodes_manager,
            commands_parser=self.commands_parser,
            startup_nodes=self.nodes_manager.startup_nodes,  # as redis-py's own pipeline()
            result_callbacks=self.result_callbacks,
            cluster_response_callbacks=self.cluster_response_callbacks,
            read_from_replicas=self.read_from_replicas,
            load_balancing_strategy=self.load_balancing_strategy,
            reinitialize_steps=self.reinitialize_steps,
            retry=self.retry,
            lock=self._lock,
        )
        pipe.resend_safe_scripts = resend_safe(self)
        return pipe


def open_redis(url: str, *, cluster: bool = False, **options: Any) -> Any:
    """A client for ``url``: plain, a cluster (``cluster``: ``url`` names one node or several, the startup
    nodes: the first that answers gives the slot map), or the primary of a ``redis+sentinel://`` URL.
    ``options``: socket timeouts and the like, as redis-py takes them."""
    if url.startswith(SENTINEL_SCHEME + "://"):
        if cluster:
            raise ValueError("a Redis Cluster is not reached through Sentinel: name one of its nodes")
        target = parse_sentinel_url(url)
        timeouts: dict[str, Any] = {
            name: options[name] for name in ("socket_timeout", "socket_connect_timeout") if name in options
        }
        # redis-py types Sentinel from 8.2 on and not before: the ignores hold for either.
        sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=timeouts, **timeouts)  # type: ignore[no-untyped-call, unused-ignore]
        return sentinel.master_for(target.master, db=target.db, password=target.password, **options)  # type: ignore[no-untyped-call, unused-ignore]
    if cluster:
        options.pop("health_check_interval", None)
        first, addresses = split_addresses(url)
        others = [ClusterNode(host, port) for host, port in addresses[1:]]  # type: ignore[no-untyped-call]  # the first is the URL's
        return ClusterClient.from_url(first, startup_nodes=others, **options)
    if several_addresses(url):
        raise ValueError("several addresses are a Redis Cluster's startup nodes: set DURAPAY_REDIS_CLUSTER=true")
    return redis.Redis.from_url(url, **options)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)
