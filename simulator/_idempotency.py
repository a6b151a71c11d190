"""Idempotency keys: one operation per key, the first answer replayed for every repeat.

A request to an operation that takes an ``Idempotency-Key`` first claims the key. If an answer is
stored under it, the request is a repeat: the same method, path and body get the stored status and
body back without a second operation; anything else gets 400 PS0025 "Idempotency-Key reused with a
different request". If another request holding the key is still in flight, this one waits for it and
then decides. Answers are stored when the operation ran (its success or its business refusal), never
for a request refused before it ran (bad JSON, a field error, an injected error): those may be resent.

The stored answers live in the state (so ``--state-file`` keeps them); the in-flight markers are
asyncio events of the one event loop that serves the app.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from durapay.simulator._protocol import Reply, SimError
from durapay.simulator._state import SimulatorState

REUSED = "Idempotency-Key reused with a different request"


def fingerprint(method: str, path: str, raw: dict[str, Any]) -> str:
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


@dataclass(frozen=True)
class StoredAnswer:
    status: int
    body: str
    media_type: str

    def reply(self) -> Reply:
        return Reply(
            status=self.status, content=self.body.encode(), media_type=self.media_type, headers={"Idempotent-Replayed": "true"}
        )


class IdempotencyGate:
    """Claims, replays and stores answers by key. Use from the app's event loop only."""

    def __init__(self, state: SimulatorState) -> None:
        self._state = state
        self._inflight: dict[str, asyncio.Event] = {}

    def _stored(self, key: str, print_: str) -> StoredAnswer | None:
        with self._state.lock:
            stored = self._state.idempotency.get(key)
        if stored is None:
            return None
        if stored["fingerprint"] != print_:
            raise SimError(400, "PS0025", REUSED)
        return StoredAnswer(stored["status"], stored["body"], stored["mediaType"])

    async def claim(self, key: str, print_: str) -> StoredAnswer | None:
        """None when this request now holds ``key`` (call :meth:`release` after); else the answer to replay."""
        while True:
            stored = self._stored(key, print_)
            if stored is not None:
                return stored
            event = self._inflight.get(key)
            if event is None:
                self._inflight[key] = asyncio.Event()
                return None
            await event.wait()

    def store(self, key: str, print_: str, operation: str, reply: Reply) -> None:
        """Keep ``reply`` under ``key``. Call under the state's lock, in the same step as the operation."""
        self._state.idempotency[key] = {
            "fingerprint": print_,
            "operation": operation,
            "status": reply.status,
            "body": reply.render().decode(),
            "mediaType": reply.media_type,
            "time": self._state.now_iso(),
        }

    def release(self, key: str) -> None:
        event = self._inflight.pop(key, None)
        if event is not None:
            event.set()
