"""``/schedules`` over real HTTP: create (idempotent), read, list, change, pause, resume, cancel, and
resolve an occurrence whose flow is gone."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.workflows.schedules import Schedules
from tests.service.conftest import API_KEY, Served
from tests.workflows.schedules.harness import stop_on_a_gone_flow

KEY = {"X-Api-Key": API_KEY}


def schedule(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "contractId": "ct-gym-42",
        "amount": 1500,
        "currency": "EUR",
        "description": "Gym, monthly",
        "rule": {"every": "month", "day": 31},
        "timezone": "Europe/Rome",
        "start": "2031-01-31",
    }
    return body | changes


def test_create_read_and_steer_a_schedule(served: Served) -> None:
    created = served.http.post("/schedules", json=schedule(), headers=KEY)
    assert created.status_code == 201, created.text
    schedule_id = created.json()["id"]
    assert created.json()["state"] == "active"
    assert created.json()["nextRunLocal"].startswith("2031-01-31T00:00:00")

    assert served.http.get(f"/schedules/{schedule_id}", headers=KEY).json()["amount"] == 1500
    changed = served.http.patch(f"/schedules/{schedule_id}", json={"amount": 1990}, headers=KEY)
    assert changed.status_code == 200 and changed.json()["amount"] == 1990

    paused = served.http.post(f"/schedules/{schedule_id}/pause", headers=KEY)
    assert paused.json()["state"] == "paused"
    again = served.http.post(f"/schedules/{schedule_id}/pause", headers=KEY)
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    assert served.http.get("/schedules?state=paused", headers=KEY).json()["schedules"][0]["id"] == schedule_id
    assert served.http.post(f"/schedules/{schedule_id}/resume", headers=KEY).json()["state"] == "active"

    cancelled = served.http.post(f"/schedules/{schedule_id}/cancel", json={"reason": "membership ended"}, headers=KEY)
    assert cancelled.json()["state"] == "cancelled"
    assert served.http.delete(f"/schedules/{schedule_id}", headers=KEY).status_code == 409
    events = [entry["event"] for entry in served.http.get(f"/schedules/{schedule_id}/history", headers=KEY).json()["history"]]
    assert events[0] == "created" and len(events) >= 5


def test_delete_cancels(served: Served) -> None:
    schedule_id = served.http.post("/schedules", json=schedule(), headers=KEY).json()["id"]
    deleted = served.http.delete(f"/schedules/{schedule_id}", headers=KEY)
    assert deleted.status_code == 200 and deleted.json()["state"] == "cancelled"
    assert served.http.get(f"/schedules/{schedule_id}", headers=KEY).status_code == 200, "the record is kept"


def test_idempotency_key_and_conflict(served: Served) -> None:
    headers = KEY | {"Idempotency-Key": "gym-42"}
    first = served.http.post("/schedules", json=schedule(), headers=headers).json()["id"]
    assert served.http.post("/schedules", json=schedule(), headers=headers).json()["id"] == first
    assert served.http.post("/schedules", json=schedule(amount=99), headers=headers).status_code == 409


def test_list_pages(served: Served) -> None:
    ids = {served.http.post("/schedules", json=schedule(contractId=f"ct-{n}"), headers=KEY).json()["id"] for n in range(3)}
    page = served.http.get("/schedules?limit=2", headers=KEY).json()
    assert len(page["schedules"]) == 2 and page["next_offset"] == 2
    rest = served.http.get("/schedules?limit=2&offset=2", headers=KEY).json()
    assert {s["id"] for s in page["schedules"] + rest["schedules"]} == ids


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (schedule(end="2030-01-01"), "end"),
        (schedule(amount=0), "amount"),
        (schedule(timezone="Mars/Olympus"), "timezone"),
        ({"amount": 100}, "contractId"),
        (schedule(rule={"every": "fortnight"}), "rule"),
    ],
)
def test_bad_schedules_are_422_naming_the_field(served: Served, body: dict[str, Any], field: str) -> None:
    answer = served.http.post("/schedules", json=body, headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"].startswith(field), answer.json()


def test_unknown_schedule_and_bad_changes(served: Served) -> None:
    assert served.http.get("/schedules/snothere", headers=KEY).status_code == 404
    assert served.http.post("/schedules/snothere/pause", headers=KEY).status_code == 404
    assert served.http.get("/schedules/snothere/history", headers=KEY).status_code == 404
    schedule_id = served.http.post("/schedules", json=schedule(), headers=KEY).json()["id"]
    assert served.http.patch(f"/schedules/{schedule_id}", json={"amount": -5}, headers=KEY).status_code == 422
    assert served.http.get("/schedules?state=sleepy", headers=KEY).status_code == 422


def gone(served: Served) -> tuple[str, str]:
    """A schedule stopped because its first occurrence's flow is gone: (schedule id, occurrence)."""
    schedule_id = served.http.post("/schedules", json=schedule(), headers=KEY).json()["id"]
    return schedule_id, stop_on_a_gone_flow(Schedules(served.engine), schedule_id).occurrence


def test_resolve_an_occurrence_whose_flow_is_gone_then_resume(served: Served) -> None:
    schedule_id, occurrence = gone(served)
    refused = served.http.post(f"/schedules/{schedule_id}/resume", headers=KEY)
    assert refused.status_code == 409, refused.text
    assert occurrence in refused.json()["reason"] and "resolve" in refused.json()["reason"]

    body = {"occurrence": occurrence, "outcome": "charged", "operationId": "op-9"}
    resolved = served.http.post(f"/schedules/{schedule_id}/resolve", json=body, headers=KEY)
    assert resolved.status_code == 200, resolved.text
    view = resolved.json()
    assert view["state"] == "needs_attention" and view["open"] == [] and view["counts"]["charged"] == 1
    assert view["last"]["operationId"] == "op-9" and view["last"]["by"] == "api"
    again = served.http.post(f"/schedules/{schedule_id}/resolve", json=body, headers=KEY)
    assert again.status_code == 409 and f"no open occurrence '{occurrence}'" in again.json()["reason"]
    assert served.http.post(f"/schedules/{schedule_id}/resume", headers=KEY).json()["state"] == "active"
    history = served.http.get(f"/schedules/{schedule_id}/history", headers=KEY).json()["history"]
    assert [event["event"] for event in history][-4:] == ["outcome unknown", "needs attention", "charged", "resumed"]
    after = served.http.post(f"/schedules/{schedule_id}/resolve", json=body, headers=KEY)
    assert after.status_code == 409 and "is active" in after.json()["reason"]


def test_resolve_as_not_charged_closes_the_occurrence(served: Served) -> None:
    schedule_id, occurrence = gone(served)
    answer = served.http.post(
        f"/schedules/{schedule_id}/resolve", json={"occurrence": occurrence, "outcome": "not_charged"}, headers=KEY
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["counts"]["not_charged"] == 1 and answer.json()["counts"]["charged"] == 0
    assert answer.json()["open"] == [] and answer.json()["last"] is None


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"occurrence": "{occurrence}", "outcom": "charged"}, "outcom", "did you mean `outcome`?"),
        ({"occurrence": "{occurrence}", "outcome": "charge"}, "outcome", "did you mean `charged`?"),
        ({"occurrence": "{occurrence}", "outcome": "refunded"}, "outcome", "known values: charged, not_charged"),
        ({"occurrence": "{occurrence}", "outcome": "charged", "operationID": "op-1"}, "operationID", "`operationId`?"),
        ({"occurrence": "{occurrence}", "outcome": "charged", "operationId": "op 1"}, "operationId", "pattern"),
        ({"outcome": "charged"}, "occurrence", "Field required"),
    ],
)
def test_a_bad_resolution_is_422_naming_the_field_and_what_was_meant(
    served: Served, body: dict[str, str], field: str, reason: str
) -> None:
    schedule_id, occurrence = gone(served)
    sent = {name: value.format(occurrence=occurrence) for name, value in body.items()}
    answer = served.http.post(f"/schedules/{schedule_id}/resolve", json=sent, headers=KEY)
    assert answer.status_code == 422, answer.text
    assert (answer.json()["error"], answer.json()["field"]) == ("invalid_input", field)
    assert reason in answer.json()["reason"], answer.json()
    assert served.http.get(f"/schedules/{schedule_id}", headers=KEY).json()["open"], "nothing was closed"


def test_resolve_refuses_what_it_cannot_close(served: Served) -> None:
    body = {"occurrence": "2031-01-30T23:00:00Z", "outcome": "charged"}
    assert served.http.post("/schedules/snothere/resolve", json=body, headers=KEY).status_code == 404
    active = served.http.post("/schedules", json=schedule(contractId="ct-active"), headers=KEY).json()["id"]
    refused = served.http.post(f"/schedules/{active}/resolve", json=body, headers=KEY)
    assert refused.status_code == 409 and "is active" in refused.json()["reason"]
    schedule_id, occurrence = gone(served)
    february = {**body, "occurrence": "2031-02-28T23:00:00Z"}
    unknown = served.http.post(f"/schedules/{schedule_id}/resolve", json=february, headers=KEY)
    assert unknown.status_code == 409 and occurrence in unknown.json()["reason"], "names the occurrence that can be resolved"
    garbled = served.http.post(f"/schedules/{schedule_id}/resolve", json={**body, "occurrence": "last month"}, headers=KEY)
    assert garbled.status_code == 409 and "no open occurrence 'last month'" in garbled.json()["reason"]


def test_a_rule_closer_than_the_contracts_frequency_is_422_naming_the_rule(served: Served) -> None:
    """Issue 23, item 6: monthly on the 31st charges January 31 then February 28, 28 days apart; on a
    contract of contractFrequency 30 the gateway refuses the second, so the schedule is refused, saying why."""
    refused = served.http.post("/schedules", json=schedule(contractFrequency=30), headers=KEY)
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "rule" and "28 days apart (2031-01-31 and 2031-02-28" in refused.text
    taken = served.http.post("/schedules", json=schedule(contractFrequency=28), headers=KEY)
    assert taken.status_code == 201, taken.text
