"""Flow states and the transitions between them: one closed table shared by the engine and its tests.

A flow is ``ready`` to run its current step, ``running`` it under a lease, ``retrying`` after a
technical failure, ``waiting`` for the customer (a notification or a signal, with a deadline),
``sleeping`` on a durable timer, or finished: ``succeeded``, ``failed``, ``cancelled``. A flow in
``needs_attention`` stopped because only a person can tell what to do (an ambiguous outcome the gateway
could not clear up, a refused API key); ``retry`` or ``cancel`` moves it on. A flow ``parked`` waits for
a process that holds the definition it started on (``workflows.engine.versions``: a deploy that dropped it, or
a process of an earlier build): never failed, it goes on when a process holding its version claims it.
"""

from __future__ import annotations

from enum import StrEnum


class FlowState(StrEnum):
    READY = "ready"
    RUNNING = "running"
    RETRYING = "retrying"
    WAITING = "waiting"
    SLEEPING = "sleeping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NEEDS_ATTENTION = "needs_attention"
    PARKED = "parked"


S = FlowState

#: No step will run again on its own.
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
#: A person must act (retry or cancel); nothing is due.
STOPPED = TERMINAL | {S.NEEDS_ATTENTION}
#: States in which a step may be claimed (when due, for the timed ones).
CLAIMABLE = frozenset({S.READY, S.RETRYING, S.WAITING, S.SLEEPING, S.RUNNING, S.PARKED})

#: Every allowed transition. RUNNING -> RUNNING is a reclaim after the lease ran out.
TRANSITIONS: dict[FlowState, frozenset[FlowState]] = {
    # A claim may stop a flow for a person instead of running its step (a step claimed too often).
    # ``-> parked`` (claim.lua): the claiming process does not hold the flow's definition.
    S.READY: frozenset({S.RUNNING, S.CANCELLED, S.NEEDS_ATTENTION, S.PARKED}),
    S.RUNNING: frozenset(
        {S.RUNNING, S.READY, S.RETRYING, S.WAITING, S.SLEEPING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.NEEDS_ATTENTION, S.PARKED}
    ),
    # ``-> ready``: a cancel while money is in flight becomes a read of the gateway, due now (transition.lua).
    S.RETRYING: frozenset({S.RUNNING, S.READY, S.CANCELLED, S.NEEDS_ATTENTION, S.PARKED}),
    S.WAITING: frozenset({S.READY, S.RUNNING, S.CANCELLED, S.NEEDS_ATTENTION, S.PARKED}),
    S.SLEEPING: frozenset({S.RUNNING, S.READY, S.CANCELLED, S.NEEDS_ATTENTION, S.PARKED}),
    # A parked flow is claimed by a process that holds its definition, or cancelled.
    S.PARKED: frozenset({S.RUNNING, S.READY, S.CANCELLED, S.NEEDS_ATTENTION}),
    # ``-> succeeded``: a second payment beside the one the outcome names was refunded or kept by a person.
    S.NEEDS_ATTENTION: frozenset({S.READY, S.SUCCEEDED, S.CANCELLED}),
    # A payment reported after the flow ended without it (signal.lua, see money.lua) needs a person.
    S.FAILED: frozenset({S.READY, S.NEEDS_ATTENTION}),
    S.SUCCEEDED: frozenset({S.NEEDS_ATTENTION}),
    S.CANCELLED: frozenset({S.NEEDS_ATTENTION}),
}


def can_move(source: FlowState, target: FlowState) -> bool:
    return target in TRANSITIONS[source]


class IllegalTransition(Exception):
    """A move the table forbids (a bug, or an operator asking for the impossible: say which)."""

    def __init__(self, source: FlowState, target: FlowState, flow_id: str = "") -> None:
        super().__init__(f"flow {flow_id or '?'}: cannot go from {source} to {target}")
        self.source = source
        self.target = target


def lua_prelude() -> str:
    """This table as Lua, prepended to every script that moves a flow (``FlowStore``): the scripts check
    each move against it and name the states from it, so the states and their rules have one home.

    ``MOVES[from][to]``, and the sets ``TERMINAL``, ``STOPPED`` and ``CLAIMABLE`` (``set[name] == true``)."""

    def table(states: frozenset[FlowState]) -> str:
        return "{" + ", ".join(f"{state.value} = true" for state in sorted(states)) + "}"

    moves = ", ".join(f"{source.value} = {table(targets)}" for source, targets in sorted(TRANSITIONS.items()))
    return (
        "-- Generated from workflows/engine/states.py (lua_prelude): the flow states and their moves.\n"
        f"local TERMINAL = {table(TERMINAL)}\n"
        f"local STOPPED = {table(STOPPED)}\n"
        f"local CLAIMABLE = {table(CLAIMABLE)}\n"
        f"local MOVES = {{{moves}}}\n"
        "local function may_move(from, to)\n"
        "  return MOVES[from] ~= nil and MOVES[from][to] == true\n"
        "end\n"
    )
