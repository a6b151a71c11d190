"""A command sent again on a fresh connection after a lost one (a Redis Cluster node failing over), by
``ClusterClient`` and ``Pins.run``: only a read or a script declared resend-safe (``workflows/engine/scripts.py``),
and the scripts of a step's path (claim, completion, signal) answer such a resend as their first run did.
The fault: the command runs on a real cluster node and its answer is lost with the connection
(``tests/config/lost_answer.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.config.connect import open_redis, resend_safe
from durapay.gateway import ServerError
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.gate import Gate
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.pins import Pins
from durapay.workflows.engine.scripts import ScriptPipeline
from tests.config.lost_answer import LostAnswers, lose_answer  # noqa: F401
from tests.workflows.engine_support import T0, ScriptedStep, flow, wait_step
from tests.workflows.integration.topology import ValkeyCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyCluster]:
    with ValkeyCluster(Path(tmp_path_factory.mktemp("pins")), 3) as started:
        yield started


@pytest.fixture
def client(cluster: ValkeyCluster) -> Iterator[Any]:
    opened = open_redis(cluster.url, cluster=True, socket_timeout=2, socket_connect_timeout=1)
    yield opened
    opened.close()


def engine_on(client: Any, key_prefix: str, *steps: Any) -> Engine:
    settings = load_settings({"engine": {"key_prefix": key_prefix, "lease_seconds": 60, "partitions": 3}})
    return Engine(settings, client, {"demo": flow(*steps)}, clock=ManualClock(T0))


def test_a_script_not_declared_resend_safe_is_sent_once_and_a_declared_one_again(
    client: Any,
    key_prefix: str,
    lose_answer: LostAnswers,  # noqa: F811
) -> None:
    count = client.register_script("return redis.call('INCR', KEYS[1])")
    same = client.register_script("redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]")
    resend_safe(client).add(same.sha)
    key, other = f"{{{key_prefix}}}:count", f"{{{key_prefix}}}:same"
    count(keys=[key])
    same(keys=[other], args=["x"])  # both loaded on the key's node
    pins = Pins(client)
    for send in (lambda: count(keys=[key]), lambda: pins.script(count, [key], [])):
        lose_answer.sha = count.sha
        with pytest.raises(redis.ConnectionError):
            send()
    assert (lose_answer.lost, lose_answer.sent, client.get(key)) == (2, ["EVALSHA", "EVALSHA"], b"3")
    lose_answer.sha = same.sha
    assert same(keys=[other], args=["y"]) == b"y"
    lose_answer.sha = same.sha
    assert pins.script(same, [other], ["z"])[0] == b"z"
    assert (lose_answer.lost, len(lose_answer.sent)) == (4, 6)  # each of the last two sent again


def test_a_gate_failure_whose_answer_was_lost_counts_once(
    client: Any,
    key_prefix: str,
    lose_answer: LostAnswers,  # noqa: F811
) -> None:
    """gate.lua is not resend-safe (a failure would count twice and open the breaker early): its lost
    answer is logged and dropped by the gate, the failure counted once."""
    settings = load_settings({"gateway_health": {"failures": 3, "window_seconds": 30, "open_seconds": 20}})
    gate = Gate(client, Keys(prefix=key_prefix, partitions=3), settings.gateway_health, settings.gateway)
    gate.succeeded()  # the script loaded on its node
    lose_answer.sha = gate._script.sha
    gate.failed(ServerError("create_moto_order: HTTP 503: down", status_code=503))
    assert (lose_answer.lost, gate.status().failures) == (1, 1)


def test_a_claim_whose_answer_was_lost_is_answered_as_claimed_and_its_step_runs(
    client: Any,
    key_prefix: str,
    lose_answer: LostAnswers,  # noqa: F811
) -> None:
    """Issue 28: no flow waits out its lease because of a failover. The claim sent again finds the lease
    it wrote itself (owner and lease end) and answers ok, not 'leased'."""
    first = ScriptedStep("first", op=None)
    engine = engine_on(client, key_prefix, first, ScriptedStep("second", op=None))
    record = engine.start("demo", {"amount": 5})
    engine.get(record.id)
    lose_answer.sha = engine.store._claim.sha
    engine.run_step(record.id, "first")
    after = engine.get(record.id)
    assert lose_answer.lost == 1 and first.runs == [1]
    assert (after.state.value, after.step) == ("ready", "second")


def test_a_completion_whose_answer_was_lost_is_answered_as_written_not_stale(
    client: Any,
    key_prefix: str,
    lose_answer: LostAnswers,  # noqa: F811
) -> None:
    """transition.lua sent again finds its own change (the request token written with it) and answers
    with the record, so the completion's follow-ups run; before, it answered 'stale'."""
    first = ScriptedStep("first", op=None)
    engine = engine_on(client, key_prefix, first, ScriptedStep("second", op=None))
    record = engine.start("demo", {"amount": 5})
    engine.get(record.id)
    lose_answer.sha = engine.store._transition.sha
    result = engine.run_step(record.id, "first")
    after = engine.get(record.id)
    assert lose_answer.lost == 1
    assert result != "stale" and (after.state.value, after.step, after.version) == ("ready", "second", record.version + 2)


def test_a_signal_whose_answer_was_lost_is_kept_once(
    client: Any,
    key_prefix: str,
    lose_answer: LostAnswers,  # noqa: F811
) -> None:
    """signal.lua sent again answers as its first run did (the request token kept with the answer): the
    signal is kept once, and the flow's next wait for it waits."""
    engine = engine_on(client, key_prefix, wait_step("customer"), wait_step("again"))
    record = engine.start("demo", {"amount": 5})
    assert engine.run_step(record.id, "customer") == "waiting"
    lose_answer.sha = engine.store._signal.sha
    assert engine.signal(record.id, "paid", {"by": "card"}) == "resumed"
    kept = [name for name in engine.get(record.id).fields if name.startswith("sig:")]
    engine.run_step(record.id, "customer")
    assert (lose_answer.lost, kept, engine.run_step(record.id, "again")) == (1, ["sig:1"], "waiting")


def test_a_pipeline_holding_a_script_not_declared_resend_safe_is_sent_once(
    client: Any,
    key_prefix: str,
    lose_answer: LostAnswers,  # noqa: F811
) -> None:
    """redis-py sends a cluster pipeline again after a lost connection: not one with a script that is not
    resend-safe (hold, release, a webhook attempt's record...); one of resend-safe scripts still is."""
    count = client.register_script("return redis.call('INCR', KEYS[1])")
    same = client.register_script("redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]")
    resend_safe(client).add(same.sha)
    key, other = f"{{{key_prefix}}}:count", f"{{{key_prefix}}}:same"
    count(keys=[key])
    same(keys=[other], args=["x"])
    pipe = ScriptPipeline(client)
    pipe.call(count, [key], [])
    lose_answer.sha = count.sha
    with pytest.raises(redis.ConnectionError):
        pipe.execute()
    assert (lose_answer.lost, lose_answer.sent, client.get(key)) == (1, ["EVALSHA"], b"2")
    pipe = ScriptPipeline(client)
    pipe.call(same, [other], ["y"])
    lose_answer.sha = same.sha
    assert pipe.execute() == [b"y"] and lose_answer.lost == 2
