"""The gateway tasks run flow steps only: a request given to one directly is refused before it is sent.

A gateway task once also took a request (``task.delay(request={...})``) and called the operation with
it: a card in that request crossed the broker, and stayed in its Redis's files, in the clear, whatever
``workflows.engine.cards`` sealed. Celery's argument check now refuses such a call in the caller, and nothing
is published.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals

from durapay.config import load_settings
from durapay.gateway import CATALOGUE
from durapay.service.runtime import build_runtime

CARD = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def record(sender: Any = None, body: Any = None, **_: Any) -> None:
        sent.append({"task": sender, "body": body})

    signals.before_task_publish.connect(record, weak=False)
    yield sent
    signals.before_task_publish.disconnect(record)


def test_a_gateway_task_called_with_a_request_is_refused_before_anything_is_sent(
    redis_url: str, key_prefix: str, published: list[dict[str, Any]]
) -> None:
    runtime = build_runtime(load_settings({"engine": {"key_prefix": key_prefix}}), redis_url=redis_url)
    try:
        request = {"order": {"orderId": f"{key_prefix}-1", "amount": "700", "currency": "EUR"}, "card": CARD}
        for op in CATALOGUE:
            task = runtime.celery.tasks[op.task_name]
            with pytest.raises(TypeError):
                task.delay(request=request, idempotency_key="k-1")
            with pytest.raises(TypeError):
                task.apply_async(kwargs={"request": request})
            with pytest.raises(TypeError):
                task.delay("f-1", "pay", request=request)  # a step with a request beside it: refused too
        assert published == [], "nothing reached the broker"  # (a step, flow id and name, is what every flow test sends)
    finally:
        runtime.close()
