"""A name the resolver never answers (within a test): ``socket.getaddrinfo`` held for that one name.

A resolver that hangs cannot be produced on loopback (the system's answers ``localhost`` at once), so
this is the one fault here made with a patch: every other name resolves as it does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

#: The held name (``.test`` is reserved: no real resolver answers it).
HELD = "held-resolver.durapay.test"
#: The most one held lookup waits before it fails as a resolver would (a bound on the threads it holds).
HOLD_SECONDS = 10.0


class HeldResolver:
    def __init__(self) -> None:
        self.asked = threading.Event()
        self.released = threading.Event()
        self.lookups = 0


@pytest.fixture
def held_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldResolver]:
    held = HeldResolver()
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in (HELD, HELD.encode()):
            held.lookups += 1
            held.asked.set()
            held.released.wait(HOLD_SECONDS)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield held
    held.released.set()
