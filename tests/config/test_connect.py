"""Reaching the store and the broker: Sentinel URLs, the cluster switch, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from durapay.config.celery import kombu_broker, make_celery
from durapay.config.connect import (
    ClusterClient,
    open_redis,
    parse_sentinel_url,
    resend_safe,
    resendable,
    split_addresses,
)
from durapay.config.settings import Settings, SettingsError, load_settings
from durapay.service.cli._common import safe_url
from tests.config.lost_answer import LostAnswers, lose_answer  # noqa: F401
from tests.workflows.integration.topology import ValkeyCluster


def test_a_sentinel_url_names_the_sentinels_the_master_the_db_and_the_password() -> None:
    target = parse_sentinel_url("redis+sentinel://:s3cr%40t@10.0.0.1:26379,sentinel-b:26380/payments/2")
    assert target.sentinels == (("10.0.0.1", 26379), ("sentinel-b", 26380))
    assert (target.master, target.db, target.password) == ("payments", 2, "s3cr@t")
    plain = parse_sentinel_url("redis+sentinel://127.0.0.1:26379/mymaster")
    assert (plain.master, plain.db, plain.password) == ("mymaster", 0, None)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel://127.0.0.1:26379", "name the master"),
        ("redis+sentinel://127.0.0.1/mymaster", "must be host:port"),
        ("redis+sentinel://127.0.0.1:26379/mymaster/x", "/<master>[/<db number>]"),
    ],
)
def test_a_bad_sentinel_url_is_refused_naming_the_variable(url: str, reason: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({"redis_url": url})
    assert str(refused.value).startswith("DURAPAY_REDIS_URL: ") and reason in str(refused.value)


def test_the_broker_through_sentinel_becomes_kombu_s_form_with_the_master_name() -> None:
    url, options = kombu_broker("redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/durapay/1")
    assert url == "sentinel://:pw@127.0.0.1:26379/1;sentinel://:pw@127.0.0.1:26380/1"
    assert options == {"master_name": "durapay"}
    assert kombu_broker("amqp://guest:guest@127.0.0.1:5672//") == ("amqp://guest:guest@127.0.0.1:5672//", {})
    app = make_celery(Settings(), "redis+sentinel://127.0.0.1:26379/durapay")
    assert app.conf.broker_transport == "durapay.config.celery:SentinelTransport"
    assert app.conf.broker_transport_options["master_name"] == "durapay"


def test_a_cluster_needs_a_broker_of_its_own_and_is_not_reached_through_sentinel() -> None:
    with pytest.raises(SettingsError, match=r"^DURAPAY_BROKER_URL: required with DURAPAY_REDIS_CLUSTER=true"):
        load_settings({"redis_cluster": True, "redis_url": "redis://127.0.0.1:7000"})
    with pytest.raises(SettingsError, match=r"^DURAPAY_REDIS_URL: a Redis Cluster is reached through one of its nodes"):
        load_settings({"redis_cluster": True, "redis_url": "redis+sentinel://127.0.0.1:26379/m", "broker_url": "amqp://h//"})
    settings = load_settings({"redis_cluster": True, "redis_url": "redis://127.0.0.1:7000", "broker_url": "amqp://h//"})
    assert settings.redis_cluster


def test_open_redis_picks_the_client_for_the_topology(redis_url: str) -> None:
    plain = open_redis(redis_url)
    assert plain.ping() and not isinstance(plain, ClusterClient)
    plain.close()
    with pytest.raises(ValueError, match="not reached through Sentinel"):
        open_redis("redis+sentinel://127.0.0.1:26379/m", cluster=True)


def test_a_cluster_that_cannot_be_reached_raises_a_redis_connection_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's cluster client says "cannot be connected" with its own RedisClusterException, which is
    not a RedisError: the heartbeat's thread, the receiver and the API (which all ride out a Redis
    outage by catching RedisError) took it for a defect. durapay's client raises a ConnectionError, at
    once: a read or a script is waited for through a failover (FAILOVER_WAIT) only while some node
    answers, not when none does."""
    with ValkeyCluster(tmp_path, 3) as cluster:
        client = open_redis(cluster.url, cluster=True, socket_timeout=1, socket_connect_timeout=0.5)
        client.set("{t}:k", "1")
        script = client.register_script("return redis.call('GET', KEYS[1])")
        for node in cluster.nodes:
            node.kill()
        looks: list[bool] = []
        real = ClusterClient.lost_node

        def counted(self: ClusterClient) -> bool:
            looks.append(real(self))
            return looks[-1]

        monkeypatch.setattr(ClusterClient, "lost_node", counted)
        with pytest.raises(redis.ConnectionError):
            client.get("{t}:k")
        with pytest.raises(redis.ConnectionError):
            script(keys=["{t}:k"])
        # At once: at most one look per command for a node that answers, none found, no wait for a failover.
        assert len(looks) <= 2 and not any(looks), looks
        with pytest.raises(redis.ConnectionError):
            pipe = client.pipeline(transaction=False)
            pipe.get("{t}:k")
            pipe.execute()
        client.close()


def test_a_cluster_url_may_name_several_startup_nodes() -> None:
    """Issue 28: with one startup node, no process started while that node was down. A URL names
    several (any reachable one will do); the first keeps the URL's password, db and options."""
    first, addresses = split_addresses("redis://:p%40ss@10.0.0.1:7000,10.0.0.2:7001, 10.0.0.3:7002/0?ssl_cert_reqs=none")
    assert first == "redis://:p%40ss@10.0.0.1:7000/0?ssl_cert_reqs=none"
    assert addresses == (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("10.0.0.3", 7002))
    assert split_addresses("redis://node-a/0") == ("redis://node-a/0", ())  # one address: as it is
    settings = load_settings({"redis_url": "redis://a:7000,b:7001/0", "redis_cluster": True, "broker_url": "redis://q:6379/0"})
    assert settings.redis_url == "redis://a:7000,b:7001/0"
    assert safe_url("redis://:secret@a:7000,b:7001/0") == "redis://:***@a:7000,b:7001/0"


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"redis_url": "redis://a:7000,b:7001/0"}, "set DURAPAY_REDIS_CLUSTER=true"),
        ({"redis_url": "redis://a:7000,b/0", "redis_cluster": True, "broker_url": "redis://q:6379/0"}, "'b' must be host:port"),
    ],
)
def test_several_addresses_are_refused_outside_a_cluster_or_without_ports(values: dict[str, object], reason: str) -> None:
    with pytest.raises(SettingsError, match=reason):
        load_settings(values)


def test_only_reads_and_scripts_declared_resend_safe_are_sent_again_after_a_lost_connection() -> None:
    """A command whose connection was lost may have run: a read may be sent again, a script only when it
    is declared resend-safe (workflows/engine/scripts.py), a bare write never."""
    assert resendable(("GET", "k"), set()) and resendable(("HGETALL", "k"), set())
    assert resendable(("EVALSHA", "abc", 1, "k"), {"abc"}) and resendable(("EVALSHA", b"abc", 1, "k"), {"abc"})
    assert not resendable(("EVALSHA", "abc", 1, "k"), set())
    assert not resendable(("EVAL", "return 1", 0), {"abc"})
    assert not resendable(("INCR", "k"), {"abc"})


def test_on_one_server_a_script_whose_answer_is_lost_is_not_sent_again(
    redis_url: str,
    key_prefix: str,
    lose_answer: LostAnswers,  # noqa: F811
) -> None:
    """A counting script whose answer was lost counts once: the plain client raises the lost connection
    and sends nothing again (redis-py's connections retry nothing), whatever the script; its caller's
    own recovery applies."""
    client = open_redis(redis_url, socket_timeout=2, socket_connect_timeout=1)
    count = client.register_script("return redis.call('INCR', KEYS[1])")
    resend_safe(client).add(count.sha)  # even one declared resend-safe
    key = f"{key_prefix}:count"
    count(keys=[key])  # loaded: the lost answer is the script's own
    lose_answer.sha = count.sha
    with pytest.raises(redis.ConnectionError):
        count(keys=[key])
    assert (lose_answer.lost, lose_answer.sent, client.get(key)) == (1, ["EVALSHA"], b"2")
    assert count(keys=[key]) == 3  # the connection made afresh
    client.close()
