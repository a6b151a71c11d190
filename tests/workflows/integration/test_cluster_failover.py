"""Failovers on a six-node Redis Cluster: three primaries, each with a replica (``CLUSTER REPLICATE``),
a short ``cluster-node-timeout`` so that a killed primary's replica takes over within seconds.

Issue 28's campaign found, on such a cluster: no process started while the one node named in
``DURAPAY_REDIS_URL`` was down (the client had a single startup node); after a failover a step's
pinned connection to the dead node failed on its next use, and a completion that failed during the
promotion was not retried, so the flow waited out its lease. Shown here: a process starts with the
first startup node down (the URL names several); and, under load, with ``durapay worker`` (two),
``durapay worker --webhooks``, ``durapay scheduler`` and ``durapay api`` running as the processes they
are, two primaries killed (one of them the first node of the URL, kept down while a worker and the api
restart) and a slot of a partition migrated: no process exits, every flow succeeds charged once, every
webhook is delivered, and no flow waited out its lease (no claim in any history was made "after the
lease ran out"); no start, the migration's included, took longer than ``MIGRATION_WAIT``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import redis
from redis.cluster import key_slot
from redis.exceptions import RedisClusterException

from bench._webhook_receiver import WebhookReceiver
from durapay._http import ApiError
from durapay.client import Client
from durapay.config.connect import open_redis, resend_safe
from durapay.config.embedded import free_port
from durapay.service.processes import Child, settings_env
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.pins import Pins
from durapay.workflows.engine.states import FlowState
from tests.waiting import wait_until
from tests.workflows.integration import test_flows as flows
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_exactly_once import payments
from tests.workflows.integration.topology import ValkeyCluster

pytestmark = pytest.mark.integration

API_KEY = "cluster-failover-operator-key"
#: Longer than any failover here (about two seconds), so that a flow that waited one out is told apart.
LEASE = 30.0


@pytest.fixture(scope="module")
def six(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyCluster]:
    with ValkeyCluster(Path(tmp_path_factory.mktemp("six")), 3, replicas=1, node_timeout_ms=1000) as running:
        yield running


def fail_over(cluster: ValkeyCluster, index: int) -> None:
    """SIGKILL primary ``index`` and wait until its replica serves its slots (the cluster is ok)."""
    assert index in cluster.primaries(), (index, cluster.primaries())
    cluster.kill(index)
    cluster.wait_ready(60)


def rejoin(cluster: ValkeyCluster, index: int) -> None:
    cluster.restart(index)
    cluster.wait_ready(60)


def test_a_process_starts_while_the_first_node_of_the_url_is_down(six: ValkeyCluster, redis_url: str, key_prefix: str) -> None:
    """Issue 28: the cluster client had one startup node, the one in the URL; with it down nothing
    started, though its replica served its slots. With several startup nodes, any that answers will do."""
    first = six.primaries()[0]
    fail_over(six, first)
    try:
        alone = six.nodes[first]
        with pytest.raises((redis.ConnectionError, RedisClusterException)):  # as before: that node alone
            open_redis(alone.url, cluster=True, socket_connect_timeout=1).ping()
        startup = "redis://" + ",".join(f"{n.host}:{n.port}" for n in [alone, *six.nodes[:first], *six.nodes[first + 1 :]]) + "/0"
        settings = stack_settings(key_prefix, "http://127.0.0.1:9", redis_url=startup, redis_cluster=True, broker_url=redis_url)
        runtime = build_runtime(settings, redis_url=startup)
        try:
            tag = f"{{{key_prefix}}}"
            for number in range(30):  # keys on every slot range, the promoted replica's among them
                runtime.redis.set(f"{key_prefix}:{number}", number)
            assert [int(runtime.redis.get(f"{key_prefix}:{number}")) for number in range(30)] == list(range(30))
            assert runtime.redis.set(f"{tag}:x", 1)
        finally:
            runtime.close()
    finally:
        rejoin(six, first)


def test_a_script_and_a_pinned_write_ride_out_their_primary_s_failover(six: ValkeyCluster, key_prefix: str) -> None:
    """Issue 28: a step's pinned connection to a killed primary failed on its next use, and a completion
    sent during the promotion failed too (redis-py's three quick tries end long before a replica takes
    over): the flow waited out its lease. Both, resend-safe, are now sent again on a fresh connection, the
    slot map read anew, until the promoted replica answers (within FAILOVER_WAIT)."""
    client = open_redis(six.urls, cluster=True, socket_timeout=5, socket_connect_timeout=1)
    pins = Pins(client)
    key = f"{{{key_prefix}}}:pinned"
    script = client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
    resend_safe(client).add(script.sha)  # a plain overwrite: a second run is harmless (workflows/engine/scripts.py)
    pins.run(key, lambda pinned: pinned.set(key, "pinned"), resend=True)  # the pinned connection to the key's owner
    owner = six.owner(key_slot(key.encode()))
    six.kill(owner)
    try:
        # Each is resent until the promoted replica answers, or raises after FAILOVER_WAIT: answered, it
        # rode the failover out (no wall time asserted).
        assert script(keys=[key], args=["script"]) == b"OK"
        answer, _ = pins.run(key, lambda pinned: pinned.set(key, "again"), resend=True)
        assert answer is True
        assert client.get(key) == b"again"
    finally:
        client.close()
        rejoin(six, owner)


def test_failovers_and_a_migration_under_load_cost_no_lease(
    six: ValkeyCluster, redis_url: str, key_prefix: str, simulator: SimulatorServer, tmp_path: Path
) -> None:
    simulator.admin.set_faults(latency_ms=100)  # steps in flight at each kill
    port = free_port()
    url_node = six.primaries()[0]
    startup = (
        "redis://"
        + ",".join(f"{n.host}:{n.port}" for n in [six.nodes[url_node], *six.nodes[:url_node], *six.nodes[url_node + 1 :]])
        + "/0"
    )
    settings = stack_settings(
        key_prefix,
        simulator.base_url,
        redis_url=startup,
        redis_cluster=True,
        broker_url=redis_url,
        data_dir=str(tmp_path / "data"),
        engine={"partitions": 16, "lease_seconds": LEASE},
        # A lease of more than twice an attempt's deadline (connect + timeout): the settings check it.
        webhooks={"allow_private": True, "lease_seconds": 5.0, "timeout": 1.5, "connect_timeout": 0.5},
        api={"port": port, "key": API_KEY},
    )
    env = settings_env(settings)
    logs = tmp_path / "logs"
    logs.mkdir()
    worker_args = ["--pool", "threads", "--concurrency", "4", "--quiet"]
    workers = [Child("worker", f"w{index}", env, logs, [*worker_args, "--hostname", f"w{index}@%h"]) for index in range(2)]
    # Webhook deliveries run on a worker of their own (``durapay worker --webhooks``), as deployed.
    deliveries = Child("worker", "webhooks", env, logs, ["--webhooks", "--concurrency", "4", "--quiet"])
    scheduler, api_process = Child("scheduler", "scheduler", env, logs, []), Child("api", "api", env, logs, [])
    children = [*workers, deliveries, scheduler, api_process]
    runtime = build_runtime(settings, redis_url=startup)
    started: list[str] = []
    refused: list[BaseException] = []
    loading = threading.Event()
    with ExitStack() as stack:
        stack.callback(runtime.close)
        receiver = stack.enter_context(WebhookReceiver())
        endpoint = runtime.webhooks.endpoints.add(receiver.url)
        receiver.secrets = [endpoint.secret]
        for child in children:
            child.start()
            stack.callback(child.stop)
        api = stack.enter_context(Client(f"http://127.0.0.1:{port}", API_KEY, timeout=10.0, rng=random.Random(9)))
        wait_until(lambda: _answers(api), 60, "the api to answer")

        def load() -> None:  # about ten starts a second; each retried (same key: one flow) while the api restarts
            index = 0
            while loading.is_set() and index < 300:
                order = {"orderId": f"{key_prefix}-{index}", "amount": "1500", "currency": "EUR"}
                deadline = time.monotonic() + 90
                while True:
                    try:
                        started.append(api.start("moto", {"order": order, "card": flows.card()}, key=f"cf-{index}").id)
                        break
                    except (ApiError, httpx.HTTPError) as exc:
                        if (isinstance(exc, ApiError) and not exc.retryable) or time.monotonic() > deadline:
                            refused.append(exc)
                            return
                        time.sleep(0.1)
                index += 1
                time.sleep(0.1)

        def more(count: int) -> None:
            wait_until(lambda: refused or len(started) >= count, 90, f"{count} flows started")
            assert not refused, refused

        loading.set()
        starter = threading.Thread(target=load)
        starter.start()
        stack.callback(starter.join, 120)
        stack.callback(loading.clear)

        more(30)
        fail_over(six, url_node)  # the first node of the URL: kept down while a worker and the api restart
        for child in (workers[0], api_process):
            child.stop()
            child.start()
        wait_until(lambda: _answers(api), 60, "the restarted api to answer")
        more(len(started) + 20)
        rejoin(six, url_node)

        slot = key_slot(runtime.engine.keys.due(3).encode())
        source = six.owner(slot)
        target = next(index for index in six.primaries() if index != source)
        assert six.migrate(slot, source, target, batch=20) > 0
        more(len(started) + 20)

        other = next(index for index in six.primaries() if index != target)
        fail_over(six, other)
        more(len(started) + 20)
        rejoin(six, other)
        loading.clear()
        starter.join(120)
        assert not refused, refused  # (a start the migration held past MIGRATION_WAIT would be refused)

        done = [runtime.engine.wait(flow_id, 120) for flow_id in started]
        states = [record.state for record in done]
        assert states == [FlowState.SUCCEEDED] * len(done), {state: states.count(state) for state in set(states)}
        for record in done:
            charged = payments(simulator, record.orders)
            assert len(charged) == 1, (record.id, charged)
        waited = [flow_id for flow_id in started if "after the lease ran out" in str(runtime.engine.history(flow_id))]
        assert not waited, f"{len(waited)} flows waited out their lease: {waited[:3]}"
        expected = {event.id for event, _ in runtime.engine.events()}
        wait_until(lambda: expected <= set(receiver.applied), 60, "every webhook delivered")
        assert receiver.refused == 0
        exited = {child.name: child.returncode for child in children if not child.alive}
        assert not exited, exited
    simulator.admin.clear_faults()


def _answers(api: Client) -> bool:
    try:
        api.healthz()
    except (ApiError, httpx.HTTPError):
        return False
    return True
