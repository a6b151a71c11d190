"""Flows sharing a gateway target with a real worker and dispatcher (issue 36): one unresolved money call
per payment order or reservation at a time, a waiting step woken when the holder lets go, and each flow
ending with the one operation its own key made (docs/durability.md, "One money call at a time per target")."""

from __future__ import annotations

import time
from typing import Any

import pytest

from durapay.gateway import Catalogue
from durapay.workflows.engine.keys import step_idempotency_key
from durapay.workflows.engine.states import FlowState
from tests.workflows.flows.test_reservations_charges import paid_reservation
from tests.workflows.integration.conftest import Stack
from tests.workflows.integration.test_flows import APPROVE, card

STOPPED = frozenset({FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION})


def own_operations(stack: Stack, flow_id: str, step: str) -> list[dict[str, Any]]:
    """The operations the gateway made under the flow's step's Idempotency-Key."""
    return stack.simulator.admin.operations(idempotency_key=step_idempotency_key(flow_id, step))


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["refund", "incremental"])
def test_flows_on_one_target_whose_first_answer_is_lost_each_end_with_their_own_operation(stack: Stack, kind: str) -> None:
    """Three refunds of one payment (or three incremental charges of one reservation) started at once, the
    first call's answer lost after the gateway acted: each flow ends succeeded naming the operation its own
    key made, three operations in all."""
    tag = f"{time.time_ns() % 10**8}"
    if kind == "refund":
        order = {"orderId": f"sh{tag}", "amount": "6000", "currency": "EUR"}
        paid = stack.engine.gateway().call(Catalogue.create_moto_order, request={"order": order, "card": card(APPROVE)})
        data: dict[str, Any] = {"operationId": paid.operation.operationId, "amount": 1000, "currency": "EUR"}
        operation, step = "refund_operation", "post"
    else:
        paid_reservation(stack.engine, stack.simulator, f"sr{tag}", 20000)
        data = {"reservationId": f"sr{tag}", "amount": 3000, "currency": "EUR"}
        operation, step = "create_incremental", "charge"
    stack.simulator.admin.set_faults(mode="commit_then_fail", operation=operation, count=1)
    flows = [stack.engine.start(kind, data) for _ in range(3)]
    done = [stack.engine.wait(flow.id, 60, states=STOPPED) for flow in flows]
    named = set()
    for record in done:
        assert record.state is FlowState.SUCCEEDED, (record.summary(), stack.engine.history(record.id))
        (own,) = own_operations(stack, record.id, step)
        assert record.outcome is not None and record.outcome["operation"]["operationId"] == own["operationId"]
        named.add(own["operationId"])
    assert len(named) == 3
