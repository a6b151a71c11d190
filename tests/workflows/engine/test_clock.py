"""The server clock: every process judges leases and due times by the Redis server's time."""

from __future__ import annotations

import time

import redis

from durapay.workflows.engine.clock import ServerClock


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


def test_an_id_made_of_a_moment_is_never_taken_for_a_card_number() -> None:
    """The ids durapay makes of a moment (a reconciliation report's, a pause's, a webhook test event's)
    carried its milliseconds, 13 digits that pass the Luhn check one time in ten: the masking of every
    text then hid the id (a 409 naming a report the caller could not look up; a flaky test)."""
    from durapay.workflows.engine.clock import moment_id
    from durapay.workflows.engine.sensitive import luhn, mask_text
    from durapay.workflows.reconciliation.report import new_report_id

    luhn_valid = next(ms for ms in range(1_796_226_439_800, 1_796_226_439_900) if luhn(str(ms)))
    now = luhn_valid / 1000
    assert mask_text(f"rec_{luhn_valid}_59f292") != f"rec_{luhn_valid}_59f292", "the old form was masked"
    for made in (moment_id(now), new_report_id(now)):
        assert mask_text(made) == made, made
    assert moment_id(now) < moment_id(now + 0.001) < moment_id(now + 86400), "ordered as the moments are"
