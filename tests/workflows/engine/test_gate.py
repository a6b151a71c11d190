"""The gateway gate's decisions (``engine/lua/gate.lua`` through ``workflows.engine.gate.Gate``) on the session's Valkey,
with an injected time: breaker closed / open / half open with one probe, the limiter's reserved slots,
and the hold of a 429's Retry-After."""

from __future__ import annotations

import json

import pytest
import redis

from durapay.config import load_settings
from durapay.gateway import GatewayTimeout, RateLimited, ServerError
from durapay.workflows.engine.events import EventFeed
from durapay.workflows.engine.gate import Gate, ShareSize
from durapay.workflows.engine.keys import Keys

T0 = 1_800_000_000.0


class Time:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def make_gate(client: redis.Redis, prefix: str, time: Time, **health: object) -> Gate:
    settings = load_settings(
        {"gateway_health": {"failures": 3, "window_seconds": 10, "open_seconds": 20, "rate_per_second": 10, "burst": 5, **health}}
    )
    return Gate(client, Keys(prefix=prefix, partitions=3), settings.gateway_health, settings.gateway, now=time)


def server_error() -> ServerError:
    return ServerError("create_moto_order: HTTP 503: down", status_code=503)


def stream_events(client: redis.Redis, gate: Gate) -> list[dict[str, object]]:
    return [json.loads(fields[b"e"]) for _, fields in client.xrange(gate.stream)]


def test_breaker_opens_after_consecutive_failures_then_one_probe_closes_it(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time)
    assert gate.take().verdict == "go"
    assert gate.failed(server_error()) is None
    assert gate.failed(GatewayTimeout("no answer", sent=True)) is None
    assert gate.take().report  # failures counted: the next success is reported
    opened = gate.failed(server_error())
    assert opened == pytest.approx(20)
    assert gate.status().state == "open"
    assert [e["type"] for e in stream_events(redis_client, gate)] == ["gateway.unavailable"]

    time.t += 5
    refused = gate.take()
    assert (refused.verdict, refused.after) == ("open", pytest.approx(15))
    time.t += 15  # half open: one probe, the others look again within a second
    probe = gate.take()
    assert (probe.verdict, probe.report) == ("go", True)
    other = gate.take()
    assert other.verdict == "open" and other.after <= 1.0
    assert gate.status().state == "half_open"
    gate.succeeded()
    assert gate.status().state == "closed"
    after = gate.take()
    assert (after.verdict, after.report) == ("go", False)  # the happy path reports nothing: one round trip
    recovered = stream_events(redis_client, gate)[-1]
    assert recovered["type"] == "gateway.recovered"
    assert recovered["data"] == {"terminal": "default", "since": pytest.approx(T0), "seconds": pytest.approx(20)}
    assert gate.status().counters["deferred"] == 2


def test_a_failed_probe_opens_the_breaker_again_and_a_dead_probe_lease_lets_another_probe(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, failures=1)
    assert gate.failed(server_error()) == pytest.approx(20)
    time.t += 20
    assert gate.take().verdict == "go"  # the probe
    assert gate.failed(server_error()) == pytest.approx(20)  # failed: open again for open_seconds
    time.t += 20
    assert gate.take().verdict == "go"  # a probe whose worker dies...
    time.t += gate.probe_lease + 0.1
    assert gate.take().verdict == "go"  # ...lets another probe once its lease ends
    assert gate.status().counters["opened_total"] == 1  # one outage, one gateway.unavailable


def test_failures_outside_the_window_do_not_add_up(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time)
    gate.failed(server_error())
    gate.failed(server_error())
    time.t += 11
    assert gate.failed(server_error()) is None  # a new run of failures starts
    assert gate.status().failures == 1


def test_limiter_reserves_slots_at_the_rate_after_the_burst(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time)
    assert [gate.take().verdict for _ in range(5)] == ["go"] * 5  # the burst
    slots = [gate.take() for _ in range(3)]
    assert [s.verdict for s in slots] == ["wait"] * 3
    assert [s.after for s in slots] == [pytest.approx(0.1, abs=1e-3), pytest.approx(0.2, abs=1e-3), pytest.approx(0.3, abs=1e-3)]
    time.t += 0.3
    # The third comes back at its slot with its reservation: it goes, and takes no second slot.
    assert gate.take(slots[2].slot).verdict == "go"
    nxt = gate.take()
    assert nxt.verdict == "wait" and nxt.after == pytest.approx(0.1, abs=1e-3)


def test_a_429_holds_every_caller_and_spreads_them_after_it(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time)
    reserved = [gate.take() for _ in range(6)][-1]  # a slot reserved before the 429
    fresh = gate.limited(RateLimited("HTTP 429", retry_after=3, status_code=429))
    assert fresh is not None and fresh.after >= 3.0
    time.t += 3.0
    # The reservation made before the hold is void: it queues again, after the hold, one by one.
    again = gate.take(reserved.slot)
    assert again.verdict == "wait"
    later = [gate.take().after for _ in range(3)]
    assert later == sorted(later) and later[1] - later[0] == pytest.approx(0.1, abs=1e-3)
    assert gate.status().counters["limited"] == 1


def test_limiter_off_lets_every_call_go_and_keeps_the_breaker(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, limiter=False, failures=1)
    assert all(gate.take().verdict == "go" for _ in range(50))
    assert gate.limited(RateLimited("HTTP 429", retry_after=30, status_code=429)) is None
    assert gate.take().verdict == "go"
    gate.failed(server_error())
    assert gate.take().verdict == "open"


def test_gateway_events_are_read_by_the_feed(redis_client: redis.Redis, key_prefix: str) -> None:
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, failures=1)
    gate.failed(server_error())
    time.t += 20
    gate.take()
    gate.succeeded()
    feed = EventFeed(redis_client, Keys(prefix=key_prefix, partitions=3))
    events, _ = feed.read(None, limit=10)
    wire = [event.wire() for event in events]
    assert [w["type"] for w in wire] == ["gateway.unavailable", "gateway.recovered"]
    assert wire[0]["data"]["error"]["status"] == 503


def test_a_process_takes_its_slots_in_shares_and_most_calls_write_nothing(redis_client: redis.Redis, key_prefix: str) -> None:
    """A write is made durable before Redis answers (an fsync with appendfsync always): a busy process takes
    shares of slots, doubled each time it spends one within its time (up to ``share``), and spends them with
    read-only calls; a 429's hold voids what is left."""
    time = Time()
    gate = make_gate(redis_client, key_prefix, time, rate_per_second=400, burst=100)
    assert gate.share == 20
    tats = []
    for _ in range(1 + 2 + 4 + 8 + 16 + 20):
        assert gate.take().verdict == "go"
        tats.append(redis_client.hget(gate.key, "tat"))
    assert float(tats[-1] or 0) == pytest.approx(T0 + 51 / 400)  # every slot taken was this process's call
    assert len(set(tats)) == 6  # six writes for 51 calls: shares of 1, 2, 4, 8, 16, then at most 20
    assert all(gate.take().verdict == "go" for _ in range(20))
    assert float(redis_client.hget(gate.key, "tat") or 0) == pytest.approx(T0 + 71 / 400)  # one share of 20
    gate.limited(RateLimited("HTTP 429", retry_after=2, status_code=429))
    held = gate.take()  # the share's slots are void: a fresh slot after the hold
    assert held.verdict == "wait" and held.after >= 2.0


def test_thirty_processes_making_one_call_each_within_the_burst_all_go(redis_client: redis.Redis, key_prefix: str) -> None:
    """A process's first call takes one slot, not a share it would throw away: thirty processes (one Gate
    each, one gate in Redis) making one call at one instant against a burst of 100 all go (with a fixed
    share of ten, only ten went and the rest waited: a fleet of quiet processes starved far below the rate)."""
    settings = load_settings({"gateway_health": {"rate_per_second": 200, "burst": 100}})
    keys = Keys(prefix=key_prefix, partitions=3)
    gates = [Gate(redis_client, keys, settings.gateway_health, settings.gateway, now=lambda: T0) for _ in range(30)]
    verdicts = [gate.take().verdict for gate in gates]
    assert verdicts.count("go") == 30, f"30 calls within a burst of 100: {verdicts.count('go')} go"
    assert float(redis_client.hget(gates[0].key, "tat") or 0) == pytest.approx(T0 + 30 / 200)  # thirty slots, no more


def test_a_share_grows_with_the_spend_and_shrinks_when_a_process_goes_quiet() -> None:
    """The share's size (monotonic seconds): doubled when the last share was spent within its time, halved
    for each share's time without a call, never past ``most`` nor under one."""
    size = ShareSize(20)
    assert size.next(100.0, 0.0) == 1  # the first share: one slot
    assert [size.next(100.0 + i, 100.5 + i) for i in range(6)] == [2, 4, 8, 16, 20, 20]  # spent in time
    assert size.next(110.0, 109.5) == 10  # its time ended before it asked again
    assert size.next(120.0, 110.5) == 1  # quiet for nine shares' times: one slot again
    assert size.next(121.0, 121.5) == 2


def test_a_redis_that_cannot_take_the_gates_write_fails_closed(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Writes paused (``CLIENT PAUSE WRITE``: how a failover stops the old primary): no call may go, said as
    ``unreachable``, never as an exception a step would take for a defect; what a call met and could not
    be counted is dropped, so the call's answer is not lost to the breaker's bookkeeping."""
    gate = make_gate(redis.Redis.from_url(redis_url, socket_timeout=0.3), key_prefix, Time(), failures=1)
    assert gate.take().verdict == "go"  # the script loaded, a share taken
    redis_client.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
    try:
        assert gate.take(reservation=T0).verdict == "unreachable"  # a reserved slot is asked of the script too
        assert gate.failed(server_error()) is None
        gate.succeeded()
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
