"""Process wiring that is not covered through the commands: the start-up heap taken out of the GC, and
the start check of the server's persistence (a ``WAITAOF`` answered before its fsync is refused)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.service.runtime import Runtime, admit_durability, build_runtime, freeze_startup_heap
from durapay.workflows.durability import EarlyWaitaof

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
