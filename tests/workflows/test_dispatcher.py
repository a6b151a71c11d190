"""The dispatcher's loop through a Redis outage: it waits Redis out and says so in two lines.

``durapay scheduler`` with Redis unreachable printed a warning per tick and a traceback per ticker per
tick (1,290 lines with 46 tracebacks in 12 s). Here a dispatcher with the schedules' ticker runs on its
own Valkey, which is killed for forty ticks and started again: the log holds one line for the loss and
one for the return, no traceback, and dispatching goes on.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from config import load_settings
from config.embedded import EmbeddedValkey
from service.runtime import build_runtime
from tests.waiting import wait_until
from workflows.dispatcher import Dispatcher
from workflows.schedules import Schedules


@pytest.mark.integration
def test_a_redis_outage_is_two_lines_without_tracebacks(
    tmp_path: Path, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="durapay.dispatcher")
    valkey = EmbeddedValkey(tmp_path / "valkey")
    valkey.start()
    runtime = build_runtime(
        load_settings({"engine": {"key_prefix": key_prefix, "partitions": 2}}), redis_url=valkey.url, rng=random.Random(5)
    )
    runtime.engine.sender = None
    ticks = 0

    def count() -> int:
        nonlocal ticks
        ticks += 1
        return 0

    dispatcher = Dispatcher(runtime.engine, interval=0.02, tickers=[count, Schedules(runtime.engine).tick], name="scheduler")
    try:
        dispatcher.start()
        heartbeat = runtime.engine.keys.heartbeat("scheduler")
        wait_until(lambda: runtime.redis.exists(heartbeat), 30, "the dispatcher's first tick")
        valkey.kill()
        down_at = ticks
        wait_until(lambda: ticks >= down_at + 40, 60, "forty ticks while Redis is down")
        valkey.start()
        runtime.redis.delete(heartbeat)
        wait_until(lambda: runtime.redis.exists(heartbeat), 30, "a tick after Redis came back")
    finally:
        dispatcher.stop()
        runtime.close()
        valkey.stop()
    said = [r for r in caplog.records if r.name == "durapay.dispatcher" and r.levelno >= logging.INFO]
    assert [r.getMessage().split(" (")[0].rstrip("0123456789.s") for r in said] == [
        "scheduler: Redis unreachable",
        "scheduler: Redis is back after ",
    ]
    assert "retrying every 0.02s" in said[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records), "no tracebacks"
