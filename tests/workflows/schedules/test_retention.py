"""What a schedule keeps is bounded (issue 29, items 2 and 3): a finished schedule is removed after its own
retention (``DURAPAY_SCHEDULES__RETENTION``) with its history and index entries, and an active schedule's
history is capped (``DURAPAY_SCHEDULES__HISTORY_ENTRIES``), its oldest entries summed up in counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from durapay.workflows.engine.store import StartConflict
from durapay.workflows.schedules import ScheduleState
from tests.workflows.schedules.test_schedules import World, make_world, monthly, rome


@pytest.fixture
def world(redis_client: redis.Redis, key_prefix: str) -> Iterator[World]:
    yield make_world(redis_client, key_prefix, schedules={"retention": "1h", "history_entries": 12})


def indexed(world: World, schedule_id: str) -> list[str]:
    """The indexes that list ``schedule_id`` (every schedule, per state, the ended ones)."""
    keys = world.schedules.store.keys
    partition = keys.partition(schedule_id)
    names = [keys.all(partition), keys.ended(partition)] + [keys.by_state(partition, state.value) for state in ScheduleState]
    return [name for name in names if world.engine.redis.zscore(name, schedule_id) is not None]


def test_a_finished_schedule_is_kept_for_its_retention_then_removed_with_its_history_and_indexes(world: World) -> None:
    """Item 2: a completed or cancelled schedule stayed for ever (record, history, the ``schedules`` index
    and its state's). Now, once nothing of it is in flight, its record and history expire after the
    schedules' retention and the scheduler's next passes drop its index entries; a cancelled schedule
    with a charge in flight is kept until that charge is read."""
    redis_ = world.engine.redis
    keys = world.schedules.store.keys
    done = world.schedules.create(monthly(count=1))
    stopped = world.schedules.create(monthly(contractId="c-2"))
    world.at(rome(1, 1, hour=10))
    world.schedules.tick()  # both fire; their flows are not run yet
    kept: list[int] = []

    def cancel_in_flight(contract: str) -> None:  # while its charge is at the gateway: still looked at, kept
        if contract == "c-2":
            world.schedules.cancel(stopped.id)
            kept.append(redis_.ttl(keys.record(stopped.id)))

    world.mit.during = cancel_in_flight
    world.tick()
    world.mit.during = None
    assert kept == [-1]
    world.clock.advance(60)
    world.tick()
    assert world.schedules.get(done.id).state is ScheduleState.COMPLETED
    assert world.schedules.get(stopped.id).state is ScheduleState.CANCELLED
    assert world.schedules.get(stopped.id).counts["charged"] == 1, "its charge in flight was read and counted"
    for schedule_id in (done.id, stopped.id):
        for key in (keys.record(schedule_id), keys.log(schedule_id)):
            assert 0 < redis_.ttl(key) <= 3600, key
        assert len(indexed(world, schedule_id)) == 3  # every schedule, its state's, the ended ones
    going = world.schedules.create(monthly(contractId="c-3"))
    for schedule_id in (done.id, stopped.id):  # as if the hour had passed
        redis_.delete(keys.record(schedule_id), keys.log(schedule_id))
    world.clock.advance(3601)
    world.schedules._last_trim = float("-inf")  # the next pass (every few seconds) is due
    world.tick()
    assert indexed(world, done.id) == [] and indexed(world, stopped.id) == []
    assert [record.id for record in world.schedules.list()] == [going.id]
    assert redis_.ttl(keys.record(going.id)) == -1


def test_an_active_schedules_history_is_capped_and_still_counts_every_occurrence(world: World) -> None:
    """Item 3: each occurrence appended about two entries for ever (an every-minute schedule: 2,900 a day).
    The history now keeps its first entry (how it was created) and the newest ones, at most
    ``history_entries``; the entries between are summed up in one entry that counts them per event, so
    the history still says how many occurrences were charged, declined, retried and skipped."""
    world.mit.script["c-1"] = ["116", "000"] + ["000"] * 30  # a soft decline, retried the next day
    record = world.schedules.create({**monthly(), "rule": {"every": "days", "interval": 1}, "start": "2026-01-01T09:00:00"})
    for day in range(1, 32):
        world.at(rome(1, day, hour=10))
        world.tick()
        world.clock.advance(60)
        world.tick()
    world.schedules.pause(record.id)
    world.at(rome(2, 5, hour=10))
    world.schedules.resume(record.id)  # four occurrences skipped in one entry
    history = world.schedules.history(record.id)
    assert len(history) <= 12
    assert history[0]["event"] == "created"
    summary = history[1]
    assert summary["event"] == "earlier entries" and summary["until"] < history[2]["t"]
    counted: dict[str, Any] = dict(summary["counts"])
    for entry in history[2:]:
        counted[entry["event"]] = counted.get(entry["event"], 0) + entry.get("count", 1)
    final = world.schedules.get(record.id)
    assert counted["charged"] == final.counts["charged"] >= 29
    assert counted["declined"] == final.counts["declined"] == 1
    assert counted["retry scheduled"] == final.counts["retried"] == 1
    assert counted["skipped"] == final.counts["skipped"] >= 4
    assert summary["entries"] >= 60 - 12, "every entry between is summed up once"


def told(history: list[dict[str, Any]]) -> dict[str, int]:
    """What a history says happened, per counter: its summary's counts, then each entry kept (its
    ``count`` of occurrences under its event, and the occurrences a ``missed`` entry skipped or
    coalesced)."""
    counted: dict[str, int] = {}
    rest = history[1:]
    if rest and rest[0]["event"] == "earlier entries":
        counted = dict(rest[0]["counts"])
        rest = rest[1:]
    for entry in rest:
        counted[entry["event"]] = counted.get(entry["event"], 0) + entry.get("count", 1)
        if entry["event"] == "missed":
            for counter in ("skipped", "coalesced"):
                counted[counter] = counted.get(counter, 0) + entry.get(counter, 0)
    return counted


@pytest.mark.parametrize(("policy", "counter"), [("skip", "skipped"), ("once", "coalesced")])
def test_a_capped_history_still_counts_the_occurrences_a_missed_policy_skipped_or_coalesced(
    redis_client: redis.Redis, key_prefix: str, policy: str, counter: str
) -> None:
    """Issue 29 review: occurrences a scheduler that was down skipped (``missed: skip``) or folded into one
    charge (``missed: once``) are told in one ``missed`` entry, which the summary counted as one entry:
    once summed up, the history no longer said how many occurrences were skipped or coalesced. The entry
    says how many (``skipped``, ``coalesced``), and the summary adds them as the record's counters do."""
    world = make_world(redis_client, key_prefix, schedules={"retention": "1h", "history_entries": 10})
    record = world.schedules.create(monthly(missed=policy))
    world.at(rome(6, 2))  # down from before 1 January to 2 June: six occurrences missed
    world.tick()
    for month in range(7, 13):
        world.at(rome(month, 1, hour=10))
        world.tick()
        world.clock.advance(60)
        world.tick()
    history = world.schedules.history(record.id)
    assert history[1]["event"] == "earlier entries" and history[1]["counts"].get("missed") == 6
    final = world.schedules.get(record.id)
    assert final.counts[counter] >= 5
    assert told(history)[counter] == final.counts[counter]


def test_a_create_key_of_a_removed_schedule_is_refused_while_its_charges_could_be_known(world: World) -> None:
    """Issue 29 review: a create key names its schedule (its id is derived from the key), and a schedule
    is now removed after its retention: a create with the same key made a schedule with the same id,
    whose occurrences counted from 0 again, so its flow and order ids were the removed schedule's (a
    flow still kept answered as if charged; the gateway was sent order ids it had seen). A keyed
    schedule that ends leaves a tombstone of its key for the schedules' retention plus the flows' (by
    then every flow it started is gone): a create with the key is refused, saying why, until it goes."""
    redis_ = world.engine.redis
    keys = world.schedules.store.keys
    first = world.schedules.create(monthly(count=1), key="contract-42")
    unkeyed = world.schedules.create(monthly(count=1, contractId="c-2"))
    world.at(rome(1, 1, hour=10))
    world.tick()
    world.clock.advance(60)
    world.tick()
    assert world.schedules.get(first.id).state is ScheduleState.COMPLETED
    tomb = redis_.ttl(keys.tombstone(first.id))
    flows_retention = world.engine.settings.engine.retention
    assert 3600 + flows_retention - 5 <= tomb <= 3600 + flows_retention, tomb
    assert redis_.exists(keys.tombstone(unkeyed.id)) == 0, "only a key can name a schedule again"
    assert world.schedules.create(monthly(count=1), key="contract-42").id == first.id, "alive: the same schedule"
    redis_.delete(keys.record(first.id), keys.log(first.id))  # the schedules' retention passed
    with pytest.raises(StartConflict, match=r"contract-42.*removed.*another key"):
        world.schedules.create(monthly(count=1), key="contract-42")
    assert redis_.exists(keys.record(first.id)) == 0, "nothing written"
    redis_.delete(keys.tombstone(first.id))  # and the flows' retention after it
    assert world.schedules.create(monthly(count=1), key="contract-42").id == first.id
