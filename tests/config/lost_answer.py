"""The fault of a failover that the tests of resending need: a command reaches the server and runs, and its
answer is lost with the connection (the socket closed after the server answered), as when a node dies
right after running it. Mocked at redis-py's connection because a real kill cannot be timed between the
run and the answer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection


@dataclass
class LostAnswers:
    """Arm with the SHA of a script (``sha``) or a command's name (``command``): the next such call runs
    and its answer is lost. ``lost``: how many answers were lost; ``sent``: every call sent of a script
    or command armed so far (its resends included)."""

    sha: str | None = None
    command: str | None = None
    lost: int = 0
    sent: list[str] = field(default_factory=list)
    watched: set[str] = field(default_factory=set)

    def armed(self, args: tuple[Any, ...]) -> bool:
        return bool(args) and self.name(args) in (self.sha, self.command and self.command.upper())

    @staticmethod
    def name(args: tuple[Any, ...]) -> str:
        command = str(args[0]).upper()
        return str(args[1]) if command == "EVALSHA" and len(args) > 1 else command


@pytest.fixture
def lose_answer(monkeypatch: pytest.MonkeyPatch) -> Iterator[LostAnswers]:
    armed = LostAnswers()
    send, read = AbstractConnection.send_command, AbstractConnection.read_response
    send_packed = AbstractConnection.send_packed_command

    def send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._lost_answer_last = args
        if args and (armed.armed(args) or armed.name(args) in armed.watched):
            armed.watched.add(armed.name(args))
            armed.sent.append(str(args[0]))
        self._lost_answer_direct = True  # its send_packed_command is this command's
        try:
            return send(self, *args, **kwargs)  # type: ignore[no-untyped-call]
        finally:
            self._lost_answer_direct = False

    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        answer = read(self, *args, **kwargs)  # type: ignore[no-untyped-call]
        last = getattr(self, "_lost_answer_last", ())
        if armed.armed(last):
            armed.sha = armed.command = None
            armed.lost += 1
            self.disconnect()
            raise redis.ConnectionError("connection lost after the server ran the command (test fault)")
        return answer

    def send_packed_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        packed = b"".join(command) if isinstance(command, list | tuple) else command
        if (
            not getattr(self, "_lost_answer_direct", False) and armed.sha and armed.sha.encode() in bytes(packed)
        ):  # a pipeline holding the armed script
            self._lost_answer_last = ("EVALSHA", armed.sha)
            armed.sent.append("EVALSHA")
        return send_packed(self, command, *args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(AbstractConnection, "send_command", send_command)
    monkeypatch.setattr(AbstractConnection, "send_packed_command", send_packed_command)
    monkeypatch.setattr(AbstractConnection, "read_response", read_response)
    yield armed
