"""A delayed charge set a month ahead fires once after the worker, the scheduler and Redis restart.

Redis is a private Valkey with AOF (``appendfsync always``) that is killed, not stopped, while the charge
sleeps on the due set; a new runtime, worker and dispatcher then take over, and moving the clock a month
ahead fires the charge exactly once. Both ways of timing a charge are covered: ``engine.start(...,
run_at=...)`` and the flow's own ``runAt`` timer step.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from durapay.config.embedded import EmbeddedValkey
from durapay.gateway import Catalogue
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from tests.workflows.schedules.harness import Receiver, Stack, running_receiver

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

MONTH = 30 * 86400.0


@pytest.fixture
def simulator_server() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=13)) as server:
        yield server


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def paid_reservation(stack: Stack, reservation_id: str) -> None:
    with stack.gateway() as client:
        reservation = {
            "reservationId": reservation_id,
            "amount": "30000",
            "currency": "EUR",
            "reservationType": "PREPAID_REFUNDABLE",
        }
        client.call(Catalogue.create_reservation, request={"reservation": reservation})
        link = client.call(Catalogue.create_reservation_paybylink, reservation_id, request={})
    stack.sim.admin.complete_link(link.paymentLink.linkId)


def test_a_delayed_charge_a_month_ahead_fires_once_after_worker_scheduler_and_redis_restart(
    tmp_path: Path, key_prefix: str, simulator_server: SimulatorServer, receiver: Receiver
) -> None:
    valkey = EmbeddedValkey(tmp_path / "valkey", appendfsync="always")
    valkey.start()
    clock = ManualClock(datetime(2026, 7, 1, tzinfo=UTC).timestamp())
    try:
        with Stack(valkey.url, key_prefix, simulator_server, receiver, clock=clock) as stack:
            stack.start_worker()
            stack.start_dispatchers(1)
            paid_reservation(stack, "res-late")
            charge = {"reservationId": "res-late", "amount": 4500, "currency": "EUR", "description": "minibar"}
            by_start = stack.engine.start("delay_charge", charge, key="minibar", run_at=clock.now() + MONTH).id
            run_at = datetime.fromtimestamp(clock.now() + MONTH, UTC).isoformat()
            by_input = stack.engine.start("delay_charge", {**charge, "amount": 800, "runAt": run_at}, key="damage").id
            for flow_id in (by_start, by_input):
                stack.wait_until(lambda f=flow_id: stack.engine.get(f).state is FlowState.SLEEPING, what=f"{flow_id} asleep")
            stack.settle(clock.now() + MONTH - 60)  # a minute early: nothing fires
        valkey.restart(crash=True)
        with Stack(valkey.url, key_prefix, simulator_server, receiver, clock=clock) as stack:
            assert {stack.engine.get(f).state for f in (by_start, by_input)} == {FlowState.SLEEPING}
            assert simulator_server.admin.operations(operation_type="DELAY_CHARGE") == []
            stack.start_worker()
            stack.start_dispatchers(2)
            clock.advance(120)
            for flow_id in (by_start, by_input):
                done = stack.wait_until(
                    lambda f=flow_id: (r := stack.engine.get(f)).state is FlowState.SUCCEEDED and r, what=f"{flow_id}"
                )
                assert done.outcome["operation"]["operationType"] == "DELAY_CHARGE"
            stack.settle(clock.now() + MONTH)
            charges = simulator_server.admin.operations(operation_type="DELAY_CHARGE")
            assert sorted(op["amount"] for op in charges) == [800, 4500]
            assert len({op["idempotencyKey"] for op in charges}) == 2
    finally:
        valkey.stop()
