"""The dispatcher's loop through a Redis outage: it waits Redis out and says so in two lines.

``durapay scheduler`` with Redis unreachable printed a warning per tick and a traceback per ticker per
tick (1,290 lines with 46 tracebacks in 12 s). Here a dispatcher with the schedules' ticker runs on its
own Valkey, which is killed for forty ticks and started again: the log holds one line for the loss and
one for the return, no traceback, and dispatching goes on. And its pass trims the event streams to their
retention.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.service.runtime import build_runtime
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.events import EventFeed
from durapay.workflows.schedules import Schedules
from tests.waiting import wait_until
from tests.workflows.engine_support import ScriptedStep, flow


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


def test_a_dispatcher_pass_drops_the_events_older_than_the_retention(make_engine: Any) -> None:
    """``DURAPAY_EVENTS__RETENTION`` was read by nothing and the streams grew without bound. Stream
    ids are stamped by the server, so the retention is judged by its clock: the engine's own (here a
    manual clock years away) has no say. Old entries are written with explicit ids, in every stream,
    flows' and schedules'; the events the engine writes now stay."""
    engine, _ = make_engine(flow(ScriptedStep("pay")))
    retention_ms = int(engine.settings.events.retention * 1000)
    seconds, micros = engine.redis.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    old = [now - retention_ms - 3_600_000 + n for n in range(300)]  # an hour past it: several stream nodes
    young = now - retention_ms + 3_600_000  # an hour inside it
    streams = EventFeed(engine.redis, engine.keys).streams()
    pipe = engine.redis.pipeline(transaction=False)
    for key in streams.values():
        for moment in [*old, young]:
            pipe.xadd(key, {"e": json.dumps({"type": "flow.created", "time": moment / 1000})}, id=f"{moment}-0")
    pipe.execute()
    fresh = engine.start("demo", {"amount": 5})

    Dispatcher(engine).tick()

    left = {tag: [entry.decode() for entry, _ in engine.redis.xrange(key)] for tag, key in streams.items()}
    assert all(int(entry.split("-")[0]) >= now - retention_ms for entries in left.values() for entry in entries), left
    assert all(f"{young}-0" in entries for entries in left.values())
    assert [event.body["flow"] for event, _ in engine.events() if event.time > now / 1000 - 60] == [fresh.id]
