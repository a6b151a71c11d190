"""Process wiring that is not covered through the commands: the start-up heap taken out of the GC, the
start check of the server's persistence (a ``WAITAOF`` answered before its fsync is refused), and
what ``durapay.connect`` leaves behind: nothing open after close, no Valkey after a failed build."""

from __future__ import annotations

import gc
import logging
import os
import signal
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import durapay
from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.service.runtime import Runtime, admit_durability, build_runtime, freeze_startup_heap
from durapay.workflows.engine.durability import EarlyWaitaof

MOTO = {
    "order": {"orderId": "early-1", "amount": "1500", "currency": "EUR"},
    "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
}


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_start_up_objects_are_frozen_and_later_cycles_are_still_collected() -> None:
    made_before = _Node()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        tracked = (gc.get_objects(generation) for generation in range(3))
        assert not any(item is made_before for objects in tracked for item in objects), "collections skip it"
        later = _Node()
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None, "a cycle made after the freeze is collected as before"
    finally:
        gc.unfreeze()


@pytest.fixture(scope="module")
def everysec_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedValkey(Path(tmp_path_factory.mktemp("everysec")), appendfsync="everysec") as server:
        yield server.url


def runtime_on(url: str, key_prefix: str, **engine: Any) -> Runtime:
    built = build_runtime(load_settings({"engine": {"key_prefix": key_prefix, **engine}}), redis_url=url)
    built.engine.sender = None
    return built


def config_reads(client: Any) -> int:
    stats: Any = client.info("commandstats")
    return int(stats.get("cmdstat_config|get", {}).get("calls", 0))


def test_a_server_confirming_waitaof_early_is_refused_at_start_unless_accepted(
    everysec_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    refused = runtime_on(everysec_url, key_prefix)
    try:
        with pytest.raises(EarlyWaitaof) as caught:
            admit_durability(refused, where="the test's Valkey")
        version = refused.redis.info("server")["valkey_version"]
        assert str(caught.value).startswith(f"Valkey {version} at the test's Valkey confirms WAITAOF before its fsync")
    finally:
        refused.close()
    accepted = runtime_on(everysec_url, key_prefix, accept_early_waitaof=True)
    try:
        with caplog.at_level("WARNING", logger="durapay.durability"):
            durability = admit_durability(accepted)
        assert durability.aof and "answers WAITAOF before its fsync" in caplog.text
        before = config_reads(accepted.redis)
        accepted.engine.start("moto", MOTO)
        assert config_reads(accepted.redis) == before, "resolved at start, not at the first payment"
    finally:
        accepted.close()


def test_nothing_is_refused_under_appendfsync_always(redis_url: str, key_prefix: str) -> None:
    built = runtime_on(redis_url, key_prefix)
    try:
        assert not admit_durability(built).aof
    finally:
        built.close()


def running_in(folder: Path) -> list[int]:
    """Ids of the processes whose command line names ``folder`` (an embedded Valkey's ``--dir``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not a process
            continue
        if str(folder).encode() in line:
            found.append(int(entry.name))
    return found


def test_connect_from_a_folder_no_store_serves_refuses_naming_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41, finding 1: from another folder ``durapay.connect()`` made a new, empty store there, wrote the
    flow into it (card included) and ``wait`` timed out: a payment no worker would ever run. It refuses
    now, as the CLI does, naming the store it looked for and how to point at one, and writes nothing."""
    for name in [name for name in os.environ if name.startswith("DURAPAY_") and name != "DURAPAY_RECONCILE__DAILY"]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(durapay.NoFlowStore) as refused:
        durapay.connect()
    text = str(refused.value)
    assert str(tmp_path / ".durapay" / "valkey") in text, text
    assert "DURAPAY_DATA_DIR" in text and "DURAPAY_REDIS_URL" in text and "durapay dev" in text, text
    assert isinstance(refused.value, durapay.SettingsError)
    assert list(tmp_path.iterdir()) == [], "nothing written, no store made"


def test_a_wait_on_a_store_no_worker_serves_says_so(redis_url: str, key_prefix: str) -> None:
    """The same newcomer's ``engine.wait`` said only "still ready at step pay after 30s"."""
    with durapay.connect(load_settings({"engine": {"key_prefix": key_prefix}}), redis_url=redis_url) as engine:
        engine.sender = None  # nothing sent to Celery: no worker of this prefix runs anyway
        flow = engine.start("moto", {**MOTO, "order": {**MOTO["order"], "orderId": f"idle{key_prefix[-10:]}"}})
        with pytest.raises(TimeoutError, match=r"no worker serves this store .*durapay worker"):
            engine.wait(flow.id, timeout=0.1)


def test_a_build_that_fails_stops_the_embedded_valkey_it_started(tmp_path: Path) -> None:
    """No Redis URL, so the build starts the data folder's Valkey (as ``durapay worker`` does); then the build
    fails (a Redis Cluster asked of a single server). The Valkey ran on, recorded in server.json, after the
    build raised."""
    broker = "redis://127.0.0.1:9/0"  # never reached: the build fails first
    settings = load_settings({"redis_url": "", "data_dir": str(tmp_path), "redis_cluster": True, "broker_url": broker})
    folder = tmp_path / "valkey"
    try:
        with pytest.raises(Exception, match=r"(?i)cluster"):
            build_runtime(settings)
        assert not (folder / "server.json").exists()
        assert running_in(folder) == [], "the embedded Valkey still runs"
    finally:
        for pid in running_in(folder):  # only what this test started, should the assertion fail
            os.kill(pid, signal.SIGTERM)


def test_close_releases_every_connection_connect_opened(redis_url: str, key_prefix: str) -> None:
    """Five rounds of connect, a start (its first step sent to Celery's broker), close: the server has
    as many clients as before (Celery's producer and pool kept two a round)."""
    settings = load_settings({"engine": {"key_prefix": key_prefix}, "gateway": {"base_url": "http://127.0.0.1:9/api"}})
    watcher = redis.Redis.from_url(redis_url)
    try:
        before = len(watcher.client_list())
        for n in range(5):
            with durapay.connect(settings, redis_url=redis_url) as engine:
                engine.start("moto", {**MOTO, "order": {**MOTO["order"], "orderId": f"close{n}{key_prefix[-10:]}"}})
        names = [client.get("cmd") for client in watcher.client_list()]
        assert len(names) <= before, f"{len(names) - before} connections left open after 5 connect/close: {names}"
    finally:
        watcher.close()


def test_closing_one_runtime_leaves_another_on_the_same_broker_sending(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """kombu shares one pool per broker address across the process: a runtime's close empties it, never
    closes it (closed, the other runtime's next send failed: Acquire on closed pool)."""
    settings = load_settings({"engine": {"key_prefix": key_prefix}, "gateway": {"base_url": "http://127.0.0.1:9/api"}})
    first, second = build_runtime(settings, redis_url=redis_url), build_runtime(settings, redis_url=redis_url)
    order = MOTO["order"]
    try:
        for n, runtime in enumerate((first, second)):  # both have sent: the pools hold their connections
            runtime.engine.start("moto", {**MOTO, "order": {**order, "orderId": f"two{n}{key_prefix[-10:]}"}})
        first.close()
        with caplog.at_level(logging.ERROR):
            second.engine.start("moto", {**MOTO, "order": {**order, "orderId": f"two2{key_prefix[-10:]}"}})
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    finally:
        second.close()
