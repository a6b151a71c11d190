"""The demo's shared clock: one offset in Redis, seen by every process, only ever moving forward."""

from __future__ import annotations

import time

import pytest

from durapay.service.demo.clock import SharedClock


def test_advancing_one_clock_moves_every_clock_on_the_key(redis_url: str, key_prefix: str) -> None:
    first = SharedClock(redis_url, f"{key_prefix}:clock", refresh=0.0)
    second = SharedClock(redis_url, f"{key_prefix}:clock", refresh=0.0)
    try:
        assert abs(first.now() - time.time()) < 1
        first.advance(86400)
        assert second.now() - time.time() == pytest.approx(86400, abs=1)
        second.advance(60)
        assert first.offset() == pytest.approx(86460)
        with pytest.raises(ValueError, match="only moves forward"):
            first.advance(-1)
    finally:
        first.close()
        second.close()


def test_a_cached_offset_is_refreshed_after_its_interval(redis_url: str, key_prefix: str) -> None:
    reader = SharedClock(redis_url, f"{key_prefix}:clock", refresh=0.05)
    writer = SharedClock(redis_url, f"{key_prefix}:clock")
    try:
        assert reader.offset() == 0.0
        writer.advance(30)
        deadline = time.monotonic() + 2
        while reader.offset() != 30.0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        reader.close()
        writer.close()
