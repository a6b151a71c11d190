"""ScriptPipeline on the real server: no SCRIPT EXISTS per execute, and a script the server lacks runs
exactly once all the same."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from durapay.workflows.scripts import ScriptPipeline

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
