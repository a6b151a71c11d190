"""Pipelines of Lua script calls without a round trip spent asking whether the server has the scripts.

redis-py's pipeline, given a ``Script``, sends ``SCRIPT EXISTS`` for its scripts before every execute:
one more round trip each time, on the worker's path between a step's completion and the next claim,
the dispatcher's tick, the scheduler's batches. A server loses its scripts only when it restarts,
fails over or is flushed, and then answers ``NOSCRIPT`` without running the call; so a call is queued
by its SHA alone, and the calls answered ``NOSCRIPT`` run again after the pipeline, their scripts
loaded first.

That rerun comes after the pipeline's other calls: where a call depends on an earlier one having run,
the caller looks at :attr:`ScriptPipeline.rerun` (the store's completion-then-claim claims again when
its completion was run late: the first claim found the step not yet ready).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError


def source(path: str) -> str:
    """A Lua script of the engine by its path inside this package (``lua/claim.lua``,
    ``schedules/lua/create.lua``): read as package data, from the installed package whatever else is
    on ``sys.path`` (a package name written as a string once found the checkout's folder instead)."""
    return package_file(path).read_text()


def package_file(path: str) -> resources.abc.Traversable:
    """A data file of the workflows package (Lua scripts, compression dictionaries) by its path in it."""
    return resources.files(__package__).joinpath(path)


class ScriptPipeline:
    """One pipeline (no transaction) of script calls and plain commands. Give it a Redis client
    (single server or cluster); queue with :meth:`call` and :meth:`command`; :meth:`execute` answers
    their replies in order."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pipe: Any = client.pipeline(transaction=False)
        self._calls: list[tuple[Script, Sequence[Any], Sequence[Any]] | None] = []  # None: a command
        #: The positions of the calls the last execute ran again, after the others (their script loaded).
        self.rerun: list[int] = []

    def call(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue ``script`` with ``keys`` and ``args``: its ``EVALSHA`` alone."""
        self._calls.append((script, keys, args))
        self.pipe.evalsha(script.sha, len(keys), *keys, *args)

    def command(self, name: str, *args: Any) -> None:
        """Queue a plain command (``ZREM`` and the like)."""
        self._calls.append(None)
        self.pipe.execute_command(name, *args)

    def execute(self, *, raise_on_error: bool = True) -> list[Any]:
        """The replies in order; with ``raise_on_error`` False a refused call's reply is its exception."""
        replies = list(self.pipe.execute(raise_on_error=False))
        refused = [
            (index, call)
            for index, (reply, call) in enumerate(zip(replies, self._calls, strict=True))
            if isinstance(reply, NoScriptError) and call is not None
        ]
        self.rerun = [index for index, _ in refused]
        if refused:
            # Each missing script loaded once (on a cluster SCRIPT LOAD reaches every primary), then the
            # refused calls again, in their order, in one more pipeline: a first batch after a restart
            # costs two round trips more, not one per call.
            for script in {id(script): script for _, (script, _, _) in refused}.values():
                self.client.script_load(script.script)
            pipe: Any = self.client.pipeline(transaction=False)
            for _, (script, keys, args) in refused:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            for index, reply in zip(self.rerun, pipe.execute(raise_on_error=False), strict=True):
                replies[index] = reply
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies
