"""What the judge holds between pages is bounded: past ``MAX_PENDING`` flows held for their check, the
newest-ended are checked at once by id (their findings as they would be later), and it never holds more."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.workflows.reconciliation import judge as judge_module
from durapay.workflows.reconciliation.findings import FLOW_WITHOUT_MONEY, Lookups
from durapay.workflows.reconciliation.judge import Judge
from durapay.workflows.states import FlowState
from durapay.workflows.store import FlowRecord


def succeeded(flow_id: str, operation_id: str) -> FlowRecord:
    operation = {"operationId": operation_id, "operationAmount": "100", "operationCurrency": "EUR", "operationResult": "EXECUTED"}
    return FlowRecord(
        id=flow_id,
        kind="moto",
        state=FlowState.SUCCEEDED,
        step="pay",
        version=3,
        attempt=0,
        created=0.0,
        updated=0.0,
        input={},
        outcome={"result": "succeeded", "operation": operation, "operationIds": [operation_id]},
    )


def test_the_flows_held_for_their_check_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge_module, "MAX_PENDING", 3)
    records = {f"f{n}": succeeded(f"f{n}", f"o{n}") for n in range(6)}
    gateway = {f"o{n}": {**(records[f"f{n}"].outcome or {})["operation"], "operationType": "CAPTURE"} for n in range(5)}
    fetched: list[str] = []

    def operation(operation_id: str) -> dict[str, Any] | None:
        fetched.append(operation_id)
        return gateway.get(operation_id)

    def nothing(*_: Any) -> Any:
        raise AssertionError("not asked for")

    judge = Judge(Lookups(operation, nothing, nothing, lambda ids: [records[flow_id] for flow_id in ids]))
    found = []
    for n in range(6):  # six flows ended, none met yet: the newest-ended beyond three are checked at once
        found += judge.ended(f"f{n}", float(n))
        assert len(judge.waiting) + len(judge.pending) <= 3
    assert fetched == ["o3", "o4", "o5"] and len(judge.waiting) == 3
    assert [(f.category, f.flow, f.named) for f in found] == [(FLOW_WITHOUT_MONEY, "f5", "o5")]  # the gateway lacks o5
    assert judge.resolve() == [] and sorted(fetched) == [f"o{n}" for n in range(6)] and not judge.waiting
