"""Review of issue 40's terminals (review40t): a schedule's charges and a removed terminal. FAILS on the
terminals branch's tip.

A schedule names the terminal its charges run on (``ScheduleInput.terminal``), but the start-up refusal of
a removed terminal (``service.runtime.admit_terminals``) counts flows in flight only, from the set that a
flow's start fills (``workflows.engine.terminals.mark_used``): a schedule's creation adds nothing to it, and
schedules are not read.
"""

from __future__ import annotations

import redis

from durapay.service.runtime import admit_terminals
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.terminals import TerminalRemoved
from tests.workflows.schedules.test_schedules import make_world, monthly, rome


def test_a_terminal_removed_while_an_active_schedule_charges_on_it_is_refused_at_start(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Moves: a monthly schedule created on terminal ``it`` (not fired yet); ``it`` removed from the
    settings, the processes restarted: the start-up check passes (no flow on ``it`` ever started). Each
    charge is then refused at every scheduler look (``unknown terminal 'it'``, logged only): the merchant's
    subscription is never charged and nothing refuses or names it, where a flow in flight on ``it`` would
    have stopped the start (docs/operations.md, Removing a terminal)."""
    before = make_world(redis_client, key_prefix, terminals={"it": {"api_key": "key-of-it"}})
    schedule = before.schedules.create(monthly(terminal="it"))
    after = make_world(redis_client, key_prefix)  # "it" removed, the same data
    refused = None
    try:
        admit_terminals(after.engine)
    except TerminalRemoved as exc:
        refused = exc
    after.at(rome(1))
    started = after.tick()
    assert refused is not None, (
        f"the start went on; schedule {schedule.id} on the removed terminal then started {started} charges "
        f"(its counts: {after.schedules.get(schedule.id).counts})"
    )
    assert schedule.id in str(refused) or "schedule" in str(refused)


def test_a_refusal_names_the_schedules_made_in_bulk_and_the_flows_and_passes_once_they_are_cancelled(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Schedules made in bulk (``create_many``) are noted too; the refusal counts the flows in flight and
    the live schedules, naming the schedules; once every one is cancelled (and the flows ended) the start
    goes on, the terminal still noted."""
    before = make_world(redis_client, key_prefix, terminals={"it": {"api_key": "key-of-it"}})
    made = before.schedules.create_many([(monthly(terminal="it"), None), (monthly(day=2, terminal="it"), None)])
    before.schedules.pause(str(made[1]))  # paused is live too
    before.at(rome(1))
    assert before.schedules.tick() == 1  # its first charge, in flight on "it"
    (flow,) = before.engine.list(kind="mit", limit=10)
    after = make_world(redis_client, key_prefix)
    try:
        admit_terminals(after.engine)
    except TerminalRemoved as exc:
        refused = exc
    else:
        raise AssertionError("the start went on with live schedules and a flow on the removed terminal")
    assert refused.schedules == {"it": sorted(map(str, made))}
    assert sum(refused.stranded["it"].values()) == 1
    assert "terminal 'it': 1 flow in flight (mit 1) and 2 live schedules (" in str(refused)
    for schedule_id in made:  # the first's cancel ends its charge too
        before.schedules.cancel(str(schedule_id))
    assert before.engine.get(flow.id).state is FlowState.CANCELLED, "a schedule's cancel ends its charge in flight"
    admit_terminals(after.engine)
    assert redis_client.smembers(after.engine.keys.terminals()) == {b"it"}
