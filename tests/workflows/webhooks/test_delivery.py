"""Delivery: each event to each subscribed endpoint, signed, retried on the schedule, Retry-After and
410 honoured, every attempt recorded. A real receiver over HTTP; the clock is manual, delivery inline."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.trim import EventTrimmer
from durapay.workflows.webhooks import SCHEDULE, EndpointError, Webhooks, next_delay, retry_after
from durapay.workflows.webhooks.endpoints import Endpoint
from durapay.workflows.webhooks.signing import new_secret
from tests.waiting import wait_until


def tick(webhooks: Webhooks) -> int:
    """One pass, once the server's millisecond has moved on (a fan-out leaves the entries of the very
    millisecond it read the endpoints in for the next pass)."""

    start = now_ms(webhooks)
    wait_until(lambda: now_ms(webhooks) > start, 5, "the server's clock to move")
    return webhooks.tick()


def now_ms(webhooks: Webhooks) -> int:
    seconds, micros = webhooks.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def finish(engine: Engine, count: int) -> list[str]:
    ids = []
    for amount in range(1, count + 1):
        record = engine.start("demo", {"amount": amount})
        engine.run_step(record.id, "pay")
        ids.append(record.id)
    return ids


def test_every_event_reaches_the_endpoint_signed_with_its_fields(hooks: Any, receiver: WebhookReceiver) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url)
    receiver.secrets = [endpoint.secret]
    ids = finish(engine, 3)
    tick(webhooks)
    assert receiver.refused == 0
    assert sorted(r.type for r in receiver.received) == ["flow.created"] * 3 + ["flow.succeeded"] * 3
    feed = {event.id: event.wire() for event, _ in engine.events()}
    for got in receiver.received:
        assert got.body == feed[got.id]
        assert got.headers["webhook-id"] == got.id and got.body["flow"] in ids
        assert {"id", "type", "timestamp", "flow", "kind", "orderId", "operationId", "data"} <= set(got.body)
    assert webhooks.pending() == 0
    attempts = webhooks.attempts(endpoint.id)
    assert len(attempts) == 6 and all(a["status"] == 200 and a["outcome"] == "delivered" for a in attempts)
    assert all("latencyMs" in a and a["response"] == '{"status": 200}' for a in attempts)
    tick(webhooks)
    assert len(receiver.received) == 6  # delivered once each


def test_an_endpoint_gets_only_its_types_and_only_events_after_its_creation(hooks: Any, receiver: WebhookReceiver) -> None:
    engine, webhooks = hooks()
    finish(engine, 2)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.succeeded"])
    receiver.secrets = [endpoint.secret]
    finish(engine, 2)
    tick(webhooks)
    assert [r.type for r in receiver.received] == ["flow.succeeded"] * 2


def test_the_creation_splits_events_written_before_it_from_those_written_after(hooks: Any, receiver: WebhookReceiver) -> None:
    """Stream ids and the creation stamp count in milliseconds: an event written just before the creation,
    in the same millisecond (here: the same pipeline), is still not the endpoint's; one written as soon
    as ``add`` returned is."""
    _, webhooks = hooks()
    store = webhooks.endpoints
    slot = next(iter(webhooks.slots.values()))
    stream = slot.stream
    before = json.dumps({"type": "flow.succeeded", "id": "evt_before"})
    pipe = webhooks.redis.pipeline(transaction=False)
    pipe.xadd(stream, {"e": before})
    endpoint = Endpoint(id="we_samemillisecond", url=receiver.url, secret=new_secret(), events=["flow.succeeded"])
    store._add(keys=[store.key], args=[endpoint.id, json.dumps(asdict(endpoint))], client=pipe)
    written, _ = pipe.execute()
    created = store.get(endpoint.id)
    assert created is not None and int(written.decode().split("-")[0]) < created.after
    wanted = set()
    for _ in range(20):
        added = store.add(receiver.url, ["flow.succeeded"])
        after = webhooks.redis.xadd(stream, {"e": json.dumps({"type": "flow.succeeded"})})
        assert int(after.decode().split("-")[0]) >= added.after
        wanted.add(f"{after.decode()}|{added.id}")
    last = int(after.decode().split("-")[0])
    wait_until(lambda: now_ms(webhooks) > last, 5, "the server's clock to pass the last entry")
    webhooks.fanout()
    due = {member.decode() for member in webhooks.redis.zrange(slot.due, 0, -1)}
    assert wanted <= due and f"{written.decode()}|{endpoint.id}" not in due


def test_failures_are_retried_on_the_schedule_then_delivered(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    answers = iter([500, 500, 503])
    receiver.answer = lambda body: (next(answers, 200), {})
    finish(engine, 1)
    tick(webhooks)
    assert [r.status for r in receiver.received] == [500]
    tick(webhooks)
    assert len(receiver.received) == 1  # not due yet
    clock.advance(SCHEDULE[1] * 1.25)
    tick(webhooks)
    clock.advance(SCHEDULE[2] * 1.25)
    tick(webhooks)
    clock.advance(SCHEDULE[3] * 1.25)
    tick(webhooks)
    assert [r.status for r in receiver.received] == [500, 500, 503, 200]
    assert len({r.id for r in receiver.received}) == 1
    outcomes = [a["outcome"] for a in reversed(webhooks.attempts(endpoint.id))]
    assert outcomes == ["retry", "retry", "retry", "delivered"]
    assert [a["attempt"] for a in reversed(webhooks.attempts(endpoint.id))] == [1, 2, 3, 4]


def test_retry_after_is_honoured(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    answers = iter([(429, {"Retry-After": "3600"})])
    receiver.answer = lambda body: next(answers, (200, {}))
    finish(engine, 1)
    tick(webhooks)
    clock.advance(SCHEDULE[1] * 2)
    tick(webhooks)
    assert len(receiver.received) == 1  # 5 s passed, but the endpoint asked for an hour
    for slot in webhooks.slots.values():  # a stale copy of the task turning up now does not send either
        for member in webhooks.redis.zrange(slot.due, 0, -1):
            assert webhooks.deliver(slot.tag, member.decode()) is None
    assert len(receiver.received) == 1
    clock.advance(3600)
    tick(webhooks)
    assert [r.status for r in receiver.received] == [429, 200]


def test_410_gone_disables_the_endpoint_and_drops_its_deliveries(hooks: Any, receiver: WebhookReceiver) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = lambda body: (410, {})
    finish(engine, 3)
    tick(webhooks)
    held = webhooks.endpoints.get(endpoint.id)
    assert held is not None and not held.enabled and "410" in held.disabled_reason
    assert len(receiver.received) == 1 and webhooks.pending() == 0
    finish(engine, 1)
    tick(webhooks)
    assert len(receiver.received) == 1


def test_a_delivery_is_given_up_after_the_retry_window_and_an_endpoint_failing_for_days_is_disabled(
    hooks: Any, receiver: WebhookReceiver, clock: ManualClock
) -> None:
    engine, webhooks = hooks(retry_days=1.0, disable_after_days=2.0)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = lambda body: (500, {})
    finish(engine, 1)
    for _ in range(40):
        tick(webhooks)
        clock.advance(3600)
    attempts = webhooks.attempts(endpoint.id, limit=100)
    assert attempts[0]["outcome"] == "given up" and webhooks.pending() == 0
    elapsed = [a["attempt"] for a in attempts]
    assert max(elapsed) == len(attempts) >= 7
    # Events keep coming, one every 8 hours, and every attempt fails: a retry is always due, so the
    # failing streak runs on until, two days after its first failure, the endpoint is disabled. (The
    # first event's give-up ended the streak before: the next failure, hours later, started this one.)
    for hour in range(80):
        if hour % 8 == 0:
            finish(engine, 1)
        tick(webhooks)
        clock.advance(3600)
    held = webhooks.endpoints.get(endpoint.id)
    assert held is not None and not held.enabled and "failing for 2" in held.disabled_reason


def test_a_delivery_whose_event_was_trimmed_is_dropped_and_recorded(
    hooks: Any, receiver: WebhookReceiver, clock: ManualClock
) -> None:
    """What docs/events.md says of an event gone before its delivery succeeded (a replay of an event near
    the end of its retention; the settings keep a fresh event's retries within it): the delivery is
    dropped, recorded as such, and nothing is sent."""
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = lambda body: (500, {})
    finish(engine, 1)
    tick(webhooks)
    assert [r.status for r in receiver.received] == [500] and webhooks.pending() == 1
    start = now_ms(webhooks)
    wait_until(lambda: now_ms(webhooks) > start, 5, "the server's clock to move")
    EventTrimmer(engine.redis, engine.keys, retention_seconds=0.0).run()  # as if the retention had passed
    clock.advance(SCHEDULE[1] * 1.25)
    tick(webhooks)
    assert len(receiver.received) == 1 and webhooks.pending() == 0
    last = webhooks.attempts(endpoint.id)[0]
    assert last["outcome"] == "dropped" and last["error"] == "event expired (older than the retention)"


def test_a_rotation_signs_with_both_secrets_for_a_while(hooks: Any, receiver: WebhookReceiver) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    rotated = webhooks.endpoints.rotate(endpoint.id)
    assert rotated is not None and rotated.secret != endpoint.secret and rotated.previous_secret == endpoint.secret
    receiver.secrets = [endpoint.secret]  # a receiver not yet told about the new secret
    finish(engine, 1)
    tick(webhooks)
    assert receiver.refused == 0 and len(receiver.received) == 1
    assert len(receiver.received[0].headers["webhook-signature"].split(" ")) == 2


def test_the_test_command_and_a_replay(hooks: Any, receiver: WebhookReceiver) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url)
    receiver.secrets = [endpoint.secret]
    attempt = webhooks.test(endpoint.id)
    assert attempt is not None and attempt["ok"] and receiver.received[0].type == "webhook.test"
    finish(engine, 2)
    tick(webhooks)
    first = [r.id for r in receiver.received[1:]]
    events = list(engine.events())
    expected = sorted(e.id for e, _ in events[2:] if e.type == "flow.succeeded")
    assert webhooks.replay(events[1][1], types=["flow.succeeded"]) == len(expected) >= 1
    tick(webhooks)
    again = [r.id for r in receiver.received[5:]]
    assert sorted(again) == expected
    assert set(again) <= set(first)


def test_urls_are_checked(hooks: Any) -> None:
    _, strict = hooks(allow_private=False)
    for url, reason in [
        ("http://example.com/h", "https"),
        ("https://127.0.0.1/h", "not a public address"),
        ("https://10.1.2.3/h", "not a public address"),
        ("https://[::1]/h", "not a public address"),
        ("https://169.254.169.254/latest", "not a public address"),
        ("https://localhost/h", "local name"),
        ("ftp://example.com", "https"),
        ("https://user:pw@example.com/", "user or password"),
    ]:
        with pytest.raises(EndpointError, match=reason):
            strict.endpoints.add(url)
    assert strict.endpoints.add("https://hooks.example.com/durapay").url == "https://hooks.example.com/durapay"
    with pytest.raises(EndpointError, match=r"did you mean 'flow\.succeeded'"):
        strict.endpoints.add("https://hooks.example.com/x", ["flow.succeded"])


def test_a_name_resolving_to_a_private_address_is_refused_at_delivery(hooks: Any, receiver: WebhookReceiver) -> None:
    _, webhooks = hooks(allow_private=False)
    endpoint = webhooks.endpoints.add("https://localhost.example/h")
    object.__setattr__(endpoint, "url", receiver.url.replace("127.0.0.1", "localhost"))
    attempt = webhooks.attempt(endpoint, "evt_x", "flow.created", b"{}")
    assert not attempt["ok"] and "not public" in attempt["error"]
    assert "127.0.0.1" not in attempt["error"], "the internal address is not named"
    assert receiver.received == []


def test_backoff_and_retry_after_helpers() -> None:
    import random

    rng = random.Random(1)
    assert next_delay(0, rng) == 0.0
    for attempts, base in enumerate(SCHEDULE):
        assert base * 0.8 <= next_delay(attempts, rng) <= base * 1.2
    assert 36000 * 0.8 <= next_delay(50, rng) <= 36000 * 1.2
    assert retry_after("120", 0) == 120 and retry_after("junk", 0) is None and retry_after("9999999", 0) == 86400
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412480 - 60) == 60


def test_attempts_are_bounded(hooks: Any, receiver: WebhookReceiver) -> None:
    engine, webhooks = hooks(attempts_kept=3, excerpt_bytes=5)
    endpoint = webhooks.endpoints.add(receiver.url)
    receiver.secrets = [endpoint.secret]
    finish(engine, 4)
    tick(webhooks)
    attempts = webhooks.attempts(endpoint.id)
    assert len(attempts) <= 3 * len(webhooks.slots) and all(len(a["response"]) <= 5 for a in attempts)
    assert len(json.dumps(attempts)) < 10000


def test_a_lost_task_or_a_killed_worker_only_delays_a_delivery(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    engine, webhooks = hooks(lease_seconds=30.0)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    lost: list[tuple[str, list[str]]] = []
    webhooks.send = lambda tag, members: lost.append((tag, members))  # the task never runs
    finish(engine, 2)
    assert tick(webhooks) == 2 and sum(len(members) for _, members in lost) == 2
    webhooks.send = None
    assert tick(webhooks) == 0 and receiver.received == []  # leased
    clock.advance(31)
    assert tick(webhooks) == 2 and len(receiver.applied) == 2
    webhooks.deliver_many(*lost[0])  # the lost task turns up late: nothing left to do
    assert len(receiver.received) == 2


def test_endpoints_from_the_settings_are_written_once_with_a_stable_id(hooks: Any, receiver: WebhookReceiver) -> None:
    from durapay.workflows.webhooks import new_secret

    secret = new_secret()
    configured = {"url": receiver.url, "events": ["flow.succeeded"], "secret": secret}
    engine, webhooks = hooks(endpoints=[configured])
    first = webhooks.endpoints.sync_configured()
    again = webhooks.endpoints.sync_configured()
    assert [e.id for e in first] == [e.id for e in again] and len(webhooks.endpoints.all()) == 1
    assert first[0].source == "config" and first[0].secret == secret
    receiver.secrets = [secret]
    finish(engine, 1)
    tick(webhooks)
    assert [r.type for r in receiver.received] == ["flow.succeeded"]
    with pytest.raises(EndpointError, match="whsec_"):
        hooks(endpoints=[{**configured, "secret": "nope"}])[1].endpoints.sync_configured()


def test_a_removed_endpoints_deliveries_are_dropped(hooks: Any, receiver: WebhookReceiver) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url)
    webhooks.send = lambda tag, members: None
    finish(engine, 1)
    tick(webhooks)
    webhooks.endpoints.remove(endpoint.id)
    webhooks.send = None
    for slot in webhooks.slots.values():
        for member in webhooks.redis.zrange(slot.due, 0, -1):
            assert webhooks.deliver(slot.tag, member.decode())["outcome"] == "dropped"
    assert webhooks.pending() == 0 and receiver.received == []


def test_a_failing_endpoint_is_not_sent_the_rest_of_a_batch(hooks: Any, receiver: WebhookReceiver, clock: ManualClock) -> None:
    engine, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = lambda body: (503, {})
    finish(engine, 6)
    tick(webhooks)
    tried = len(receiver.received)
    assert tried == len({m for slot in webhooks.slots.values() for m in webhooks.redis.zrange(slot.due, 0, 0)})
    assert tried < 6 and webhooks.pending() == 6  # one attempt per stream's batch, the rest put back, untried
    counts = [json.loads(raw)["n"] for slot in webhooks.slots.values() for raw in webhooks.redis.hvals(slot.state)]
    assert sorted(counts) == [0] * (6 - tried) + [1] * tried
    receiver.answer = lambda body: (200, {})
    clock.advance(SCHEDULE[1] * 1.25)
    tick(webhooks)
    assert len(receiver.applied) == 6 and webhooks.pending() == 0


def test_a_kept_connection_the_endpoint_closed_is_replaced(hooks: Any, receiver: WebhookReceiver) -> None:
    _, webhooks = hooks()
    endpoint = webhooks.endpoints.add(receiver.url)
    receiver.secrets = [endpoint.secret]
    assert webhooks.test(endpoint.id)["ok"]
    receiver.down()  # closes the kept connection too
    down = webhooks.test(endpoint.id)
    assert down is not None and not down["ok"] and down["status"] is None
    receiver.up()
    assert webhooks.test(endpoint.id)["ok"] and len(receiver.received) == 2
    receiver.down()
    receiver.up()  # back before the next attempt: the kept connection is dead, a new one is made
    assert webhooks.test(endpoint.id)["ok"] and len(receiver.received) == 3


def ms_moves(webhooks: Any) -> None:
    start = now_ms(webhooks)
    wait_until(lambda: now_ms(webhooks) > start, 5, "the server's clock to move")


def test_a_batch_put_back_keeps_each_delivery_within_its_own_retry_window(
    hooks: Any, receiver: WebhookReceiver, clock: ManualClock
) -> None:
    """Issue 29 review: deliver_many put the untried rest of a batch back at the *failed* delivery's next
    time (its Retry-After, up to its own window's end): an older delivery of the same endpoint and
    stream, due within its window, was pushed past it and past the events' retention the settings check
    assumes; when its turn came its event was gone, and it was dropped unattempted. Each is put back no
    later than its own window's end, where its last attempt is made."""
    retry_days = 2 / 24  # two hours
    delays = [0.0, 5.0]
    engine, webhooks = hooks(retry_days=retry_days, retry_delays=delays)
    endpoint = webhooks.endpoints.add(receiver.url, ["flow.created"])
    receiver.secrets = [endpoint.secret]
    seen: dict[str, int] = {}
    ids: dict[str, str] = {}

    def answer(body: dict[str, Any]) -> tuple[int, dict[str, str]]:
        seen[body["id"]] = seen.get(body["id"], 0) + 1
        if body["id"] == ids.get("B") and seen[body["id"]] == 1:
            return 429, {"Retry-After": "7000"}  # honoured: within B's window (7,200 s)
        if body["id"] == ids.get("A"):
            return 503, {"Retry-After": "3600"}
        return 200, {}

    receiver.answer = answer
    b_flow = engine.start("demo", {"amount": 1})
    partition = engine.keys.partition(b_flow.id)
    ms_moves(webhooks)
    slot = webhooks.slots[f"p{partition}"]
    webhooks.fanout()
    (b_member,) = [m.decode() for m in webhooks.redis.zrange(slot.due, 0, -1)]
    ids["B"] = f"evt_p{partition}_{b_member.split('|')[0]}"
    first_b = clock.now()
    webhooks.send_due()  # B: 429, retry at first_b + 7000
    assert float(webhooks.redis.zscore(slot.due, b_member)) == first_b + 7000
    clock.advance(6990)
    while True:  # a new event A in B's stream (same endpoint, same slot)
        a_flow = engine.start("demo", {"amount": 2})
        if engine.keys.partition(a_flow.id) == partition:
            break
    ms_moves(webhooks)
    webhooks.fanout()
    a_member = next(m.decode() for m in webhooks.redis.zrange(slot.due, 0, -1) if m.decode() != b_member)
    ids["A"] = f"evt_p{partition}_{a_member.split('|')[0]}"
    clock.advance(10)  # B due now, inside its window (which ends at first_b + 7200)
    webhooks.send_due()  # one batch: A first (due earlier), fails with Retry-After 3600; B put back
    bound = first_b + retry_days * 86400 + max(delays) * 1.2  # what _check_webhook_retries assumes
    b_due = float(webhooks.redis.zscore(slot.due, b_member))
    clock.set(b_due)
    webhooks.send_due()
    last = next(a for a in webhooks.attempts(endpoint.id, limit=50) if a["event"] == ids["B"])
    assert b_due <= first_b + retry_days * 86400 <= bound, "no later than its own window's end"
    assert last["attempt"] == 2 and seen[ids["B"]] == 2, "its last attempt was made, its event still there"
