"""What a section of a benchmark cost the Valkey server, per item: CPU, commands by name, reads, AOF.

The store is what sizes a durapay deployment (docs/performance.md, The store's cost per flow), so the
benchmarks measure it where it is paid, from the server's own counters, for the durable side and for
bare Celery on the same server in the same run:

* CPU: ``INFO cpu`` (``used_cpu_user`` + ``used_cpu_sys``: the main thread and its I/O threads; the
  AOF rewrite runs in a forked child and is not in it);
* commands by name: ``INFO commandstats`` (a script's own ``redis.call``\\ s are counted under their
  names as well as the ``EVALSHA`` that ran them: both are printed, the scripts' share apart);
* reads: ``total_reads_processed`` of ``INFO stats``, the socket reads that brought requests in: a
  request and its answer are one round trip, a pipeline of several is one read (or a few), so this is
  the server's count of round trips;
* AOF: the bytes ``aof_current_size`` grew by (with the rewrites seen, which reset it: then n/a).

The server is private to the benchmark, and its broker traffic (Celery's queues on the same server)
is in the figures of both sides alike. What runs in the background is in whichever section it falls:
the durable side's dispatcher ticks all the time, and the compaction of the flows a durable batch
finished runs partly in the bare batch after it (rounds alternate, so the medians carry half of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

#: Commands that run a script: their calls are client requests; what the scripts call is counted too.
SCRIPT_COMMANDS = frozenset({"evalsha", "eval", "fcall", "evalsha_ro", "eval_ro", "fcall_ro"})


@dataclass(frozen=True)
class ServerCounters:
    cpu: float
    calls: Mapping[str, int]
    reads: int
    aof: int
    rewrites: int

    @classmethod
    def read(cls, client: redis.Redis) -> ServerCounters:
        cpu: Any = client.info("cpu")
        stats: Any = client.info("commandstats")
        general: Any = client.info("stats")
        persistence: Any = client.info("persistence")
        calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
        return cls(
            cpu=float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            calls=calls,
            reads=int(general.get("total_reads_processed", 0)),
            aof=int(persistence.get("aof_current_size", 0)),
            rewrites=int(persistence.get("aof_rewrites", 0)),
        )


#: The counters' own reads (four INFOs per reading): left out of the figures.
OBSERVER = frozenset({"info"})


@dataclass(frozen=True)
class ServerCost:
    """Per item (a flow, a chain) between two readings of the counters."""

    items: int
    cpu_ms: float
    commands: float  # every command the server ran: those clients sent and those their scripts called
    scripts: float  # of them, EVALSHA and the like (each a client's request)
    reads: float
    aof_bytes: float | None  # None when a rewrite happened in between
    by_command: Mapping[str, float]

    @classmethod
    def between(
        cls, before: ServerCounters, after: ServerCounters, items: int, watched: Mapping[str, int], polls: int
    ) -> ServerCost:
        """``watched``: the commands the bench's own waits sent meanwhile, by name, in ``polls`` round
        trips: left out (the readings' own INFOs too; a few reads per section stay in)."""
        per = max(items, 1)
        delta = {
            name: count - before.calls.get(name, 0) - watched.get(name, 0)
            for name, count in after.calls.items()
            if name not in OBSERVER
        }
        delta = {name: count for name, count in delta.items() if count > 0}
        scripts = sum(count for name, count in delta.items() if name in SCRIPT_COMMANDS)
        aof = None if after.rewrites != before.rewrites else (after.aof - before.aof) / per
        return cls(
            items=items,
            cpu_ms=(after.cpu - before.cpu) * 1000 / per,
            commands=sum(delta.values()) / per,
            scripts=scripts / per,
            reads=(after.reads - before.reads - polls) / per,
            aof_bytes=aof,
            by_command={name: count / per for name, count in sorted(delta.items(), key=lambda kv: -kv[1])},
        )

    def line(self, top: int = 6) -> str:
        aof = "n/a (a rewrite)" if self.aof_bytes is None else f"{self.aof_bytes:,.0f} B"
        names = ", ".join(f"{name} {count:.1f}" for name, count in list(self.by_command.items())[:top])
        return (
            f"Valkey CPU {self.cpu_ms:.3f} ms, commands {self.commands:.1f} (scripts {self.scripts:.1f}), "
            f"reads {self.reads:.1f}, AOF {aof}; most: {names}"
        )
