"""The schedule record, pure: ``copy()`` is independent of its original, ``fields()`` round-trips through
``parse``, and a spec read back from Redis is not re-checked against its creation window.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from durapay.config.settings import SchedulesSettings
from durapay.workflows.engine import OperatorError
from durapay.workflows.schedules import policy
from durapay.workflows.schedules.model import (
    RECORD_FIELDS,
    Attempt,
    Resolution,
    ScheduleInput,
    ScheduleRecord,
    ScheduleState,
    compact,
    compact_sorted,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
CAPS = SchedulesSettings()
SPEC = {
    "contractId": "c-1",
    "amount": 1500,
    "currency": "EUR",
    "description": "plan",
    "rule": {"every": "month", "day": 31},
    "timezone": "Europe/Rome",
    "start": "2026-01-31T09:00:00",
}


def record(**changes: Any) -> ScheduleRecord:
    spec = ScheduleInput.model_validate(SPEC)
    attempt = Attempt(
        occurrence="2026-01-31T08:00:00Z",
        index=0,
        attempt=1,
        key="s1@2026-01-31T08:00:00Z#1",
        flow_id="f-1",
        data={"order": {"orderId": "s1-0-r1", "amount": "1500"}, "contractId": "c-1"},
        due=T0 + 100,
        started=True,
        first_decline=T0,
        checks=2,
    )
    base = ScheduleRecord(
        id="s1",
        state=ScheduleState.DUNNING,
        version=7,
        created=T0,
        updated=T0,
        spec=spec,
        next_at=T0 + 3600,
        seq=1,
        open=[attempt],
        counts={"fired": 1, "declined": 1},
        last={"result": "declined", "responseCode": "116", "at": T0},
        reason="",
        start_key="gym-42",
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def stored(rec: ScheduleRecord) -> dict[bytes, bytes]:
    """The hash as ``ScheduleStore`` writes it (create's fixed fields plus ``fields()``)."""
    fields = {"id": rec.id, "state": rec.state.value, "version": str(rec.version), "created": repr(rec.created)}
    fields |= {"updated": repr(rec.updated), "start_key": rec.start_key, **rec.fields()}
    return {name.encode(): value.encode() for name, value in fields.items()}


def test_copy_changes_nothing_in_the_original() -> None:
    original = record()
    before = (original.state, original.version, original.next_at, original.seq, original.fields())
    clone = original.copy()
    clone.state = ScheduleState.NEEDS_ATTENTION
    clone.next_at = None
    clone.seq = 9
    clone.open[0].due = 0.0
    clone.open[0].checks = 99
    clone.open[0].data["order"]["orderId"] = "changed"
    clone.open[0].data["extra"] = True
    clone.open.append(clone.open[0])
    clone.counts["fired"] = 50
    assert clone.last is not None
    clone.last["result"] = "charged"
    assert (original.state, original.version, original.next_at, original.seq, original.fields()) == before
    assert clone.spec is original.spec  # frozen, holds only immutable values: shared on purpose


def test_copy_of_a_record_without_last_or_attempts() -> None:
    original = record(open=[], last=None, counts={})
    clone = original.copy()
    assert clone == original
    assert clone.last is None and clone.open == [] and clone.counts is not original.counts


def test_the_policy_leaves_the_record_it_was_given_unchanged() -> None:
    """The store compares against the original (version, old state index): the policy works on a copy."""
    due = record(state=ScheduleState.ACTIVE, open=[], next_at=T0, last=None)
    before = due.fields() | {"state": due.state.value}
    plan = policy.advance(due, T0 + 1, {}, "mit", CAPS)
    assert len(plan.starts) == 1 and plan.record.open and plan.record.seq == due.seq + 1
    plans = [
        policy.pause(due, T0, "test"),
        policy.cancel(due, T0, "test", "no"),
        policy.change_amount(due, T0, 999, "test"),
    ]
    assert [p.record.state for p in plans[:2]] == [ScheduleState.PAUSED, ScheduleState.CANCELLED]
    assert plans[2].record.spec.amount == 999
    assert due.fields() | {"state": due.state.value} == before
    dunning = record()
    before = dunning.fields()
    policy.resume(record(state=ScheduleState.PAUSED), T0 + 10**6, "test")
    policy.advance(dunning, T0 + 10**6, {}, "mit", CAPS)  # the open attempt's flow is missing: looked at, restarted
    assert dunning.fields() == before


def test_resolve_and_resume_decide_from_the_flows_they_are_given() -> None:
    """Pure: with no flow found for an attempt seen to exist, ``resume`` of a needs_attention schedule is
    refused (its next look would stop it again) and ``resolve`` closes the attempt, after which it
    resumes; an attempt never seen to exist is gone only a week (``LOST_START``) after its start. The
    record given is left unchanged."""
    stopped = record(state=ScheduleState.NEEDS_ATTENTION, reason="the flow f-1 of 2026-01-31T08:00:00Z is gone")
    stopped.open[0].started_at = T0
    occurrence = Resolution(occurrence="2026-01-31T08:00:00Z", outcome="not_charged")
    with pytest.raises(OperatorError, match="never seen to start"):
        policy.resolve(stopped, T0 + 60, occurrence, "test")
    assert policy.resume(stopped, T0 + 60, "test").record.state is ScheduleState.DUNNING, "a lost start: started again"
    later = T0 + policy.LOST_START + 1
    with pytest.raises(OperatorError, match=r"2026-01-31T08:00:00Z .*resolve"):
        policy.resume(stopped, later, "test")
    stopped.open[0].created = True
    before = stopped.fields() | {"state": stopped.state.value}
    with pytest.raises(OperatorError, match=r"2026-01-31T08:00:00Z .*resolve"):
        policy.resume(stopped, T0 + 60, "test")
    plan = policy.resolve(stopped, T0 + 60, occurrence, "test")
    assert plan.record.open == [] and plan.record.counts["not_charged"] == 1 and plan.record.last == stopped.last
    assert plan.record.reason == "2026-01-31T08:00:00Z resolved as not_charged by test; resume to go on"
    assert [event["event"] for event in plan.events] == ["not charged"]
    assert policy.resume(plan.record, T0 + 60, "test").record.state is ScheduleState.ACTIVE
    assert stopped.fields() | {"state": stopped.state.value} == before


def test_fields_round_trip_through_parse() -> None:
    original = record()
    back = ScheduleRecord.parse(stored(original))
    assert back == original
    assert json.loads(original.fields()["open"])[0] == {
        "occurrence": "2026-01-31T08:00:00Z",
        "index": 0,
        "attempt": 1,
        "key": "s1@2026-01-31T08:00:00Z#1",
        "flow_id": "f-1",
        "data": {"order": {"orderId": "s1-0-r1", "amount": "1500"}, "contractId": "c-1"},
        "due": T0 + 100,
        "started": True,
        "first_decline": T0,
        "checks": 2,
        "created": False,
        "started_at": None,
        "declined": None,
    }


def test_a_stored_spec_is_not_checked_against_its_window_again() -> None:
    """The window (end not before start, at least one occurrence) was checked at create; reading back skips
    it (it is a pure function of the spec, and a cron that never fires costs a long search), while field
    checks still run."""
    never = {**SPEC, "rule": {"cron": "0 0 30 2 *"}}  # 30 February: never fires
    with pytest.raises(ValidationError, match="never fires"):
        ScheduleInput.model_validate(never)
    raw = stored(record())
    raw[b"spec"] = json.dumps(never).encode()
    assert ScheduleRecord.parse(raw).spec.rule.model_dump() == {"cron": "0 0 30 2 *"}
    raw[b"spec"] = json.dumps({**SPEC, "timezone": "Mars/Olympus"}).encode()
    with pytest.raises(ValidationError, match="IANA"):
        ScheduleRecord.parse(raw)


def test_a_record_is_read_from_the_fields_hmget_returns() -> None:
    """``ScheduleStore`` reads ``HMGET <record> *RECORD_FIELDS`` (a list: cheaper than ``HGETALL``'s map);
    a schedule that does not exist reads as None, a field never written as its default."""
    original = record()
    raw = stored(original)
    assert ScheduleRecord.read([raw.get(name.encode()) for name in RECORD_FIELDS]) == original
    assert ScheduleRecord.read([None] * len(RECORD_FIELDS)) is None
    sparse = {name: value for name, value in raw.items() if name not in {b"updated", b"last", b"reason", b"start_key"}}
    back = ScheduleRecord.read([sparse.get(name.encode()) for name in RECORD_FIELDS])
    assert back is not None
    assert (back.updated, back.last, back.reason, back.start_key) == (original.created, None, "", "")


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.5, None, True, 'é\n"q"'], "c": {"z": 1e100, "y": -0.1}},
        [],
        {},
        "text",
        [{"t": 1893456000.0, "event": "fired", "amount": 1990}],
    ],
)
def test_the_prebuilt_encoders_write_what_json_dumps_writes(value: Any) -> None:
    assert compact(value) == json.dumps(value, separators=(",", ":"))
    assert compact_sorted(value) == json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def test_the_encoders_refuse_or_stringify_what_json_cannot_write() -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    assert compact_sorted({"at": moment}) == json.dumps({"at": moment}, separators=(",", ":"), default=str)
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact({"at": moment})


# -- a contract's frequency (issue 23, item 6) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "frequency", "said"),
    [
        ({"every": "month", "day": 31}, 30, "28 days apart (2026-01-31 and 2026-02-28"),
        ({"every": "month", "day": 1}, 30, "28 days apart (2026-02-01 and 2026-03-01"),
        ({"every": "week", "weekday": "monday"}, 8, "7 days apart"),
        ({"cron": "0 9 * * *"}, 2, "1 days apart"),
        ({"every": "days", "interval": 29}, 30, "29 days apart"),
    ],
)
def test_a_rule_closer_than_the_contracts_frequency_is_refused_at_creation(
    rule: dict[str, Any], frequency: int, said: str
) -> None:
    """The gateway refuses a charge on an MIT_SCHEDULED contract fewer than contractFrequency days after
    its last payment: a monthly rule on the 31st with 30 days (January 31 -> February 28) would pass here
    and be refused live, so it is refused at creation, saying why and what would do."""
    from durapay.workflows.engine import InputError
    from durapay.workflows.schedules import Schedules

    with pytest.raises(InputError) as refused:
        Schedules.validate({**SPEC, "rule": rule, "contractFrequency": frequency})
    assert refused.value.field == "rule", refused.value
    assert said in refused.value.reason and f"contractFrequency of {frequency}" in refused.value.reason


@pytest.mark.parametrize(
    ("rule", "frequency", "extra"),
    [
        ({"every": "month", "day": 31}, 28, {}),
        ({"every": "days", "interval": 30}, 30, {}),
        ({"every": "week", "weekday": "monday"}, 7, {}),
        ({"every": "month", "day": 31}, 30, {"count": 1}),
    ],
)
def test_a_rule_that_keeps_the_frequency_is_taken(rule: dict[str, Any], frequency: int, extra: dict[str, Any]) -> None:
    spec = ScheduleInput.model_validate({**SPEC, "rule": rule, "contractFrequency": frequency, **extra})
    assert spec.contractFrequency == frequency


def test_missed_each_is_refused_on_a_contract_with_a_frequency() -> None:
    from durapay.workflows.engine import InputError
    from durapay.workflows.schedules import Schedules

    with pytest.raises(InputError) as refused:
        Schedules.validate({**SPEC, "rule": {"every": "days", "interval": 30}, "contractFrequency": 30, "missed": "each"})
    assert refused.value.field == "missed" and "once" in refused.value.reason
