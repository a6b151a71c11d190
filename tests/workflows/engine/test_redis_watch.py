"""``RedisWatch``: one log line per change of Redis's state, whatever the number of failed attempts."""

from __future__ import annotations

import logging

import pytest
import redis

from durapay.workflows.engine.redis_watch import RedisWatch, is_redis_down


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_when_lost_and_one_when_back(caplog: pytest.LogCaptureFixture) -> None:
    clock = Ticks()
    watch = RedisWatch("scheduler", logging.getLogger("test.watch"), 0.5, clock=clock)
    caplog.set_level(logging.INFO, logger="test.watch")
    watch.ok()
    assert caplog.records == [], "nothing to say while Redis answers"
    for _ in range(50):
        assert watch.failed(redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379.\nConnection refused."))
        clock.now += 0.5
    assert not watch.up
    watch.ok()
    watch.ok()
    assert watch.up
    assert [record.getMessage() for record in caplog.records] == [
        "scheduler: Redis unreachable (Error 111 connecting to 127.0.0.1:6379. Connection refused.); retrying every 0.5s",
        "scheduler: Redis is back after 25.0s (50 attempts failed)",
    ]
    assert all(record.exc_info is None for record in caplog.records), "no tracebacks"


def test_other_errors_are_left_to_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    watch = RedisWatch("scheduler", logging.getLogger("test.watch"), 1.0)
    assert not watch.failed(KeyError("a bug"))
    assert not watch.failed(redis.ResponseError("WRONGTYPE"))
    assert watch.up and caplog.records == []


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("refused"),
        redis.TimeoutError("timed out"),
        redis.BusyLoadingError("LOADING"),
        redis.ReadOnlyError("READONLY"),
        ConnectionResetError(104, "reset"),
    ],
)
def test_what_counts_as_redis_down(exc: BaseException) -> None:
    assert is_redis_down(exc)
