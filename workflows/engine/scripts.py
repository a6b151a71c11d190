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

import secrets
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from durapay.config.connect import resend_safe

#: The package scripts and data files are named in (``engine/lua/claim.lua``,
#: ``schedules/lua/create.lua``): the engine's and the features' alike, by their path under workflows/.
WORKFLOWS = __name__.rsplit(".", 2)[0]

#: The marker that a durability wait counts (``FlowStore.sync``): a plain overwrite.
MARKER = "redis.call('SET', KEYS[1], '1') return 1"

#: Whether each script may be sent again after its connection was lost, when it may have run (its answer
#: lost with the connection, as when a Redis node fails over): True only where a second run after a
#: lost answer changes nothing and answers as the first did. ``config.connect`` resends those for up to
#: FAILOVER_WAIT; the others are sent once, and their caller's own recovery applies. Every Lua file of
#: this package is listed (tests/workflows/engine/test_scripts.py checks it), and :func:`register` refuses a
#: name that is not.
RESEND_SAFE: dict[str, tuple[bool, str]] = {
    "engine/lua/claim.lua": (True, "its own claim (lease owner and lease end) is answered ok with the record"),
    "engine/lua/transition.lua": (True, "its own change (the request token 'treq') is answered with the record"),
    "engine/lua/signal.lua": (True, "its own signal (the request token 'sreq') is answered as at first, kept once"),
    "engine/lua/renew.lua": (True, "sets the same lease end again: the same answer"),
    "engine/lua/keep.lua": (True, "keeps the first output only and answers it: the same answer"),
    "engine/lua/request_cancel.lua": (True, "sets the same flag again: the same answer"),
    "marker": (True, "a plain overwrite of the same value"),
    "reconciliation/daily.py:_CLAIM": (True, "its own claim (the run's token) is answered 1 as at first"),
    "engine/lua/target_take.lua": (True, "its own take (the hold's token) is answered ok; a waiter is listed once"),
    "engine/lua/target_flow.lua": (True, "writes the same hold, fence or due again and answers as at first"),
    "service/throttle.py:COUNT": (False, "a second run counts the failure twice; its window still ends"),
    "engine/lua/gate.lua": (False, "a failure would count twice, a probe's take answer 'open'; Gate fails closed"),
    "engine/lua/create.lua": (False, "a second run finds the flow it created and answers otherwise; the start is retried"),
    "engine/lua/create_flow.lua": (False, "needed (the create's one home: create.lua, schedules/lua/fire.lua), never run alone"),
    "engine/lua/take_due.lua": (False, "a second run takes nothing (the first's ids come back after the grace)"),
    "engine/lua/hold.lua": (False, "not checked for a second run; the next claim or sweep holds the flow"),
    "engine/lua/release.lua": (False, "logs the release again; the next claim or sweep releases"),
    "engine/lua/expand.lua": (False, "a second run finds the record plain and answers 'changed'"),
    "engine/lua/keep_until.lua": (False, "moves the version again"),
    "engine/lua/mark.lua": (False, "a second run finds the version moved and answers 0: the person looks again"),
    "engine/lua/reseal.lua": (False, "a second run finds the input already sealed again and answers 0; the next pass skips it"),
    "engine/lua/compact.lua": (False, "a second run finds the record packed; the next packing pass goes on"),
    "engine/lua/unlist.lua": (True, "a second run finds the flow unlisted already: the same answer"),
    "engine/lua/bulk_progress.lua": (False, "a second advance finds the position moved and answers 0: the runner stops"),
    "engine/lua/fair_admit.lua": (True, "a flow admitted or held already answers as at first"),
    "engine/lua/fair_release.lua": (False, "a second run admits more held flows; a cap's room is refound at the next release"),
    "engine/lua/fair_take.lua": (True, "a second run sets the same place and token"),
    "engine/lua/events.lua": (False, "prepended (the outbox), never run alone"),
    "engine/lua/money.lua": (False, "prepended (payments reported), never run alone"),
    "engine/lua/inflight.lua": (False, "prepended (money in flight), never run alone"),
    "engine/lua/target_free.lua": (False, "a second run finds the target gone and names no waiter: their polls take them up"),
    "engine/lua/pause.lua": (False, "prepended (paused kinds), never run alone"),
    "schedules/lua/create.lua": (False, "not checked for a second run; the caller retries"),
    "schedules/lua/update.lua": (False, "not checked for a second run; the caller retries"),
    "schedules/lua/mark.lua": (False, "not checked for a second run; the next tick marks"),
    "schedules/lua/change.lua": (False, "needed (update.lua's and mark.lua's functions), never run alone"),
    "schedules/lua/fire.lua": (
        False,
        "a second run finds the schedule's version moved and answers 0, creating and marking nothing (its flows "
        "are there once, by id); the next look finds them and marks them",
    ),
    "webhooks/lua/fanout.lua": (False, "a second run would queue the deliveries twice"),
    "webhooks/lua/record.lua": (False, "pushes its attempt-log entry before its guard: a second run logs twice"),
    "webhooks/lua/replay.lua": (False, "a second run would queue the replay twice"),
}


def register(client: Any, name: str, text: str) -> Script:
    """``client.register_script(text)`` for the script ``name`` (its path in this package, or a name in
    :data:`RESEND_SAFE`), declared to ``client`` as resend-safe when it is (``config.connect.resendable``).
    KeyError for a script not classified: every script states whether a second run is harmless."""
    safe, _why = RESEND_SAFE[name]
    script: Script = client.register_script(text)
    if safe:
        resend_safe(client).add(script.sha)
    return script


def request_token() -> str:
    """A token for one request of a resend-safe script: written with its effect, so that the same request
    sent again after a lost answer recognises it (12 characters: a few bytes per flow)."""
    return secrets.token_hex(6)


def source(path: str) -> str:
    """A Lua script of the engine by its path inside this package (``engine/lua/claim.lua``,
    ``schedules/lua/create.lua``): read as package data, from the installed package whatever else is
    on ``sys.path`` (a package name written as a string once found the checkout's folder instead)."""
    return package_file(path).read_text()


#: A script's first line naming the files of shared functions it calls (``-- needs: engine/lua/events.lua
#: engine/lua/create_flow.lua``), by their path in this package: :func:`assemble` puts them before it.
NEEDS = "-- needs:"


def needs(path: str) -> list[str]:
    """The files ``path`` declares it calls functions of (its first line, :data:`NEEDS`)."""
    first = source(path).split("\n", 1)[0]
    return first.removeprefix(NEEDS).split() if first.startswith(NEEDS) else []


def assemble(path: str) -> str:
    """The script ``path`` with the shared functions it needs (:data:`NEEDS`, and theirs in turn) before
    it, each file once, a file before those that need it: so that a function has one home (the flow's
    create is ``create_flow.lua``'s, run alone by ``create.lua`` and inside the scheduler's
    ``fire.lua``) and is not a copy in each script that runs it."""
    ordered: list[str] = []

    def visit(name: str, seen: tuple[str, ...]) -> None:
        if name in seen:
            raise ValueError(f"Lua files needing each other: {' -> '.join((*seen, name))}")
        for needed in needs(name):
            visit(needed, (*seen, name))
        if name not in ordered:
            ordered.append(name)

    visit(path, ())
    return "".join(source(name) for name in ordered)


def package_file(path: str) -> resources.abc.Traversable:
    """A data file of the workflows package (Lua scripts, compression dictionaries) by its path in it."""
    return resources.files(WORKFLOWS).joinpath(path)


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
