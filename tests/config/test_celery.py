"""The Celery app's broker settings: a worker rides out Redis going away.

The race behind "``durapay worker`` exits when Redis dies" is reproduced here at the transport level,
on a real Valkey killed under a consumer: the worker's event loop always has a ``BRPOP`` outstanding
and holds unacknowledged messages, plus a second channel for remote control. When the connection error
is noticed elsewhere (an ack, a restore timer), Celery's ``collect()`` aborts the channel closes on the
outstanding read and detaches the transport; the ``close()`` that follows then logs "Restoring N
unacknowledged message(s)" and, with kombu's stock Redis transport, raises ``AttributeError('NoneType'
object has no attribute 'hostname')``, which Celery does not count as a connection error: the worker
stopped with "Unrecoverable error".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Exchange, Queue
from kombu.common import ignore_errors

from durapay.config.celery import BrokerConnection, RedisTransport, SentinelTransport, make_celery
from durapay.config.embedded import EmbeddedValkey
from durapay.config.settings import Settings


@pytest.fixture
def doomed_valkey(tmp_path: Path) -> Iterator[EmbeddedValkey]:
    with EmbeddedValkey(tmp_path / "valkey") as server:
        yield server


def test_redis_brokers_use_the_guarded_transport_and_others_do_not() -> None:
    settings = Settings()
    assert make_celery(settings, "redis://127.0.0.1:6390/0").conf.broker_transport == "durapay.config.celery:RedisTransport"
    assert make_celery(settings, "rediss://example:6390/0").conf.broker_transport == "durapay.config.celery:RedisTransport"
    assert make_celery(settings, "amqp://guest:guest@127.0.0.1:5672//").conf.broker_transport is None


def test_retry_settings_ride_out_an_outage() -> None:
    conf = make_celery(Settings(), "redis://127.0.0.1:6390/0").conf
    assert conf.broker_connection_retry and conf.broker_connection_retry_on_startup
    assert conf.broker_connection_max_retries is None, "never give up on the broker: retry until it is back"
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is False


@pytest.mark.integration
def test_closing_after_redis_died_is_a_connection_error_not_an_attribute_error(doomed_valkey: EmbeddedValkey) -> None:
    app = make_celery(Settings(), doomed_valkey.url)
    connection = app.connection_for_read()
    assert isinstance(connection.transport, RedisTransport)
    queue = Queue("guarded", Exchange("guarded", type="direct"), "guarded")
    with connection.Producer() as producer:
        for number in range(3):
            producer.publish({"n": number}, exchange=queue.exchange, routing_key="guarded", declare=[queue])
    received: list[Any] = []
    consumer = connection.Consumer([queue], callbacks=[lambda body, message: received.append(message)])
    consumer.qos(prefetch_count=2)
    consumer.consume()
    connection.drain_events(timeout=5)
    connection.drain_events(timeout=5)
    assert len(received) == 2, "two messages delivered and not acknowledged"
    control = connection.channel()  # like the worker's remote-control (pidbox) channel
    connection.Consumer([Queue("ctl", Exchange("ctl", type="fanout"), auto_delete=True)], channel=control).consume()
    connection.default_channel._brpop_start()  # the event loop's outstanding read

    doomed_valkey.kill()
    ignore_errors(connection, lambda: connection.collect(socket_timeout=1))

    # What Celery does next (Consumer.on_connection_error_after_connected, then the Control step's stop,
    # then the late ack of a task that finished meanwhile); each must be a connection error, ignored.
    ignore_errors(connection, connection.close)
    ignore_errors(connection, control.close)
    ignore_errors(connection, received[0].ack)
    with pytest.raises(redis.ConnectionError, match="broker connection"):
        received[1].ack()


def test_the_sentinel_transport_stays_durapay_s_across_address_switches() -> None:
    """Issue 28: on a connection failure kombu moves to the next Sentinel address (``maybe_switch_next``),
    and its ``switch`` took the transport from that URL's scheme: kombu's stock SentinelTransport
    replaced durapay's guarded one, and the next failover crashed the worker with the AttributeError
    the guard exists for. However many switches, the transport stays durapay's (no server needed:
    switching does not connect)."""
    app = make_celery(Settings(), "redis+sentinel://127.0.0.1:26391,127.0.0.1:26392,127.0.0.1:26393/durapay/0")
    pooled = app.pool.acquire(block=False)  # the producers' pool, which sends every step
    for connection in (app.connection_for_read(), app.connection_for_write(), pooled):
        assert isinstance(connection, BrokerConnection)
        seen = set()
        for _ in range(7):
            assert connection.get_transport_cls() is SentinelTransport
            seen.add(connection.port)
            connection.maybe_switch_next()
        assert len(seen) == 3, "each Sentinel address was tried in turn"
        assert app.connection_for_write().clone().get_transport_cls() is SentinelTransport
        connection.release()
