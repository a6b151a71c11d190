"""The Celery app factory, with settings that match the durability contract (docs/durability.md).

* ``task_acks_late`` + ``task_reject_on_worker_lost``: a task whose worker dies is delivered again.
* ``worker_prefetch_multiplier = 1``: a worker holds no queue of messages that would die with it.
* JSON only: messages are readable and no pickle ever runs.
* Results are ignored: the flow record in Redis holds every outcome.
* The broker's visibility timeout is above the longest lease, so Redis redelivers an unacknowledged
  message only after the engine's own lease has long handed the step to another worker (the late
  duplicate then finds the step done and does nothing).

Two queues: :data:`QUEUE` carries the flows' steps (and bulk runners), :data:`WEBHOOK_QUEUE` the webhook
deliveries, so that deliveries run on workers of their own (``durapay worker --webhooks``) and no endpoint,
however slow or many, holds a thread a payment step needs. With fairness on (``workflows.engine.fairness``) the
steps go to its queues instead, declared here too (``step_queues``). All are declared, so a worker started without
``--queues`` (the test harness's, in-process) consumes both; ``durapay worker`` names its one.

Delays are never Celery ETAs/countdowns (Redis redelivers long ETA tasks after the visibility timeout and
runs them twice): the engine's ``due`` set and dispatcher carry every delay.

A worker rides out a Redis outage (docs/operations.md): it retries the broker for as long as it takes
(``broker_connection_max_retries = None``; Celery's default gave up after 100 tries), lets the steps in
flight finish (their own Redis writes fail and the dispatcher sends them again), and uses
:class:`RedisTransport` (:class:`SentinelTransport` through Sentinel), which closes a lost connection's
channels without the crash described there. Through Sentinel a worker follows any number of failovers:
kombu moves to the next Sentinel address at each connection failure, and :class:`BrokerConnection`
keeps durapay's transport across those moves (kombu's own switch put its stock transport back, and a
worker died at the second or third failover; tests/workflows/integration/test_sentinel.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import redis
from celery import Celery
from celery.app.amqp import AMQP
from kombu.connection import Connection, ConnectionPool, PooledConnection
from kombu.entity import Exchange, Queue
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

from durapay.config.connect import SENTINEL_SCHEME, parse_sentinel_url
from durapay.config.settings import Settings

QUEUE = "durapay"
#: Webhook deliveries: consumed by ``durapay worker --webhooks`` only (never by the step workers).
WEBHOOK_QUEUE = "durapay.webhooks"


class _Guard:
    """kombu's Redis channel, refusing to reconnect through a connection that was already collected.

    After a connection loss Celery calls ``connection.collect()``, which detaches the transport from
    its connection even when closing a channel was cut short by the dead socket (a ``BRPOP`` still
    outstanding). Any later use of such a channel (closing it, restoring its unacknowledged messages,
    acknowledging a task that finished meanwhile) builds a new Redis client from the detached
    transport and failed with ``AttributeError: 'NoneType' object has no attribute 'hostname'``,
    which Celery treats as fatal ("Unrecoverable error") where it should reconnect. Here it is a
    ``redis.ConnectionError``, the error kombu and Celery already handle as a lost broker. The
    messages stay in the broker's unacknowledged set and come back after the visibility timeout;
    the engine's dispatcher re-sends the flows long before that.
    """

    connection: Any

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise redis.ConnectionError("the broker connection was closed after a connection loss; reconnecting")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]
        return params


class _GuardedChannel(_Guard, kombu_redis.Channel):
    """kombu's Redis channel with :class:`_Guard`."""


class _GuardedSentinelChannel(_Guard, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel with :class:`_Guard` (after a failover the same crash happened there)."""


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`_GuardedChannel`."""

    Channel = _GuardedChannel


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with :class:`_GuardedSentinelChannel`."""

    Channel = _GuardedSentinelChannel


class BrokerConnection(Connection):
    """kombu's connection, keeping the transport it was given across its failover switches.

    With several broker addresses (kombu's ``a;b;c`` form: here, the Sentinels) kombu moves to the next
    one on a connection failure (``maybe_switch_next`` -> ``switch``), and ``switch`` takes the transport
    from the new URL's scheme, dropping the one named at construction: durapay's guarded Sentinel
    transport became kombu's stock one at the first failover, and a later failover crashed the worker
    with the ``AttributeError`` the guard exists for (issue 28). Here a transport named at construction
    (an import path, as ``broker_transport`` gives it) stays; a transport kombu took from a scheme
    itself (RabbitMQ's ``amqp``) is left to kombu as before. Copies (``clone``) are of this class, and
    so are the connections of its pool (the producers' pool that sends every step)."""

    def switch(self, conn_str: str) -> None:
        named = self._initial_params.get("transport")
        super().switch(conn_str)  # type: ignore[no-untyped-call]
        if named and not (isinstance(named, str) and named in TRANSPORT_ALIASES):
            self.transport_cls = named

    def Pool(self, limit: int | None = None, **kwargs: Any) -> ConnectionPool:  # kombu's name
        return _BrokerPool(self, limit=limit, **kwargs)  # type: ignore[no-untyped-call]


class _PooledBrokerConnection(PooledConnection, BrokerConnection):
    """A pool's connection (kombu's wrapper) that keeps its transport like :class:`BrokerConnection`."""


class _BrokerPool(ConnectionPool):
    """kombu's connection pool, making :class:`_PooledBrokerConnection`."""

    def new(self) -> PooledConnection:
        return _PooledBrokerConnection(self, **dict(self.connection._info(resolve=False)))  # type: ignore[no-untyped-call]


class _AMQP(AMQP):  # type: ignore[misc]
    """Celery's broker plumbing, its connections being :class:`BrokerConnection`."""

    Connection = BrokerConnection


def kombu_broker(broker_url: str) -> tuple[str, dict[str, Any]]:
    """kombu's URL and transport options for ``broker_url``: a ``redis+sentinel://h1:p1,h2:p2/<master>/<db>``
    URL becomes kombu's ``sentinel://h1:p1/<db>;sentinel://h2:p2/<db>`` with the master's name as an
    option (kombu asks the Sentinels for the primary at each connection, so it follows a failover);
    any other URL is kombu's as it is."""
    if urlsplit(broker_url).scheme != SENTINEL_SCHEME:
        return broker_url, {}
    target = parse_sentinel_url(broker_url)
    auth = f":{quote(target.password, safe='')}@" if target.password else ""
    url = ";".join(f"sentinel://{auth}{host}:{port}/{target.db}" for host, port in target.sentinels)
    return url, {"master_name": target.master}


def make_celery(settings: Settings, broker_url: str, *, step_queues: Sequence[str] = ()) -> Celery:
    """A Celery app on ``broker_url`` (the configured broker, else the Redis in use). ``step_queues``: the
    fairness queues (``workflows.engine.fairness``), declared beside the two, so that a worker consumes them."""
    broker, options = kombu_broker(broker_url)
    app = Celery("durapay", broker=broker, set_as_current=False, amqp=_AMQP)
    visibility = max(3600, int(settings.engine.lease_seconds * 3))
    scheme = urlsplit(broker).scheme
    transport = {"redis": RedisTransport, "rediss": RedisTransport, "sentinel": SentinelTransport}.get(scheme)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        task_default_queue=QUEUE,
        # As Celery declares its default queue (an exchange of its name, routed by its name).
        task_queues=[Queue(name, Exchange(name), routing_key=name) for name in (QUEUE, WEBHOOK_QUEUE, *step_queues)],  # type: ignore[no-untyped-call]
        broker_transport=f"{__name__}:{transport.__name__}" if transport else None,
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Steps in flight finish on their own: cancelling them would turn a Redis outage into
        # ambiguous gateway calls.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_transport_options={"visibility_timeout": visibility, **options},
        worker_hijack_root_logger=False,
        # Task events cost every task a message; Flower turns them on at run time (compose passes -E).
        worker_send_task_events=False,
        task_send_sent_event=False,
        enable_utc=True,
        timezone="UTC",
    )
    return app
