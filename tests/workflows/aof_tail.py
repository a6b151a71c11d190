"""Redis losing its last writes, for the flow model: a Valkey whose AOF tail is cut back.

The server runs with ``appendfsync always``, so its AOF holds every write it acknowledged. A host crash
inside ``everysec``'s second, or a replica promoted after a failover, loses a tail of those writes: the
model cuts the last N commands off the AOF (a ``MULTI``/``EXEC`` block, which is how a script's writes are
logged, counts as one) and restarts the server. The engine is made to wait for the fsync as under
``everysec`` (``WAITAOF``, :class:`FloorDurability`), and every wait raises a floor that no cut goes
below: what the engine waited on is never lost, anything after it may be.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from durapay.config.embedded import EmbeddedValkey
from durapay.workflows.engine.durability import Durability


class AofTail:
    """A Valkey whose AOF tail can be cut back to any command after the last durability wait."""

    def __init__(self, data_dir: Path) -> None:
        self.server = EmbeddedValkey(data_dir, appendfsync="always")
        self.floor = 0

    def start(self) -> None:
        self.server.start()
        self.server_client().config_set("auto-aof-rewrite-percentage", "0")  # one incr file, never rewritten

    def stop(self) -> None:
        self.server.stop()

    def server_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.server.url)

    def incr_file(self) -> Path:
        folder = self.server.data_dir / "appendonlydir"
        manifest = (folder / "appendonly.aof.manifest").read_text().splitlines()
        names = [line.split()[1] for line in manifest if line.split()[-1] == "i"]
        return folder / names[-1]

    def size(self) -> int:
        return self.incr_file().stat().st_size

    def mark_durable(self) -> None:
        """Every write acknowledged so far is durable (``appendfsync always`` wrote it before answering)."""
        self.floor = self.size()

    def units(self) -> list[int]:
        """The start offsets of the commands after the floor (a MULTI ... EXEC block is one)."""
        data = self.incr_file().read_bytes()
        starts: list[int] = []
        at = self.floor
        in_multi = False
        while at < len(data):
            begin = at
            assert data[at : at + 1] == b"*", f"AOF parse error at {at}"
            end = data.index(b"\r\n", at)
            count = int(data[at + 1 : end])
            at = end + 2
            name = b""
            for index in range(count):
                end = data.index(b"\r\n", at)
                length = int(data[at + 1 : end])
                value = data[end + 2 : end + 2 + length]
                at = end + 2 + length + 2
                if index == 0:
                    name = value.upper()
            if not in_multi:
                starts.append(begin)
            if name == b"MULTI":
                in_multi = True
            elif name == b"EXEC":
                in_multi = False
        return starts

    def cut(self, commands: int) -> int:
        """Crash Valkey and lose up to ``commands`` of the last commands (never below the floor); returns
        how many were lost."""
        starts = self.units()
        lost = min(commands, len(starts))
        self.server.kill()
        if lost:
            with self.incr_file().open("r+b") as aof:
                aof.truncate(starts[-lost])
        self.server.start()
        return lost


@dataclass(frozen=True)
class FloorDurability(Durability):
    """Waits for the AOF fsync as under ``everysec``; each wait that returns raises the cut's floor."""

    tail: AofTail | None = None

    def wait(self, pinned: Any, what: str) -> None:
        super().wait(pinned, what)
        if self.tail is not None:
            self.tail.mark_durable()
