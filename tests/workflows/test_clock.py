"""The server clock: every process judges leases and due times by the Redis server's time."""

from __future__ import annotations

import time

import redis

from durapay.workflows.clock import ServerClock


class SkewedServer:
    """A server whose clock runs ``skew`` seconds ahead of this host's; counts TIME calls."""

    def __init__(self, skew: float, connect: float = 0.0) -> None:
        self.skew = skew
        self.calls = 0
        self.down = False
        self.connect = connect  # seconds the first call spends connecting before the server reads its time

    def time(self) -> tuple[int, int]:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("server restarting")
        if self.calls == 1:
            time.sleep(self.connect)
        now = time.time() + self.skew
        return int(now), int((now % 1) * 1e6)


def test_a_host_behind_the_server_reads_the_servers_time() -> None:
    server = SkewedServer(-5.0)  # this host is 5 s ahead of the server (far more than a stalled thread's delay)
    clock = ServerClock(server)
    assert abs(clock.now() - (time.time() - 5.0)) < 0.5


def test_the_first_measurement_is_not_skewed_by_opening_the_connection() -> None:
    """A fresh process's first TIME also connects: all of that time falls before the server reads its
    clock, so the middle of that round trip is early by half the connect (0.3-1.2 ms for real; 400 ms
    here, so that the bound below is generous)."""
    server = SkewedServer(0.0, connect=0.4)
    offset = ServerClock(server).offset()
    assert abs(offset) < 0.1, f"offset {offset * 1000:.0f} ms for a server on this host's clock"


def test_the_offset_is_measured_again_only_after_refresh_and_kept_while_the_server_is_down() -> None:
    server = SkewedServer(120.0)
    clock = ServerClock(server, refresh=3600)
    first = clock.now()
    clock.now()
    assert server.calls == ServerClock.SAMPLES
    server.down = True
    clock._measured = float("-inf")  # force a measurement now
    assert abs(clock.now() - first) < 1.0, "the last known offset is kept"


def test_it_agrees_with_a_real_servers_time(redis_client: redis.Redis) -> None:
    clock = ServerClock(redis_client)
    seconds, micros = redis_client.time()
    assert abs(clock.now() - (seconds + micros / 1e6)) < 0.5
