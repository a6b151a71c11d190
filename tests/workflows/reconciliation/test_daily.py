"""The scheduler's daily run: due at DAILY_AT in TIME_ZONE, over the WINDOW_HOURS that end then, once a
day whatever the number of schedulers; on by default (off in the tests' settings, the demo and chaos)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
import redis

from durapay.config import load_settings
from durapay.config.connect import resend_safe
from durapay.simulator import SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.reconciliation.daily import DailyReconciliation
from tests.workflows.flows.session_engine import session_engine

ROME = ZoneInfo("Europe/Rome")


@pytest.fixture
def flows(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[Engine, SimulatorServer]]:
    with session_engine(redis_client, key_prefix) as made:
        yield made


def daily(engine: Engine, **settings: object) -> DailyReconciliation:
    values = {"daily": True, "daily_at": "03:30", "time_zone": "Europe/Rome", "window_hours": 24.0, **settings}
    engine.settings = engine.settings.model_copy(update={"reconcile": engine.settings.reconcile.model_copy(update=values)})
    return DailyReconciliation(engine, background=False)


def test_once_a_day_at_its_time_over_the_hours_before(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, _ = flows
    clock = engine.clock
    assert isinstance(clock, ManualClock)
    clock.set(datetime(2026, 3, 29, 3, 29, tzinfo=ROME).timestamp())  # the morning summer time starts
    first, second = daily(engine), daily(engine)  # two schedulers
    assert first.tick() == 0 and first.reconciler.reports.latest() is None  # not yet

    clock.advance(120)
    first.tick()
    second.tick()
    report = first.reconciler.reports.latest()
    assert report is not None and report.by == "scheduler"
    assert report.until == datetime(2026, 3, 29, 3, 30, tzinfo=ROME).timestamp()
    assert report.since == datetime(2026, 3, 28, 3, 30, tzinfo=ROME).timestamp()  # the day before: 23 hours
    assert len(first.reconciler.reports.recent()) == 1  # the second scheduler found the day claimed

    clock.advance(3600)
    first.tick()
    assert len(first.reconciler.reports.recent()) == 1  # once a day


def test_on_by_default_off_in_the_test_stacks(flows: tuple[Engine, SimulatorServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """Production's default is on; the tests' settings turn it off (tests/conftest.py), so a scheduler of
    a test runs no reconciliation past the day's time."""
    engine, _ = flows
    assert isinstance(engine.clock, ManualClock)
    engine.clock.set(datetime(2026, 10, 20, 9, 0, tzinfo=ZoneInfo("UTC")).timestamp())  # past 03:00 UTC
    assert not engine.settings.reconcile.daily
    runner = DailyReconciliation(engine, background=False)
    runner.tick()
    assert runner.reconciler.reports.latest() is None
    monkeypatch.delenv("DURAPAY_RECONCILE__DAILY")
    defaults = load_settings().reconcile
    assert defaults.daily and (defaults.daily_at, defaults.time_zone) == ("03:00", "UTC")


def test_days_tile_across_the_autumn_clock_change(flows: tuple[Engine, SimulatorServer]) -> None:
    engine, _ = flows
    clock = engine.clock
    assert isinstance(clock, ManualClock)
    runner = daily(engine)
    windows = []
    for day in (24, 25, 26):  # 2026-10-25 has 25 hours in Rome
        clock.set(datetime(2026, 10, day, 3, 31, tzinfo=ROME).timestamp())
        runner.tick()
        report = runner.reconciler.reports.latest()
        assert report is not None
        windows.append((report.since, report.until))
    assert windows[1][0] == windows[0][1] and windows[2][0] == windows[1][1]
    assert windows[1][1] - windows[1][0] == 25 * 3600


def test_a_run_that_fails_is_run_again_by_a_scheduler(
    flows: tuple[Engine, SimulatorServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The day's claim is a lease given back when the run raises (a lost Redis connection cannot be made
    to happen mid-run otherwise: the run is replaced); another scheduler then runs the day, once."""
    engine, _ = flows
    clock = engine.clock
    assert isinstance(clock, ManualClock)
    first, second = daily(engine), daily(engine)
    clock.set(datetime(2026, 10, 20, 3, 31, tzinfo=ROME).timestamp())

    def lost(*args: object, **kwargs: object) -> None:
        raise ConnectionError("the connection to Redis was lost mid-run")

    monkeypatch.setattr(first.reconciler, "run", lost)
    first.tick()
    assert first.reconciler.reports.latest() is None
    clock.advance(600)
    second.tick()
    first.tick()
    assert len(second.reconciler.reports.recent()) == 1


def test_a_day_the_gateway_stopped_part_way_is_run_again(flows: tuple[Engine, SimulatorServer]) -> None:
    """Review of issue 25: a gateway error ends a run with a report (its ``error``), not an exception, and
    the day was then marked done though its window was not read. It is handed back, run again ten
    minutes later (not at the next second's tick: an outage would spend the day's runs at once)."""
    engine, sim = flows
    assert isinstance(engine.clock, ManualClock)
    engine.clock.set(datetime(2026, 11, 20, 3, 31, tzinfo=ROME).timestamp())
    sim.admin.set_faults(mode="error", operation="list_operations", status=401, count=1000)
    scheduler = daily(engine)
    scheduler.tick()
    first = scheduler.reconciler.reports.latest()
    assert first is not None and first.error is not None, first
    sim.admin.clear_faults()  # the gateway answers again
    engine.clock.advance(60)
    scheduler.tick()
    assert len(scheduler.reconciler.reports.recent()) == 1, "not again within RETRY_SECONDS"
    engine.clock.advance(600)
    scheduler.tick()
    again = scheduler.reconciler.reports.latest()
    assert len(scheduler.reconciler.reports.recent()) == 2 and again is not None and again.error is None, again
    engine.clock.advance(600)
    scheduler.tick()
    assert len(scheduler.reconciler.reports.recent()) == 2, "a day read whole is done"


def test_a_days_claim_sent_again_after_its_answer_was_lost_is_its_own(flows: tuple[Engine, SimulatorServer]) -> None:
    """On a cluster a resend-safe script is sent again after a lost connection (config/connect.py): the
    day's claim sent again with its run's token answers 1 as at first (it answered 0, and that day's run
    slipped by the claim's lease), while another run's claim is still refused."""
    engine, _ = flows
    run = daily(engine)
    key = f"{engine.settings.engine.key_prefix}:reconcile-test-day"
    now = repr(engine.clock.now())
    claim = [key, f"{key}:attempts"]
    assert run._claim(keys=claim, args=["mine", 900, 3600, 3, now]) == 1
    assert run._claim(keys=claim, args=["mine", 900, 3600, 3, now]) == 1
    assert run._claim(keys=claim, args=["other", 900, 3600, 3, now]) == 0
    assert engine.redis.get(f"{key}:attempts") == b"1"
    assert run._claim.sha in resend_safe(engine.redis)
