"""Durable acknowledgements on a real Valkey: which settings wait for what, and where the engine waits.

A Valkey of its own (``appendfsync everysec``, the setting under which a host crash loses acknowledged
writes) whose persistence each test may change with CONFIG SET. Where the engine waits is seen in
the server's own command statistics: one ``WAITAOF`` per start, per claim of a step that moves money,
per signal; none for a claim of a wait or a read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.gateway import Catalogue
from durapay.workflows.engine import Claim, Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.durability import Durability, EarlyWaitaof, NotDurable, early_waitaof, early_waitaof_risk
from tests.workflows.engine_support import ScriptedStep, flow, wait_step


@pytest.fixture(scope="module")
def everysec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    with EmbeddedValkey(Path(tmp_path_factory.mktemp("everysec")), appendfsync="everysec") as server:
        client = redis.Redis.from_url(server.url)
        yield client
        client.close()


@pytest.fixture
def persistence(everysec: redis.Redis) -> Iterator[redis.Redis]:
    """The server, set back to AOF with ``everysec`` after each test."""
    yield everysec
    everysec.config_set("appendonly", "yes")
    everysec.config_set("appendfsync", "everysec")


def waitaofs(client: redis.Redis) -> int:
    stats: Any = client.info("commandstats")
    return int(stats.get("cmdstat_waitaof", {}).get("calls", 0))


def engine_on(client: redis.Redis, definition: Any, **engine_settings: Any) -> Engine:
    # A prefix of its own (an object's id() can be reused by a later test, with that test's flows).
    settings = load_settings({"engine": {"key_prefix": "d" + uuid.uuid4().hex[:12], **engine_settings}})
    return Engine(settings, client, {definition.kind: definition}, clock=ManualClock(1_800_000_000.0))


@pytest.mark.parametrize(
    ("appendonly", "appendfsync", "waits"),
    [("yes", "everysec", True), ("yes", "always", False), ("yes", "no", False), ("no", "everysec", False)],
)
def test_auto_waits_for_the_fsync_only_where_an_acknowledged_write_may_be_lost(
    persistence: redis.Redis, appendonly: str, appendfsync: str, waits: bool
) -> None:
    persistence.config_set("appendfsync", appendfsync)
    persistence.config_set("appendonly", appendonly)
    assert Durability.resolve(persistence, "auto", 0, 2.0).aof is waits
    assert Durability.resolve(persistence, "yes", 0, 2.0).aof is True
    assert Durability.resolve(persistence, "no", 0, 2.0).aof is False


def test_a_server_known_to_confirm_waitaof_early_is_named_under_everysec_only(
    persistence: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The bundled Valkey confirms WAITAOF before its fsync under everysec (shown with an fsync recorder
    in tests/service/chaos/test_aof.py): the engine says so where it matters, and only there."""
    assert early_waitaof(persistence) == f"Valkey {persistence.info('server')['valkey_version']}"
    with caplog.at_level("WARNING", logger="durapay.durability"):
        Durability.resolve(persistence, "auto", 0, 2.0)
    assert "answers WAITAOF before its fsync" in caplog.text and "appendfsync always" in caplog.text
    caplog.clear()
    persistence.config_set("appendfsync", "always")
    with caplog.at_level("WARNING", logger="durapay.durability"):
        Durability.resolve(persistence, "auto", 0, 2.0)
    assert caplog.text == ""


def test_the_engine_waits_after_a_start_a_money_claim_and_a_signal_only(persistence: redis.Redis) -> None:
    pay = ScriptedStep("pay", op=Catalogue.create_moto_order)
    engine = engine_on(persistence, flow(wait_step(), pay))
    before = waitaofs(persistence)
    record = engine.start("demo", {"amount": 5})
    assert waitaofs(persistence) == before + 1, "a start is durable before it is acknowledged"
    assert engine.run_step(record.id, "customer") == "waiting"
    assert waitaofs(persistence) == before + 1, "claiming a wait moves no money: no wait for the disk"
    assert engine.signal(record.id, "paid", {}) == "resumed"
    assert waitaofs(persistence) == before + 2, "a signal is durable before the sender is told"
    engine.run_step(record.id, "customer")
    assert isinstance(engine.claim(record.id, "pay"), Claim)
    assert waitaofs(persistence) == before + 3, "a claim is durable before the call that moves money"


def test_a_read_is_claimed_without_waiting(persistence: redis.Redis) -> None:
    read = ScriptedStep("read", op=Catalogue.get_order)
    engine = engine_on(persistence, flow(read))
    record = engine.start("demo", {"amount": 5})
    before = waitaofs(persistence)
    assert isinstance(engine.claim(record.id, "read"), Claim)
    assert waitaofs(persistence) == before


def test_a_write_that_cannot_be_made_durable_is_refused_and_calls_nothing(persistence: redis.Redis) -> None:
    """With ``appendfsync no`` the server never confirms an fsync in time: the start is not acknowledged,
    and a claim does not run its step."""
    pay = ScriptedStep("pay", op=Catalogue.create_moto_order)
    engine = engine_on(persistence, flow(pay), sync_aof="yes", sync_timeout=0.2)
    persistence.config_set("appendfsync", "no")
    with pytest.raises(NotDurable):
        engine.start("demo", {"amount": 5}, key="k1")
    record = engine.get(engine.store.ids(state=None, kind="demo")[0][1])
    assert engine.claim(record.id, "pay") == "not-durable"
    assert pay.runs == []


def test_a_claim_known_to_move_money_is_made_durable_in_the_same_exchange(persistence: redis.Redis) -> None:
    """The step's task says it moves money: the claim and the fsync wait share one connection, with no
    marker write of their own (two round trips in all)."""
    pay = ScriptedStep("pay", op=Catalogue.create_moto_order)
    engine = engine_on(persistence, flow(pay))
    record = engine.start("demo", {"amount": 5})
    stats: Any = persistence.info("commandstats")
    sets = int(stats.get("cmdstat_set", {}).get("calls", 0))
    before = waitaofs(persistence)
    assert engine.run_step(record.id, "pay", money=True) == "succeeded"
    stats = persistence.info("commandstats")
    assert waitaofs(persistence) == before + 1
    assert int(stats.get("cmdstat_set", {}).get("calls", 0)) == sets, "no marker write"


@pytest.mark.parametrize(
    ("appendfsync", "sync_aof", "refused"),
    [
        ("everysec", "auto", True),
        ("everysec", "yes", True),
        ("everysec", "no", False),  # losing acknowledged writes was chosen
        ("always", "auto", False),  # on disk when acknowledged: WAITAOF is not even asked
        ("always", "yes", False),
    ],
)
def test_a_server_confirming_waitaof_before_its_fsync_is_named_for_the_start_check(
    persistence: redis.Redis, appendfsync: str, sync_aof: str, refused: bool
) -> None:
    """Under ``everysec`` the bundled Valkey confirms ``WAITAOF`` before the fsync the engine waits for:
    the processes refuse to start there (``service.runtime.admit_durability``) unless the operator
    accepts the loss, and this is what they ask."""
    persistence.config_set("appendfsync", appendfsync)
    server = early_waitaof_risk(persistence, sync_aof)
    assert server == (f"Valkey {persistence.info('server')['valkey_version']}" if refused else None)


def test_the_refusal_says_which_server_why_and_the_two_ways_out() -> None:
    message = str(EarlyWaitaof("Valkey 9.1.2", where="redis://127.0.0.1:6390/0"))
    assert message.startswith("Valkey 9.1.2 at redis://127.0.0.1:6390/0 confirms WAITAOF before its fsync")
    assert "appendfsync everysec" in message and "host crash" in message and "redis/redis#13793" in message
    assert "appendfsync always" in message and "DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF=true" in message
    assert "\n" not in message
