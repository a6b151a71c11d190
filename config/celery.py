"""The Celery app factory, with settings that match the durability contract (DESIGN.md).

* ``task_acks_late`` + ``task_reject_on_worker_lost``: a task whose worker dies is delivered again.
* ``worker_prefetch_multiplier = 1``: a worker holds no queue of messages that would die with it.
* JSON only: messages are readable and no pickle ever runs.
* Results are ignored: the flow record in Redis holds every outcome.
* The broker's visibility timeout is above the longest lease, so Redis redelivers an unacknowledged
  message only after the engine's own lease has long handed the step to another worker (the late
  duplicate then finds the step done and does nothing).

Delays are never Celery ETAs/countdowns (Redis redelivers long ETA tasks after the visibility timeout and
runs them twice): the engine's ``due`` set and dispatcher carry every delay.
"""

from __future__ import annotations

from celery import Celery

from config.settings import Settings

QUEUE = "durapay"


def make_celery(settings: Settings, broker_url: str) -> Celery:
    """A Celery app on ``broker_url`` (the configured broker, else the Redis in use)."""
    app = Celery("durapay", broker=broker_url, set_as_current=False)
    visibility = max(3600, int(settings.engine.lease_seconds * 3))
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
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": visibility},
        worker_hijack_root_logger=False,
        # Task events cost every task a message; Flower turns them on at run time (compose passes -E).
        worker_send_task_events=False,
        task_send_sent_event=False,
        enable_utc=True,
        timezone="UTC",
    )
    return app
