"""Review of issue 40's terminals (review40t): each test here FAILS on the terminals branch's tip.

The start-up refusal of a removed terminal (``service.runtime.admit_terminals``) trusts the set of
terminals flows were started on (``workflows.engine.terminals.mark_used``), which a check that finds no flow in
flight on a terminal empties (``stranded``'s SREM). Nothing orders that SREM against a start still under
way in a process that declares the terminal (a rolling restart): its SADD came before the check, its
flow after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.service.runtime import admit_terminals
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.terminals import TerminalRemoved, stranded
from tests.workflows.engine_support import ScriptedStep, Sent, flow

IT = {"api_key": "key-of-terminal-it", "base_url": "http://127.0.0.1:9/it"}


@pytest.fixture
def engine_with(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Callable[..., Engine]:
    def make(terminals: dict[str, Any]) -> Engine:
        settings = load_settings(
            {"engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3}, "terminals": terminals}
        )
        definition = flow(ScriptedStep("pay"))
        return Engine(settings, redis_client, {definition.kind: definition}, sender=Sent(), clock=clock)

    return make


def test_a_start_on_a_terminal_under_way_while_a_process_without_it_starts_is_not_forgotten(
    engine_with: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moves (a rolling restart removing terminal ``it``): an old process, which still declares ``it``, starts
    a flow on it: its ``mark_used`` SADD is done; before its create, a new process without ``it`` runs its
    start-up check: no flow in flight on ``it`` yet, so the check passes and drops ``it`` from the set; the
    old process's create writes the flow. The flow is in flight on a terminal no new process declares, every
    worker without it parks it, and every later start-up check passes: the flow stays parked for ever with
    nothing refusing or naming it (docs/operations.md: "A process started with a terminal removed while flows
    on it are still in flight refuses to start")."""
    old = engine_with({"it": IT})
    new = engine_with({})
    create = old.store.create

    def create_after_the_new_process_checked(*args: Any, **kwargs: Any) -> Any:
        admit_terminals(new)  # the new process's start-up, between the old one's SADD and its create
        return create(*args, **kwargs)

    monkeypatch.setattr(old.store, "create", create_after_the_new_process_checked)
    record = old.start("demo", {"amount": 5}, terminal="it")
    monkeypatch.undo()
    assert old.get(record.id).state is FlowState.READY and old.get(record.id).terminal == "it"

    # The old process restarts without "it" too (the rolling restart's end): its check must refuse.
    assert stranded(new.redis, new.keys, ["default"]) == {"it": {"demo": 1}}, (
        "a flow in flight on the removed terminal, and the start-up check no longer sees it: the set was emptied "
        f"({new.redis.smembers(new.keys.terminals())!r})"
    )
    with pytest.raises(TerminalRemoved):
        admit_terminals(new)
