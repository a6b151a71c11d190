"""Fairness between terminals and tenants (``workflows.engine.fairness``): which queue a flow's steps go to.

The queues are fixed by the settings (each worker consumes the same ones); a key named in the weights has
as many queues as its weight, any other folds into a stable shared bucket. A start may name a tenant, which
is validated and kept on the record only when set. With fairness off the sender is called exactly as
before, without a queue (the tests' ``Sent`` takes none, so a queue passed would fail here).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.config.celery import QUEUE
from durapay.config.settings import SettingsError
from durapay.workflows.engine import Engine, InputError
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.fairness import ACTIVE_SECONDS, Fairness, fair_key, key_of, tenant_refusal
from tests.workflows.engine_support import T0, ScriptedStep, Sent, flow


class QueuedSent:
    """A sender that records the queue each chain was sent to."""

    def __init__(self) -> None:
        self.chains: list[tuple[str, list[tuple[str, str]], str]] = []

    def send(self, task_name: str, flow_id: str, step: str) -> None:
        raise AssertionError("the engine sends chains")

    def send_chain(self, flow_id: str, links: list[tuple[str, str]], *, queue: str = QUEUE) -> None:
        self.chains.append((flow_id, list(links), queue))


def _fairness(**fairness: Any) -> Fairness:
    return Fairness(load_settings({"fairness": {"enabled": True, **fairness}}).fairness)


def test_a_key_is_its_terminal_and_tenant() -> None:
    assert fair_key(None, None) == "default"
    assert fair_key("eu", "") == "eu"
    assert fair_key("", "acme") == "default/acme"
    assert key_of({}) == "default"
    assert key_of({"terminal": "eu", "tenant": "acme"}) == "eu/acme"


def test_a_weighted_key_has_its_own_queues_and_takes_them_in_turn() -> None:
    fairness = _fairness(weights={"default/acme": 3, "eu": 1}, shared_queues=4)
    acme = [fairness.queue_for("default/acme") for _ in range(9)]
    assert Counter(acme) == {f"durapay.fair.default/acme.{index}": 3 for index in range(3)}
    assert {fairness.queue_for("eu") for _ in range(3)} == {"durapay.fair.eu.0"}
    assert len(fairness.queues()) == 3 + 1 + 4
    assert fairness.step_queues()[0] == QUEUE  # bulk runners stay there


def test_keys_not_named_fold_into_stable_shared_buckets() -> None:
    fairness = _fairness(shared_queues=4, default_weight=2)
    shared = set(fairness.queues())
    assert len(shared) == 8
    placed = {f"default/t{index}": fairness.queues_of(f"default/t{index}") for index in range(200)}
    assert all(set(names) <= shared and len(names) == 2 for names in placed.values())
    assert len({tuple(names) for names in placed.values()}) == 4  # every bucket used
    again = _fairness(shared_queues=4, default_weight=2)  # another process: the same bucket
    assert all(again.queues_of(key) == names for key, names in placed.items())


def test_the_settings_bound_the_queues_and_read_the_keys() -> None:
    with pytest.raises(SettingsError, match="at most 128"):
        load_settings({"fairness": {"shared_queues": 64, "default_weight": 3}})
    with pytest.raises(SettingsError, match="not a fairness key"):
        load_settings({"fairness": {"weights": {"a b": 2}}})
    with pytest.raises(SettingsError, match="1 to 16"):
        load_settings({"fairness": {"weights": {"eu": 17}}})


def test_the_weights_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPAY_FAIRNESS__ENABLED", "true")
    monkeypatch.setenv("DURAPAY_FAIRNESS__WEIGHTS", '{"default/acme": 3}')
    fairness = load_settings().fairness
    assert fairness.enabled and fairness.weights == {"default/acme": 3}


@pytest.mark.parametrize(
    ("tenant", "refused"),
    [("acme", False), ("acme-eu_2.b", False), ("", True), ("-acme", True), ("a b", True), ("x" * 65, True), ("é", True)],
)
def test_a_tenant_is_short_and_safe(tenant: str, refused: bool) -> None:
    assert (tenant_refusal(tenant) is not None) is refused


def test_a_tenant_is_never_a_card_number() -> None:
    why = tenant_refusal("4111111111111111")
    assert why is not None and "card number" in why and "4111111111111111" not in why


def _engine(redis_client: redis.Redis, key_prefix: str, clock: ManualClock, sender: Any, **fairness: Any) -> Engine:
    settings = load_settings({"engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3}, "fairness": fairness})
    return Engine(settings, redis_client, {"demo": flow(ScriptedStep("one"), ScriptedStep("two"))}, sender=sender, clock=clock)


def test_a_start_sends_to_its_keys_queue_and_keeps_its_tenant(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    sent = QueuedSent()
    engine = _engine(redis_client, key_prefix, clock, sent, enabled=True, weights={"default/acme": 1})
    acme = engine.start("demo", {"amount": 1}, tenant="acme")
    plain = engine.start("demo", {"amount": 1})
    assert engine.get(acme.id).fields["tenant"] == "acme"
    assert "tenant" not in engine.get(plain.id).fields  # written only when set
    queues = {flow_id: queue for flow_id, _, queue in sent.chains}
    assert queues[acme.id] == "durapay.fair.default/acme.0"
    assert queues[plain.id] in engine.fairness.queues_of("default")
    # The dispatcher's resend of a lost message goes to the same queue (the record says the key).
    sent.chains.clear()
    clock.advance(31)
    assert engine.dispatch_due() == 2
    assert {flow_id: queue for flow_id, _, queue in sent.chains} == queues


def test_a_bad_tenant_is_refused_before_anything_is_written(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    sent = QueuedSent()
    engine = _engine(redis_client, key_prefix, clock, sent, enabled=True)
    with pytest.raises(InputError) as refused:
        engine.start("demo", {"amount": 1}, key="k1", tenant="no spaces")
    assert refused.value.field == "tenant"
    assert sent.chains == [] and engine.store.get(engine.start("demo", {"amount": 1}, key="k1").id) is not None


def test_with_fairness_off_the_sender_gets_no_queue(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> None:
    sent = Sent()  # its send_chain takes no queue
    engine = _engine(redis_client, key_prefix, clock, sent)
    record = engine.start("demo", {"amount": 1}, tenant="acme")
    assert sent.chains == [(record.id, [("test.step", "one")])]
    assert engine.get(record.id).fields["tenant"] == "acme"


def _due(engine: Engine, flow_id: str) -> float | None:
    return engine.redis.zscore(engine.keys.due_of(flow_id), flow_id)


def test_a_cap_holds_a_keys_steps_back_and_each_end_sends_the_oldest_held(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    sent = QueuedSent()
    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "caps": {"default/bulk": 2}, "max_held": 2, "hold_seconds": 300},
        }
    )
    engine = Engine(settings, redis_client, {"demo": flow(ScriptedStep("one"))}, sender=sent, clock=clock)
    bulk = []
    for _ in range(5):  # held oldest first (a second apart: the list's order is its start time's)
        bulk.append(engine.start("demo", {"amount": 1}, tenant="bulk").id)
        clock.advance(1)
    shop = engine.start("demo", {"amount": 1}, tenant="shop").id  # another key: no cap, never held
    assert [flow_id for flow_id, _, _ in sent.chains] == [*bulk[:2], shop]
    assert engine.caps.held("default/bulk") == 2  # the third and fourth; the fifth beyond max_held
    for index, flow_id in enumerate(bulk):  # held, listed or not: still due, later (a crash here loses nothing)
        assert _due(engine, flow_id) == T0 + index + (300 if index >= 2 else 30)  # sent: a lease on, as any sent step

    sent.chains.clear()
    clock.advance(ACTIVE_SECONDS + 1)  # the shop quiet: the whole cap (while it is active, a share: test_fairness_share.py)
    assert engine.run_step(bulk[0], "one", worker="w") == "succeeded"
    assert [flow_id for flow_id, _, _ in sent.chains] == [bulk[2]]  # the oldest held takes the place
    assert engine.caps.held("default/bulk") == 1
    assert engine.run_step(bulk[0], "one", worker="w") != "succeeded"  # a second delivery runs nothing

    # No release comes (the workers lost): the held flows' due entries send them, the lapsed places freed,
    # under the cap again (bulk[2]'s place, admitted by the release, has lapsed too).
    # (The shop's step run first: sent again in the same pass, it would make the bulk's cap its share.)
    assert engine.run_step(shop, "one", worker="w") == "succeeded"
    sent.chains.clear()
    clock.advance(301)
    assert engine.dispatch_due() == 4  # the four bulk flows
    sent_bulk = sent_ids(sent)
    assert len(sent_bulk) == 2 and set(sent_bulk) <= set(bulk[1:])
    assert engine.caps.held("default/bulk") == 2  # the other two: held again, listed (max_held 2)


def sent_ids(sent: QueuedSent) -> list[str]:
    return [flow_id for flow_id, _, _ in sent.chains]


def test_a_flow_whose_next_step_is_on_its_way_keeps_its_place(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """A step that leaves its flow ready sends (or chains) the next one: the flow keeps its place under the
    cap until a step of it leaves it elsewhere, so a two-step flow counts once, not once per step."""
    sent = QueuedSent()
    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3, "follow_steps": 0},
            "fairness": {"enabled": True, "caps": {"default/bulk": 1}},
        }
    )
    engine = Engine(settings, redis_client, {"demo": flow(ScriptedStep("one"), ScriptedStep("two"))}, sender=sent, clock=clock)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    second = engine.start("demo", {"amount": 1}, tenant="bulk").id
    assert sent_ids(sent) == [first] and engine.caps.held("default/bulk") == 1
    sent.chains.clear()
    assert engine.run_step(first, "one", worker="w") == "ready"
    assert sent_ids(sent) == [first], "its next step sent; the held flow still held"
    assert engine.caps.held("default/bulk") == 1
    sent.chains.clear()
    assert engine.run_step(first, "two", worker="w") == "succeeded"
    assert sent_ids(sent) == [second] and engine.caps.held("default/bulk") == 0


def test_steps_followed_inline_give_back_the_last_claims_place(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """A worker that follows a flow's steps inline claims each one: the place is the last claim's (a place is
    its claim's, ``engine/lua/fair_take.lua``), and that is the one given back at the end, so the held flow is sent."""
    sent = QueuedSent()
    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "caps": {"default/bulk": 1}},
        }
    )
    engine = Engine(settings, redis_client, {"demo": flow(ScriptedStep("one"), ScriptedStep("two"))}, sender=sent, clock=clock)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    second = engine.start("demo", {"amount": 1}, tenant="bulk").id
    sent.chains.clear()
    assert engine.run_step(first, "one", worker="w", follow=1) == "succeeded"
    assert sent_ids(sent) == [second] and engine.caps.held("default/bulk") == 0


def test_a_second_delivery_of_a_running_step_keeps_its_place(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """A message delivered twice while its step runs: the second claim is refused (the first holds the
    lease) and gives back nothing, so the held flow waits for the running step's end, under the cap."""
    sent = QueuedSent()
    during: list[str] = []

    def deliver_again(ctx: Any) -> None:
        during.append(engine.run_step(first, "one", worker="w2"))
        during.extend(sent_ids(sent))

    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "fairness": {"enabled": True, "caps": {"default/bulk": 1}},
        }
    )
    engine = Engine(settings, redis_client, {"demo": flow(ScriptedStep("one", during=deliver_again))}, sender=sent, clock=clock)
    first = engine.start("demo", {"amount": 1}, tenant="bulk").id
    clock.advance(1)
    second = engine.start("demo", {"amount": 1}, tenant="bulk").id
    sent.chains.clear()
    assert engine.run_step(first, "one", worker="w1") == "succeeded"
    assert during[0] != "succeeded" and second not in during[1:], f"sent while the first ran: {during}"
    assert sent_ids(sent) == [second]


def test_a_flows_terminal_is_its_key(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> None:
    """Issue 40: the key is (terminal, tenant): a flow on a declared terminal goes to that terminal's queues,
    with a tenant to that pair's; a schedule's batch start (no tenant) to its terminal's."""
    sent = QueuedSent()
    settings = load_settings(
        {
            "engine": {"key_prefix": key_prefix, "lease_seconds": 30, "partitions": 3},
            "terminals": {"it": {"api_key": "it-key"}},
            "fairness": {"enabled": True, "weights": {"it": 1, "it/acme": 2}},
        }
    )
    engine = Engine(settings, redis_client, {"demo": flow(ScriptedStep("one"))}, sender=sent, clock=clock)
    italy = engine.start("demo", {"amount": 1}, terminal="it")
    acme = engine.start("demo", {"amount": 1}, terminal="it", tenant="acme")
    [batch] = engine.start_many([("demo", {"amount": 2}, None)], terminals=["it"])
    queues = {flow_id: queue for flow_id, _, queue in sent.chains}
    assert queues[italy.id] == queues[str(batch)] == "durapay.fair.it.0"
    assert queues[acme.id] == "durapay.fair.it/acme.0"
    assert key_of(engine.get(acme.id).fields) == "it/acme"
