"""The start path's cost in Redis commands and round trips, against the figures recorded beside this test.

Starting a flow is every start's cost: the API's, the client's, the scheduler's, the dunning retries'.
It grew 2.4x across changes that each looked small (issue 42); times cannot guard it on a shared machine,
counts can. So this test counts, on a Valkey of its own, what one ``engine.start`` (a card-on-file MIT
payment, and a card payment whose card is sealed), one ``engine.start_many`` of 100 and one fired
schedule occurrence send: the commands the server ran (``INFO commandstats`` after ``CONFIG
RESETSTAT``: the scripts' own ``redis.call``\\ s included, so a loop of writes in a script counts as
what it is) and the round trips the client made (a counting connection: one per command sent alone, one
per pipeline). Under ``appendfsync always`` (durapay's own Valkey) and ``everysec`` (where an
acknowledged start waits for its ``WAITAOF``).

The figures are in ``tests/workflows/start_costs.json``. A change that moves one fails here with both
figures; it is moved only on purpose, in the commit that says why (``RECORD_START_COSTS=1``
rewrites the file from a run, for that commit). The times are ``bench/bench_schedules.py``'s.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.compact import Compactor
from durapay.workflows.flows import REGISTRY
from durapay.workflows.flows.examples import MAKERS
from durapay.workflows.pauses import Pauses
from durapay.workflows.schedules import MIT_KIND, Schedules
from tests.workflows.engine_support import ScriptedStep, Sent, flow

FIGURES = Path(__file__).with_name("start_costs.json")
RECORD = os.environ.get("RECORD_START_COSTS") == "1"
CREATED = datetime(2030, 1, 1, tzinfo=UTC)
#: The two schedules' first occurrences: the first fires in the warm-up tick, the second is measured.
WARM_UP, MEASURED = datetime(2030, 1, 30, 9, 0, tzinfo=UTC), datetime(2030, 1, 31, 9, 0, tzinfo=UTC)
#: The measurement's own command (the statistics are read by INFO after they are taken).
OWN = frozenset({"config|resetstat"})


class Trips:
    """Round trips: each ``send_packed_command`` is one (a command alone, or a whole pipeline)."""

    def __init__(self) -> None:
        self.count = 0
        self.sent: list[str] = []


def names(packed: Any) -> str:
    """The command names of one round trip (``+`` between a pipeline's), for the failure's message."""
    raw = b"".join(packed) if isinstance(packed, list | tuple) else bytes(packed)
    parts, found, at = raw.split(b"\r\n"), [], 0
    while at < len(parts) and parts[at].startswith(b"*"):
        found.append(parts[at + 2].decode(errors="replace"))
        at += 1 + 2 * int(parts[at][1:])
    return "+".join(found)


def counting_client(url: str, trips: Trips) -> redis.Redis:
    class Counting(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            trips.count += 1
            trips.sent.append(names(command))
            super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    return redis.Redis(connection_pool=redis.ConnectionPool.from_url(url, connection_class=Counting))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedValkey]:
    with EmbeddedValkey(Path(tmp_path_factory.mktemp("start-costs"))) as valkey:
        yield valkey


@pytest.fixture(scope="module")
def recorded() -> Iterator[dict[str, Any]]:
    figures: dict[str, Any] = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    measured: dict[str, Any] = {}
    yield measured if RECORD else figures
    if RECORD:
        FIGURES.write_text(json.dumps(measured, indent=2, sort_keys=True) + "\n")


class Counter:
    """One engine on a counting client, and the server's own command statistics read by another."""

    def __init__(self, url: str, prefix: str, mode: str) -> None:
        self.mode = mode  # the server's appendfsync
        self.sent: list[str] = []  # the last count's round trips, by their command names
        self.trips = Trips()
        self.client = counting_client(url, self.trips)
        self.stats = redis.Redis.from_url(url)
        settings = load_settings({"engine": {"key_prefix": prefix}})
        self.engine = Engine(settings, self.client, REGISTRY, sender=Sent(), clock=ManualClock(CREATED.timestamp()))

    def count(self, action: Callable[[], Any]) -> dict[str, Any]:
        self.stats.config_resetstat()
        before = self.trips.count
        self.trips.sent.clear()
        action()
        trips = self.trips.count - before
        stats: Any = self.stats.info("commandstats")
        commands = {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()}
        commands = {name: calls for name, calls in sorted(commands.items()) if name not in OWN}
        self.sent = list(self.trips.sent)  # not recorded: shown when a figure moves
        return {"round_trips": trips, "commands": commands, "total": sum(commands.values())}

    def close(self) -> None:
        self.client.close()
        self.stats.close()


@pytest.fixture(params=["always", "everysec"])
def counter(request: pytest.FixtureRequest, server: EmbeddedValkey) -> Iterator[Counter]:
    admin = redis.Redis.from_url(server.url)
    admin.config_set("appendfsync", request.param)
    made = Counter(server.url, "sc" + uuid.uuid4().hex[:12], request.param)  # a prefix of each test's own
    yield made
    made.close()
    admin.config_set("appendfsync", "always")
    admin.close()


def compare(recorded: dict[str, Any], counter: Counter, what: str, measured: dict[str, Any]) -> None:
    mode, sent = counter.mode, ", ".join(counter.sent)
    if RECORD:
        recorded.setdefault(mode, {})[what] = measured
        return
    figure = recorded.get(mode, {}).get(what)
    assert measured == figure, (
        f"{what} under appendfsync {mode}: {measured['total']} commands in {measured['round_trips']} round trip(s) now "
        f"{measured['commands']}, recorded in {FIGURES.name}: "
        + (f"{figure['total']} in {figure['round_trips']} {figure['commands']}" if figure else "nothing")
        + f"; the round trips now: {sent}. The start path's cost moves only on purpose: if this change means it, "
        "record the new figure (RECORD_START_COSTS=1) in the commit that says why; otherwise find the command it added."
    )


def example(kind: str, tag: str) -> dict[str, Any]:
    data: dict[str, Any] = MAKERS[kind](tag, CREATED).data
    return data


@pytest.mark.parametrize("kind", ["mit", "moto"])
def test_one_start_costs_what_is_recorded(counter: Counter, recorded: dict[str, Any], kind: str) -> None:
    engine = counter.engine
    for n in range(2):  # scripts loaded, durability read, the connections made (the wait's is pinned)
        engine.start(kind, example(kind, f"w{kind[:3]}0000{n}"))
    measured = counter.count(lambda: engine.start(kind, example(kind, f"m{kind[:3]}00001")))
    compare(recorded, counter, f"start {kind}", measured)


def test_a_start_many_of_100_costs_what_is_recorded(counter: Counter, recorded: dict[str, Any]) -> None:
    engine = counter.engine
    for n in range(2):
        engine.start_many([("mit", example("mit", f"scwarm000{n}"), None)], trusted=True)
    starts = [("mit", example("mit", f"scbat{n:05d}"), None) for n in range(100)]
    results: list[Any] = []
    measured = counter.count(lambda: results.extend(engine.start_many(starts, trusted=True)))
    assert all(isinstance(result, str) for result in results), results
    compare(recorded, counter, "start_many of 100 mit", measured)


def schedule(at: datetime, contract: str) -> dict[str, Any]:
    return {
        "contractId": contract,
        "amount": 1990,
        "currency": "EUR",
        "description": "Monthly plan",
        "rule": {"every": "month", "day": at.day},
        "timezone": "UTC",
        "start": at.isoformat(),
    }


def test_a_fired_occurrence_costs_what_is_recorded(counter: Counter, recorded: dict[str, Any]) -> None:
    engine, clock = counter.engine, counter.engine.clock
    assert isinstance(clock, ManualClock)
    # The warm-up on another prefix of the same client and server (the schedules' scripts loaded): this
    # engine's own warm-up is a start, so that its tick looks at the one schedule measured only.
    other = Engine(load_settings({"engine": {"key_prefix": engine.keys.prefix + "w"}}), counter.client, REGISTRY, clock=clock)
    Schedules(other).create(schedule(WARM_UP, "ct-warm"))
    clock.set(WARM_UP.timestamp() + 1)
    assert Schedules(other).tick() == 1
    for n in range(2):  # durability read, the connections made (the wait's is pinned)
        engine.start("mit", example("mit", f"scwarm000{n}"))
    Schedules(engine).create(schedule(MEASURED, "ct-measured"))
    clock.set(MEASURED.timestamp() + 1)
    # A fresh scheduler's tick: it reads the pauses and trims once, as every tick may (both on monotonic
    # time, which this test does not hold still).
    engine.pauses = Pauses(engine.store, engine.registry, clock.now)
    scheduler = Schedules(engine)
    fired: list[int] = []
    measured = counter.count(lambda: fired.append(scheduler.tick()))
    assert fired == [1]
    assert len(engine.store.ids(kind=MIT_KIND)) == 3
    compare(recorded, counter, "one fired occurrence", measured)


def test_a_flows_steps_and_its_packing_cost_what_is_recorded(counter: Counter, recorded: dict[str, Any]) -> None:
    """The rest of a flow's cost in the store (issue 39): a worker running a 3-step flow's steps one after
    the other (the first claimed alone, each later claim in the round trip of the completion before it,
    the middle step's call moving money), then the dispatcher's packing pass of the finished flow. The
    gateway's own calls are scripted: what is counted is the record's claims, completions and packing."""
    steps = (ScriptedStep("a", op=None), ScriptedStep("b"), ScriptedStep("c", op=None))
    settings = load_settings({"engine": {"key_prefix": counter.engine.keys.prefix + "s"}})
    clock = ManualClock(CREATED.timestamp())
    engine = Engine(settings, counter.client, {"demo": flow(*steps)}, sender=Sent(), clock=clock)
    compactor = Compactor(counter.client, engine.keys, engine.orders, tell=engine.tell_holder)
    for n in range(2):  # scripts loaded, durability read, the connections made (the wait's is pinned)
        warm = engine.start("demo", {"amount": 100 + n})
        assert engine.run_step(warm.id, "a", worker="w", follow=5) and engine.get(warm.id).state.value == "succeeded"
    clock.advance(10)
    compactor.run(now=clock.now())
    started = engine.start("demo", {"amount": 1990})
    measured = counter.count(lambda: engine.run_step(started.id, "a", worker="w", follow=5))
    assert engine.get(started.id).state.value == "succeeded"
    compare(recorded, counter, "steps of a 3-step flow", measured)
    clock.advance(10)
    packed: list[int] = []
    measured = counter.count(lambda: packed.append(compactor.run(now=clock.now())))
    assert packed == [1]
    compare(recorded, counter, "packing a finished flow", measured)
