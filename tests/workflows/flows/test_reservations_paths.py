"""The reservation flows call the right operation in each path form, with keys where the gateway takes them.

The engine runs the real flow definitions step by step on a real Valkey; a recording stand-in client
answers (the same flows run against the simulator over HTTP in ``test_reservations``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from durapay.config import load_settings
from durapay.gateway import GatewayOperation, GatewayUnreachable, NotFound
from durapay.workflows.engine import Engine, InputError
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows import REGISTRY

T0 = datetime(2026, 7, 1, tzinfo=UTC).timestamp()
OPERATION = {"operationId": "op-9", "orderId": "res-1", "operationResult": "EXECUTED", "operationAmount": "900"}


class RecordingClient:
    """Answers every call from ``answers`` (by operation name) and records (operation, path, key)."""

    def __init__(self, answers: dict[str, Callable[[tuple[str, ...]], Any]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, tuple[str, ...], str | None]] = []

    def call(self, op: GatewayOperation[Any], *path: str, request: Any = None, idempotency_key: str | None = None) -> Any:
        self.calls.append((op.name, path, idempotency_key))
        answer = self.answers.get(op.name, lambda _: {})(path)
        return op.response.model_validate(answer)


def not_found(path: tuple[str, ...]) -> Any:
    raise NotFound("404: no such structure", status_code=404)


ANSWERS: dict[str, Callable[[tuple[str, ...]], Any]] = {
    "get_reservation": lambda path: {
        "reservationStatus": {"reservation": {"reservationId": path[0], "amount": "20000", "currency": "EUR"}},
        "operations": [{**OPERATION, "operationId": "op-1", "operationType": "CAPTURE"}],
    },
    "create_no_show": lambda path: {"operation": {**OPERATION, "operationResult": "PENDING"}},
    "create_incremental": lambda path: {"operation": OPERATION},
    "create_delay_charge": lambda path: {"operation": OPERATION},
    "get_operation": lambda path: {**OPERATION, "operationId": path[0]},
    "list_terms_and_conditions": lambda path: {"termsAndConditions": [{"termsAndConditionsId": "T-old", "name": "stay"}]},
    "create_terms_and_conditions": lambda path: {"termsAndConditionsId": "T-new"},
    "get_structure": not_found,
    "list_structure_conditions": lambda path: [],
    "create_structure_condition": lambda path: {"structureConditionId": "C-1"},
    "create_structure_custom_field": lambda path: {"customFieldId": "F-1"},
    "create_custom_field_earlier": lambda path: {"customFieldId": "F-2"},
}


@pytest.fixture
def run(redis_client: redis.Redis, key_prefix: str) -> Iterator[Callable[..., tuple[Any, RecordingClient]]]:
    clock = ManualClock(T0)
    client = RecordingClient(ANSWERS)
    settings = load_settings({"engine": {"key_prefix": key_prefix, "partitions": 2}})
    engine = Engine(settings, redis_client, REGISTRY, clock=clock, client_factory=lambda: client)  # type: ignore[arg-type,return-value]

    def run_flow(kind: str, data: dict[str, Any], *, advance: float = 0.0) -> tuple[Any, RecordingClient]:
        record = engine.start(kind, data)
        for _ in range(20):
            record = engine.get(record.id)
            if record.state in (FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION):
                break
            if record.state is FlowState.SLEEPING:
                clock.advance(advance)
            if record.state is FlowState.RETRYING:
                clock.advance(5)
            engine.run_step(record.id, record.step)
        return record, client

    yield run_flow


@pytest.mark.parametrize(
    ("kind", "form", "validation"),
    [
        ("no_show", "current", "validate_no_show"),
        ("no_show", "earlier", "validate_no_show_earlier"),
        ("incremental", "current", "validate_incremental"),
        ("incremental", "earlier", "validate_incremental_earlier"),
        ("delay_charge", "current", "validate_delay_charge"),
        ("delay_charge", "earlier", "validate_delay_charge_earlier"),
    ],
)
def test_charges_validate_on_the_chosen_form_charge_with_a_key_and_read_back(
    run: Callable[..., tuple[Any, RecordingClient]], kind: str, form: str, validation: str
) -> None:
    data = {"reservationId": "res-1", "amount": 900, "currency": "EUR", "form": form, "description": "minibar"}
    record, client = run(kind, data)
    charge = {"no_show": "create_no_show", "incremental": "create_incremental", "delay_charge": "create_delay_charge"}[kind]
    names = [name for name, _, _ in client.calls]
    # The reservation is read at the start and again by the charge step, right before its call, with the
    # reservation held (workflows.engine.targets: the check that binds, and the snapshot of a read-back).
    assert names[:4] == ["get_reservation", validation, "get_reservation", charge] and set(names[4:]) == {"get_operation"}
    keys = [key for name, _, key in client.calls if name == charge]
    assert len(set(keys)) == 1 and keys[0] and keys[0].startswith(record.id)
    assert record.state is FlowState.SUCCEEDED and record.outcome["operation"]["operationId"] == "op-9"


def test_a_given_original_operation_is_checked_against_the_reservation(
    run: Callable[..., tuple[Any, RecordingClient]],
) -> None:
    """Issue 23, item 12: a given id was charged without a look at the reservation (another guest's card)."""
    record, client = run("incremental", {"reservationId": "res-1", "originalOperationId": "op-1", "amount": 5, "currency": "EUR"})
    assert record.state is FlowState.SUCCEEDED
    names = [name for name, _, _ in client.calls]
    assert names == ["get_reservation", "validate_incremental", "get_reservation", "create_incremental", "get_operation"]
    client.calls.clear()
    refused, client = run(
        "incremental", {"reservationId": "res-1", "originalOperationId": "op-other", "amount": 5, "currency": "EUR"}
    )
    assert refused.state is FlowState.FAILED and refused.error["field"] == "originalOperationId"
    assert [name for name, _, _ in client.calls] == ["get_reservation"], "nothing sent"


def test_a_delayed_charge_sleeps_until_run_at(run: Callable[..., tuple[Any, RecordingClient]]) -> None:
    run_at = datetime.fromtimestamp(T0 + 2 * 86400, UTC).isoformat()
    record, _client = run(
        "delay_charge", {"reservationId": "r", "amount": 5, "currency": "EUR", "runAt": run_at}, advance=2 * 86400
    )
    assert record.state is FlowState.SUCCEEDED and record.outputs["timer"]["wokeAt"] == T0 + 2 * 86400


def test_setup_reuses_what_exists_and_takes_each_form_s_paths(run: Callable[..., tuple[Any, RecordingClient]]) -> None:
    data: dict[str, Any] = {
        "termsAndConditions": [{"name": "stay"}, {"name": "spa"}],
        "structures": [{"structureId": "hotel-1", "structureName": "Hotel"}],
        "structureConditions": [{"structureId": "hotel-1", "name": "rules"}],
        "customFields": [{"structureId": "hotel-1", "customFieldTitle": "Room"}],
    }
    current, client = run("reservation_setup", data)
    assert current.outcome["termsAndConditionsIds"] == ["T-old", "T-new"]
    assert current.outcome["customFieldIds"] == ["F-1"] and current.outcome["structureIds"] == ["hotel-1"]
    assert ("create_structure", (), None) in client.calls
    earlier, client = run("reservation_setup", {**data, "form": "earlier"})
    assert earlier.outcome["customFieldIds"] == ["F-2"] and earlier.outcome["termsAndConditionsIds"] == ["T-new", "T-new"]


def test_the_earlier_form_refuses_agency_sections(run: Callable[..., tuple[Any, RecordingClient]]) -> None:
    with pytest.raises(InputError) as raised:
        run("reservation_setup", {"form": "earlier", "agencies": [{"agencyId": "a-1"}]})
    assert raised.value.field == "agencies" and "no agency endpoints" in raised.value.reason


def test_a_charge_executed_then_an_outage_past_the_bound_stops_for_a_person_not_failed(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """The real ``incremental`` flow with the engine's real gate: the charge is answered EXECUTED (the money
    in flight settled by that final answer), then its read-back meets a gateway that cannot be reached,
    the breaker opens and the flow waits past the outage bound. It was ended ``failed`` although the
    guest was charged (issue 28 review); the record's ``money_moved`` keeps it for a person instead."""

    def unreachable(path: tuple[str, ...]) -> Any:
        raise GatewayUnreachable("get_operation: connection refused")

    clock = ManualClock(T0)
    client = RecordingClient({**ANSWERS, "get_operation": unreachable})
    health = {"failures": 1, "open_seconds": 30, "outage_seconds": 600}
    settings = load_settings({"engine": {"key_prefix": key_prefix, "partitions": 2}, "gateway_health": health})
    engine = Engine(settings, redis_client, REGISTRY, clock=clock, client_factory=lambda: client)  # type: ignore[arg-type,return-value]
    data = {"reservationId": "res-1", "amount": 900, "currency": "EUR", "form": "current", "description": "minibar"}
    record = engine.start("incremental", data)
    deferred = 0
    for _ in range(40):
        record = engine.get(record.id)
        if record.state in (FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION):
            break
        if record.state is FlowState.RETRYING:
            deferred += 1
            clock.advance(60)  # each time past the breaker's end: one unbroken outage
        engine.run_step(record.id, record.step)
    assert [name for name, _, _ in client.calls].count("create_incremental") == 1
    assert deferred >= 600 // 60, "the flow waited out the whole bound"
    assert record.state is FlowState.NEEDS_ATTENTION, record.summary()
    assert record.error is not None and record.error["type"] == "MoneyMoved"
    assert record.error["operation"]["operationId"] == "op-9"
    assert "gateway unavailable for more than 600s" in record.error["reason"]
    assert "money moved" in str(engine.history(record.id)[-1]["what"])
