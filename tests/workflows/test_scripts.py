"""ScriptPipeline on the real server: no SCRIPT EXISTS per execute, and a script the server lacks runs
exactly once all the same; call_meanwhile: what is sent meanwhile lands after the call, whatever
happens to the call."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from workflows.scripts import ScriptPipeline, call_meanwhile

COUNT = "return redis.call('INCR', KEYS[1])"


def calls(client: Any, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def script_exists_calls(client: Any) -> int:
    return calls(client, "script|exists")


def fresh(client: Any, body: str) -> Any:
    """A script the server has never seen (a unique comment makes a new SHA)."""
    return client.register_script(f"-- {uuid.uuid4().hex}\n{body}")


def test_a_pipeline_of_loaded_scripts_asks_nothing_before_running(redis_client: redis.Redis, key_prefix: str) -> None:
    count = fresh(redis_client, COUNT)
    count(keys=[f"{key_prefix}:warm"])  # loaded now
    asked = script_exists_calls(redis_client)
    pipe = ScriptPipeline(redis_client)
    for index in range(3):
        pipe.call(count, [f"{key_prefix}:n{index}"], [])
    assert pipe.execute() == [1, 1, 1] and pipe.rerun == []
    assert script_exists_calls(redis_client) == asked


def test_a_script_the_server_lacks_is_loaded_and_each_call_runs_exactly_once(redis_client: redis.Redis, key_prefix: str) -> None:
    """As after a restart or a failover: every call answered NOSCRIPT did nothing, and runs once more."""
    known, unknown = fresh(redis_client, COUNT), fresh(redis_client, COUNT)
    known(keys=[f"{key_prefix}:warm"])
    key = f"{key_prefix}:counter"
    pipe = ScriptPipeline(redis_client)
    pipe.call(unknown, [key], [])
    pipe.call(known, [key], [])
    pipe.call(unknown, [key], [])
    replies = pipe.execute()
    assert int(redis_client.get(key) or 0) == 3
    assert sorted(replies) == [1, 2, 3]  # the two refused calls ran after the one that was not
    assert replies[1] == 1 and pipe.rerun == [0, 2]


def test_a_refused_call_is_raised_or_reported(redis_client: redis.Redis, key_prefix: str) -> None:
    count, broken = fresh(redis_client, COUNT), fresh(redis_client, "return redis.call('NOSUCHCOMMAND')")
    pipe = ScriptPipeline(redis_client)
    pipe.call(broken, [f"{key_prefix}:a"], [])
    pipe.call(count, [f"{key_prefix}:b"], [])
    with pytest.raises(redis.ResponseError):
        pipe.execute()
    assert int(redis_client.get(f"{key_prefix}:b") or 0) == 1  # the others ran all the same

    pipe = ScriptPipeline(redis_client)
    pipe.call(broken, [f"{key_prefix}:a"], [])
    pipe.call(count, [f"{key_prefix}:b"], [])
    refused, counted = pipe.execute(raise_on_error=False)
    assert isinstance(refused, redis.ResponseError) and counted == 2


def test_a_batch_refused_after_a_restart_loads_each_script_once_and_runs_again_in_one_pipeline(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """The scheduler's first batch of 500 after a failover: not 500 single calls each loading its script."""
    unknown = fresh(redis_client, COUNT)
    loads, evals = calls(redis_client, "script|load"), calls(redis_client, "evalsha")
    pipe = ScriptPipeline(redis_client)
    for index in range(50):
        pipe.call(unknown, [f"{key_prefix}:n{index}"], [])
    assert pipe.execute() == [1] * 50 and pipe.rerun == list(range(50))
    assert calls(redis_client, "script|load") - loads == 1
    assert calls(redis_client, "evalsha") - evals == 100


SET_ONCE = "return redis.call('SET', KEYS[1], ARGV[1], 'NX') and 1 or 0"
#: What a write sent meanwhile (another client, as Celery's is) finds: whether the call's key exists.
SEEN = "return redis.call('RPUSH', KEYS[2], redis.call('EXISTS', KEYS[1]))"


def test_what_is_sent_meanwhile_on_another_connection_lands_after_the_call(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    """The start's message and its create: a worker taking the message never finds the flow missing."""
    other = redis.Redis.from_url(redis_url)
    script, seen = fresh(redis_client, SET_ONCE), f"{key_prefix}:seen"
    script(keys=[f"{key_prefix}:warm"], args=["x"])
    try:
        for index in range(200):
            key = f"{key_prefix}:k{index}"

            def send(key: str = key) -> None:
                other.eval(SEEN, 2, key, seen)

            assert call_meanwhile(redis_client, script, [key], ["v"], send) == 1
        assert redis_client.lrange(seen, 0, -1) == [b"1"] * 200
    finally:
        other.close()


def test_a_call_refused_noscript_runs_once_and_meanwhile_once(redis_client: redis.Redis, key_prefix: str) -> None:
    unknown, key, ran = fresh(redis_client, COUNT), f"{key_prefix}:counter", []
    assert call_meanwhile(redis_client, unknown, [key], [], lambda: ran.append(1)) == 1
    assert ran == [1] and int(redis_client.get(key) or 0) == 1


def test_a_lost_reply_is_asked_again_and_meanwhile_runs_once(
    redis_client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection dies after the call was applied, before its reply is read (no real server can be
    made to do that on cue: the reply read is made to fail once). The call is made again: the caller's
    script is idempotent, as a create is, and learns it already ran."""
    script, key, ran = fresh(redis_client, SET_ONCE), f"{key_prefix}:once", []
    script(keys=[f"{key_prefix}:warm"], args=["x"])
    real = redis.connection.AbstractConnection.read_response
    failed: list[bool] = []

    def lose_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            real(self, *args, **kwargs)  # the reply arrives, and is lost with the connection
            raise redis.ConnectionError("connection lost")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", lose_once)
    assert call_meanwhile(redis_client, script, [key], ["v"], lambda: ran.append(1)) == 0, "asked again: it had run"
    assert ran == [1] and failed and redis_client.get(key) == b"v"


def test_meanwhile_failing_still_reads_the_reply(redis_client: redis.Redis, key_prefix: str) -> None:
    """The connection goes back to the pool with nothing unread: its next user gets its own reply."""
    script, key = fresh(redis_client, COUNT), f"{key_prefix}:counter"

    def fail() -> None:
        raise RuntimeError("the broker is down")

    with pytest.raises(RuntimeError):
        call_meanwhile(redis_client, script, [key], [], fail)
    assert redis_client.get(key) == b"1"
    assert redis_client.ping() is True and redis_client.incr(key) == 2
