"""Durable acknowledgements: a write is on disk (or on replicas) before money moves or a caller is told.

Redis acknowledges a write once it is in memory. With ``appendfsync everysec`` a host crash loses the
last second of acknowledged writes, and a replica promoted after a failover lacks whatever it had not
received yet. If the lost write is a claim, the step runs again as if it never ran; if it is a start,
an acknowledged flow is gone. So the engine waits for the write to be durable at the points where
losing it would cost money or a promise:

* after a **start** is written, before the caller gets the flow;
* after a **claim** of a step that moves money (a call the gateway cannot deduplicate), before the
  call: a later run of the step then knows the call may have happened, and reads the gateway first;
* after a **signal** is stored (a notification), before the receiver answers 200 and the gateway
  stops retrying;
* after a completion that gives the flow a **customer URL** (a page the customer pays on), before the
  worker moves on (``StepProtocol._shown``).

``WAITAOF 1 0`` waits for the local AOF fsync (Valkey, Redis >= 7.2); ``WAIT n`` for ``n`` replicas to
receive it. Both wait for every write the connection made, and the AOF and the replication stream
are each one ordered log, so the engine makes a small write of its own and waits on that connection
(``FlowStore.sync``; on a Redis Cluster, on the node that holds the flow: ``workflows.engine.pins``).
A wait that times out raises :class:`NotDurable`: nothing is called, and the caller retries later.
What each setting guarantees is in docs/durability.md.

Some servers confirm ``WAITAOF`` before the fsync under ``everysec`` (Redis 7.4.0-7.4.2, the bundled
Valkey): there the waits above do not hold. The processes check it at start, before they write
anything (:func:`early_waitaof_risk`, from ``service.runtime.admit_durability``), and refuse to run
(:class:`EarlyWaitaof`) unless ``DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF`` accepts the loss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

log = logging.getLogger("durapay.durability")


class NotDurable(Exception):
    """The write was not confirmed durable in time (fsync, or replicas): retry later, nothing was called."""

    retryable = True


@dataclass(frozen=True)
class Durability:
    """What to wait for after a write that must not be lost: the local fsync, and ``replicas``."""

    aof: bool = False
    replicas: int = 0
    timeout_ms: int = 2000

    @property
    def active(self) -> bool:
        return self.aof or self.replicas > 0

    @classmethod
    def resolve(cls, client: Any, sync_aof: str, replicas: int, timeout: float) -> Durability:
        """Decide from the settings and, for ``auto``, the server's own (a connection error propagates:
        the caller asks again once the server answers).

        ``sync_aof``: ``yes``, ``no``, or ``auto``: wait for the fsync where a write is acknowledged before
        it and an fsync comes within a second (``appendfsync everysec``); not under ``always`` (already
        on disk when acknowledged), nor under ``no`` (the server never fsyncs on its own: nothing to
        wait for, and the loss of acknowledged writes on a host crash was chosen).

        A server known to confirm ``WAITAOF`` before that fsync is named in a warning (under ``auto``); the
        processes refuse to start on one unless told to accept it (:func:`early_waitaof_risk`, checked at
        start by ``service.runtime.admit_durability``, under ``yes`` too)."""
        timeout_ms = max(1, int(timeout * 1000))
        if sync_aof == "yes":
            return cls(True, replicas, timeout_ms)
        if sync_aof == "no":
            return cls(False, replicas, timeout_ms)
        try:
            appendonly, fsync = _persistence(client)
        except redis.ResponseError as exc:  # CONFIG may be disabled (managed Redis): wait, to be safe
            log.info("cannot read the AOF settings (%s); waiting for the fsync of claims and starts", exc)
            return cls(True, replicas, timeout_ms)
        if appendonly != "yes":
            log.warning("Redis keeps no AOF: a restart loses flows (see docs/durability.md)")
            return cls(False, replicas, timeout_ms)
        if fsync == "no":
            log.warning("Redis AOF with appendfsync no: a host crash loses acknowledged writes (see docs/durability.md)")
        if fsync == "everysec" and (server := early_waitaof(client)):
            log.warning(
                "%s answers WAITAOF before its fsync under appendfsync everysec (redis/redis#13793): a host crash "
                "can lose acknowledged starts and claims; set appendfsync always (see docs/durability.md)",
                server,
            )
        return cls(fsync == "everysec", replicas, timeout_ms)

    def check(self, local: Any, acked: Any, what: str) -> None:
        """Raise NotDurable unless the waits were met (``local``: WAITAOF's answer, ``acked``: WAIT's)."""
        if self.aof and int(local[0]) < 1:
            raise NotDurable(f"{what}: the AOF fsync was not confirmed within {self.timeout_ms} ms")
        if self.replicas and int(acked) < self.replicas:
            raise NotDurable(f"{what}: {acked} of {self.replicas} replicas confirmed within {self.timeout_ms} ms")

    def wait(self, pinned: Any, what: str) -> None:
        """Wait until the writes ``pinned`` made are durable, or raise NotDurable. ``pinned`` must be a
        client bound to one connection (``single_connection_client``): the waits count that
        connection's writes.

        The waits go after the write's answer, never pipelined behind it: pipelined, a ``WAITAOF``
        reaches the server before the write is in the AOF and waits for the next periodic fsync (tens of
        milliseconds under ``everysec``); asked after it, the server fsyncs at once."""
        if not self.active:
            return
        local = pinned.execute_command("WAITAOF", 1, 0, self.timeout_ms) if self.aof else None
        acked = pinned.execute_command("WAIT", self.replicas, self.timeout_ms) if self.replicas else None
        self.check(local, acked, what)


class EarlyWaitaof(Exception):
    """The server confirms ``WAITAOF`` before its fsync, so the fsync waits the engine makes do not hold:
    a process refuses to start on it unless ``DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF`` is true."""

    setting = "DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF"

    def __init__(self, server: str, *, where: str | None = None) -> None:
        self.server = server
        self.where = where
        super().__init__(
            f"{server}{f' at {where}' if where else ''} confirms WAITAOF before its fsync under appendfsync "
            "everysec (redis/redis#13793): a host crash can lose starts, claims and signals it acknowledged as on "
            "disk. Refusing to start: set `appendfsync always` on that server (CONFIG SET appendfsync always, and "
            f"in its configuration file), or {self.setting}=true to run anyway, accepting that loss "
            "(docs/durability.md)"
        )


def early_waitaof_risk(client: Any, sync_aof: str) -> str | None:
    """The server's name and version when the fsync waits of ``sync_aof`` would be confirmed before the
    fsync: the engine waits for it (``auto`` or ``yes``), the server fsyncs every second (AOF on,
    ``appendfsync everysec``) and is known to confirm ``WAITAOF`` early (:func:`early_waitaof`). None
    otherwise: ``sync_aof=no`` chose to lose acknowledged writes, ``always`` has each on disk when
    acknowledged, and a server that does not let its settings be read (``CONFIG`` disabled) cannot be
    told apart. A connection error propagates."""
    if sync_aof == "no":
        return None
    try:
        appendonly, fsync = _persistence(client)
    except redis.ResponseError:
        return None
    if appendonly != "yes" or fsync != "everysec":
        return None
    return early_waitaof(client)


def _persistence(client: Any) -> tuple[str, str]:
    """The server's ``appendonly`` and ``appendfsync`` (ResponseError when ``CONFIG`` is refused)."""
    config = client.config_get("append*")
    appendonly = _text(config.get("appendonly", config.get(b"appendonly", "no")))
    fsync = _text(config.get("appendfsync", config.get(b"appendfsync", "")))
    return appendonly, fsync


def early_waitaof(client: Any) -> str | None:
    """The server's name and version when it is known to confirm ``WAITAOF`` before the fsync under
    ``everysec`` (within a second of its previous fsync): Redis 7.4.0-7.4.2, and Valkey from 8.0 (the
    bundled 9.1.2 does, as ``durapay chaos --appendfsync everysec --lose-last-writes`` shows; no Valkey
    release is known to have the fix). None when it is not known to, or cannot be asked."""
    try:
        info = client.info("server")
    except redis.RedisError:
        return None
    if isinstance(info, dict) and all(isinstance(node, dict) for node in info.values()) and info:
        info = next(iter(info.values()))  # a cluster client answers per node; they run one version
    valkey, redis_version = str(info.get("valkey_version", "")), str(info.get("redis_version", ""))
    if valkey:
        return f"Valkey {valkey}" if _version(valkey) >= (8, 0, 0) else None
    return f"Redis {redis_version}" if (7, 4, 0) <= _version(redis_version) <= (7, 4, 2) else None


def _version(text: str) -> tuple[int, ...]:
    parts = [int(part) if part.isdigit() else 0 for part in text.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
