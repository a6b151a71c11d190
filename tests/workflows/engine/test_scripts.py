"""ScriptPipeline on the real server: no SCRIPT EXISTS per execute, and a script the server lacks runs
exactly once all the same."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from durapay.config.connect import resend_safe
from durapay.workflows.engine.scripts import RESEND_SAFE, ScriptPipeline, assemble, needs, package_file, register, source

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


def test_every_script_states_whether_a_second_run_after_a_lost_answer_is_harmless() -> None:
    """A script is sent again after a lost connection (a failover) only when declared resend-safe
    (config/connect.py): every Lua file of the package is classified, and a name that is not is refused."""
    root = package_file("")
    found = {str(path.relative_to(root)) for path in Path(str(root)).rglob("*.lua")}
    assert found and found <= set(RESEND_SAFE), (
        f"not classified in workflows/engine/scripts.py RESEND_SAFE: {found - set(RESEND_SAFE)}"
    )
    assert {"engine/lua/claim.lua", "engine/lua/transition.lua", "engine/lua/signal.lua"} <= {
        name for name, (safe, _) in RESEND_SAFE.items() if safe
    }
    assert not RESEND_SAFE["engine/lua/gate.lua"][0] and not RESEND_SAFE["webhooks/lua/record.lua"][0]
    with pytest.raises(KeyError):
        register(redis.Redis(), "engine/lua/unknown.lua", "return 1")


def test_a_script_is_declared_resend_safe_to_its_client_only_when_it_is(redis_client: redis.Redis) -> None:
    claim = register(redis_client, "engine/lua/claim.lua", f"-- {uuid.uuid4().hex}\nreturn 1")
    gate = register(redis_client, "engine/lua/gate.lua", f"-- {uuid.uuid4().hex}\nreturn 1")
    assert claim.sha in resend_safe(redis_client) and gate.sha not in resend_safe(redis_client)


def test_a_script_is_assembled_with_the_shared_functions_it_needs_each_once_before_it() -> None:
    """``-- needs:`` on a script's first line: the files of the functions it calls, put before it (and what
    they need, before them), each once. The flow's create has one home (create_flow.lua), which create.lua
    and the scheduler's fire.lua both run."""
    assert needs("engine/lua/create.lua") == ["engine/lua/create_flow.lua"]
    fire = assemble("schedules/lua/fire.lua")
    events, create = source("engine/lua/events.lua"), source("engine/lua/create_flow.lua")
    change = source("schedules/lua/change.lua")
    assert fire == events + create + change + source("schedules/lua/fire.lua")
    assert assemble("engine/lua/create.lua") == events + create + source("engine/lua/create.lua")
    defined = "local function create_flow("
    assert fire.count(defined) == 1 and defined not in source("schedules/lua/fire.lua")


def test_the_create_runs_the_same_alone_and_inside_another_script(redis_client: redis.Redis, key_prefix: str) -> None:
    """create.lua is create_flow.lua's function called with the script's own KEYS and ARGV: a flow created,
    then found existing with its input hash, then an order lookup another flow holds refused."""
    create = redis_client.register_script(assemble("engine/lua/create.lua"))
    keys = [f"{key_prefix}:{name}" for name in ("flow", "log", "due", "state", "kind", "events", "order")]
    args = ["f1", "100.0", '{"t":100}', "100.0", "", "state", "ready", "step", "pay", "kind", "mit", "version", "1"]
    args += ["input_hash", "h1"]
    assert create(keys=keys, args=args) == [1, b"", 1]
    assert create(keys=keys, args=args) == [0, b"h1", 0]
    other = [f"{key_prefix}:flow2", *keys[1:]]
    assert create(keys=other, args=["f2", *args[1:]]) == [2, b"f1", 0]
    assert not redis_client.exists(other[0])
