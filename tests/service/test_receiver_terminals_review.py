"""Review of issue 40's terminals (review40t): the receiver's read-back of a notification whose flow
record is gone, on a terminal other than ``default``. FAILS on the terminals branch's tip.

``NotificationReceiver.terminal_of`` reads the flow record's ``terminal`` field: a record that is gone
while its order lookup outlived it (the case tests/service/test_receiver.py's
``test_an_authentic_notification_whose_flow_record_is_gone_is_told_not_dropped`` is about) reads as
``default``, so the read-back uses default's key, which cannot see another terminal's operation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from durapay.gateway import Catalogue
from durapay.service.app import create_app
from durapay.service.receiver import NotificationReceiver
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine.compact import Compactor
from tests.service.conftest import NOTIFIED, Served, service_settings
from tests.waiting import wait_until

IT_KEY = "sim-key-terminal-it-review"
NOWHERE = "http://127.0.0.1:9/notifications"


@pytest.fixture(scope="module")
def two_terminals() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=43, terminal_keys={IT_KEY: "it"})) as server:
        yield server


@pytest.fixture
def served_it(redis_url: str, key_prefix: str, two_terminals: SimulatorServer) -> Iterator[Served]:
    sim = two_terminals
    sim.admin.reset()
    sim.admin.set_faults(mode="notify_drop")  # the test posts the simulator's body itself
    settings = service_settings(
        key_prefix,
        gateway={"base_url": sim.base_url},
        receiver={"public_url": NOWHERE},
        terminals={"it": {"api_key": IT_KEY}},
    )
    runtime: Runtime = build_runtime(settings, redis_url=redis_url, flows={"notified": NOTIFIED})
    runtime.engine.sender = None
    with ApiServer(create_app(runtime)) as server, httpx.Client(base_url=server.url, timeout=10.0) as http:
        yield Served(runtime, server, http)
    runtime.engine.gateway("it").close()
    runtime.engine.gateway().close()
    runtime.close()


def test_an_authentic_notification_of_another_terminal_whose_flow_record_is_gone_is_told_not_dropped(
    served_it: Served, two_terminals: SimulatorServer
) -> None:
    """Moves: a ``notified`` flow on terminal ``it`` waits on a hosted page made with it's key; its record
    expires before its order lookup (a renewal kept the lookups longer); the customer pays; the gateway's
    notification comes. The receiver reads the operation back with ``default``'s key (the gone record names
    no terminal), the gateway answers 404, and the notification is answered 503 ``unverified`` at every
    retry of the gateway: the payment (money taken, in no flow) is never told as ``notification.unknown_order``,
    as it is on ``default``."""
    engine, sim = served_it.engine, two_terminals
    order_id = "ord-it-gone"
    created = engine.gateway("it").call(
        Catalogue.create_hpp_order,
        request={
            "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
            "paymentSession": {
                "actionType": "PAY",
                "amount": "1500",
                "language": "eng",
                "resultUrl": "https://shop.example/r",
                "notificationUrl": NOWHERE,
            },
        },
    )
    record = engine.start("notified", {"orderId": order_id, "token": created.securityToken}, terminal="it")
    assert engine.run_step(record.id, "create") == "ready"
    assert engine.run_step(record.id, "payment") == "waiting"
    engine.redis.delete(engine.keys.flow(record.id))  # the record expired before its lookups

    done = sim.admin.complete_hpp(order_id, pan="4349940199004549")
    (sent,) = [n for n in sim.admin.notifications(order_id=order_id) if n["operationId"] == done["operationId"]]
    body: dict[str, Any] = sent["body"]
    answer = served_it.http.post("/notifications", json=body)
    assert answer.status_code == 200, f"answered {answer.status_code} {answer.text}: read back with default's key"
    wait_until(lambda: served_it.counter("unknown_order") == 1, 10, "the notification counted as an unknown order")


def test_the_terminal_of_a_packed_flow_off_default_is_its_own_and_a_gone_one_is_not_known(served_it: Served) -> None:
    """The read-back's terminal: a finished flow's record packed (``workflows.engine.compact``) keeps ``kind`` and
    ``terminal`` plain, so it still names ``it`` (never read with another key); a gone record names none
    (None: each declared terminal's key is tried, as the test above shows)."""
    engine = served_it.engine
    receiver = NotificationReceiver(engine, engine.settings.receiver)
    record = engine.start("notified", {"orderId": "ord-it-packed", "token": "t"}, terminal="it")
    on_default = engine.start("notified", {"orderId": "ord-default-packed", "token": "t"})
    for flow in (record, on_default):
        engine.cancel(flow.id)
    assert (
        Compactor(engine.redis, engine.keys, engine.orders, tell=engine.tell_holder, delay=0.0).run(now=engine.clock.now()) >= 2
    )
    assert engine.redis.hexists(engine.keys.flow(record.id), "z"), "packed"
    assert receiver.terminal_of(record.id) == "it"
    assert receiver.terminal_of(on_default.id) == "default"
    engine.redis.delete(engine.keys.flow(record.id))
    assert receiver.terminal_of(record.id) is None
