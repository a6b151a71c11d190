"""Shared fixtures: a real Redis-protocol server for the whole session, and isolated key prefixes.

Tests start their own embedded Valkey (AOF on) unless ``DURAPAY_REDIS_URL`` points at a Redis to use
instead. Each test gets its own key prefix, so tests never see each other's flows.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import kombu.transport.redis
import pytest
import redis

from durapay.config.embedded import EmbeddedValkey
from tests.ids import unique
from tests.resolver import held_resolver  # noqa: F401 - a fixture (a name the resolver never answers)

#: The repository's top-level folders: installed as ``durapay.<name>`` only.
BARE = frozenset({"config", "gateway", "tasks", "workflows", "service", "simulator"})


class BareNames(importlib.abc.MetaPathFinder):
    """Refuses the repository's folders imported by their bare names (``import workflows``,
    ``resources.files("workflows")``) in the test processes. From the checkout's root they would
    resolve, as a second copy of the module, and hide a name that does not exist once installed (ruff's
    TID251 catches the import statements; this catches names given as strings)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if path is None and fullname in BARE:
            raise ImportError(f"{fullname!r} is durapay.{fullname} (the repository's folders are installed as durapay.*)")
        return None


sys.meta_path.insert(0, BareNames())

# The scheduler's daily reconciliation is on by default (production): every scheduler the tests start
# (in this process or as a child given this environment) would run one at its first tick past 03:00 UTC,
# reading the simulator and writing marks and events no test asked for. The tests that mean it turn it
# on (tests/workflows/reconciliation/test_daily.py); the default is checked there with this unset.
os.environ["DURAPAY_RECONCILE__DAILY"] = "false"
# Card data is written to Redis only sealed, and a card-carrying start without a key is refused
# (workflows.engine.cards): the tests' processes (and their children) share one test key. A fixed key, no
# secret: the tests that mean no key (tests/workflows/engine/test_cards.py) set the settings' own.
os.environ.setdefault("DURAPAY_CARD__KEYS", '["test:' + "ZHVyYXBheSB0ZXN0IGNhcmQga2V5LCAzMiBieXRlcyE" + '"]')


@pytest.fixture(scope="session", autouse=True)
def quick_worker_stop() -> Iterator[None]:
    """A Celery worker thread stops only once its ``BRPOP`` on the broker returns: kombu waits up to
    1 s, and the tests start and stop a worker per test (a minute and more of the suite). In the tests
    it waits 0.1 s; the ``durapay worker`` processes they run keep kombu's default."""
    default = kombu.transport.redis.Transport.brpop_timeout
    kombu.transport.redis.Transport.brpop_timeout = 0.1  # type: ignore[assignment] # kombu sends it as is
    yield
    kombu.transport.redis.Transport.brpop_timeout = default


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("DURAPAY_REDIS_URL")
    if configured:
        yield configured
        return
    server = EmbeddedValkey(Path(tmp_path_factory.mktemp("valkey")), appendfsync="always")
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def key_prefix() -> str:
    """A fresh key prefix of letters only: tests build order ids from it (``{key_prefix}-{n}``), and ten
    digits of a hex prefix joined to an index across the dash could look like a card number."""
    return "t" + unique("")[1:11]


#: The files whose tests take longest (a loaded run of 9f87058 on the 2-core machine: 30 s to 150 s
#: each), collected first: pytest-xdist's ``--dist loadfile`` hands files out in collection order, and
#: one of these handed out last keeps one worker running for minutes after the other has finished.
SLOW_FIRST = (
    "tests/examples/test_builds.py",
    "tests/test_snippets.py",
    "tests/service/test_openapi_fuzz.py",
    "tests/workflows/integration/test_sentinel.py",
    "tests/workflows/integration/test_cluster_failover.py",
    "tests/service/cli/test_demo_cmd.py",
    "tests/service/chaos/test_chaos_cmd.py",
    "tests/service/chaos/test_aof.py",
    "tests/workflows/test_wait_model.py",
    "tests/bench/test_soak.py",
    "tests/workflows/test_flow_model.py",
    "tests/workflows/reconciliation/test_run.py",
    "tests/workflows/engine/test_store_properties.py",
    "tests/service/cli/test_serve_cmd.py",
    "tests/workflows/integration/test_webhooks_chaos.py",
    "tests/workflows/integration/test_gateway_health.py",
    "tests/bench/test_fairness.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow files first (``SLOW_FIRST``), the rest in their order (the sort is stable)."""
    rank = {path: index for index, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
