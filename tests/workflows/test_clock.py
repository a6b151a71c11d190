"""The server clock: every process judges leases and due times by the Redis server's time."""

from __future__ import annotations

import time

import redis

from workflows.clock import ServerClock


class SkewedServer:
    """A server whose clock runs ``skew`` seconds ahead of this host's; counts TIME calls."""

    def __init__(self, skew: float) -> None:
        self.skew = skew
        self.calls = 0
        self.down = False

    def time(self) -> tuple[int, int]:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("server restarting")
        now = time.time() + self.skew
        return int(now), int((now % 1) * 1e6)


def test_a_host_behind_the_server_reads_the_servers_time() -> None:
    server = SkewedServer(-5.0)  # this host is 5 s ahead of the server (far more than a stalled thread's delay)
    clock = ServerClock(server)
    assert abs(clock.now() - (time.time() - 5.0)) < 0.5


def test_the_offset_is_measured_again_only_after_refresh_and_kept_while_the_server_is_down() -> None:
    server = SkewedServer(120.0)
    clock = ServerClock(server, refresh=3600)
    first = clock.now()
    clock.now()
    assert server.calls == 1
    server.down = True
    clock._measured = float("-inf")  # force a measurement now
    assert abs(clock.now() - first) < 1.0, "the last known offset is kept"


def test_it_agrees_with_a_real_servers_time(redis_client: redis.Redis) -> None:
    clock = ServerClock(redis_client)
    seconds, micros = redis_client.time()
    assert abs(clock.now() - (seconds + micros / 1e6)) < 0.5
