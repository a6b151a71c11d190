"""``/bulk`` over HTTP: the dry run's count and refusals (a misspelt kind names the closest, a state or
time that is not one names its field). The action itself, run by a real worker, is in the client's tours
(tests/test_client.py) and the CLI's (tests/service/cli/test_bulk_cmd.py)."""

from __future__ import annotations

import time

import pytest

from tests.service.conftest import API_KEY, Served

HEADERS = {"X-Api-Key": API_KEY}


def test_a_dry_run_counts_and_changes_nothing(served: Served) -> None:
    later = time.time() + 3600
    ids = [served.engine.start("notified", {"orderId": f"ord-bulk-{n}", "token": "t" * 20}, run_at=later).id for n in range(3)]
    body = {"action": "cancel", "kind": "notified", "state": "sleeping"}
    answer = served.http.post("/bulk/dry-run", json=body, headers=HEADERS)
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert (plan["count"], plan["would_skip"]) == (3, 0) and {flow["id"] for flow in plan["sample"]} == set(ids)
    assert all(served.engine.get(flow_id).state.value == "sleeping" for flow_id in ids)
    retry = served.http.post("/bulk/dry-run", json={"action": "retry", "kind": "notified"}, headers=HEADERS).json()
    assert retry["would_skip"] == 3 and retry["skips"], "a sleeping flow is not retried: the engine's reason is given"


def test_refusals_name_the_field(served: Served) -> None:
    typo = served.http.post("/bulk/dry-run", json={"action": "cancel", "kind": "notifed"}, headers=HEADERS)
    assert typo.status_code == 422 and typo.json()["field"] == "kind" and "did you mean `notified`" in typo.json()["reason"]
    state = served.http.post("/bulk/dry-run", json={"action": "cancel", "state": "faild"}, headers=HEADERS)
    assert state.status_code == 422 and state.json()["field"] == "state" and "did you mean `failed`" in state.json()["reason"]
    action = served.http.post("/bulk", json={"action": "delete", "kind": "notified"}, headers=HEADERS)
    assert action.status_code == 422 and action.json()["field"] == "action"
    since = served.http.post("/bulk/dry-run", json={"action": "cancel", "since": "yesterday"}, headers=HEADERS)
    assert since.status_code == 422 and since.json()["field"] == "since"
    assert served.http.get("/bulk/no-such-action", headers=HEADERS).status_code == 404


def test_the_dry_runs_plan_makes_its_confirmation_one_action(served: Served) -> None:
    """The action carries its dry run's ``plan``: the same confirmation sent again is the same action; a
    new dry run is a new one (the same filter asked again later acts on what it matches then); a plan
    confirmed for another action is a 409, a malformed one names its field."""
    later = time.time() + 3600
    served.engine.start("notified", {"orderId": "ord-bulk-plan", "token": "t" * 20}, run_at=later)
    body = {"action": "cancel", "kind": "notified", "state": "sleeping"}
    plan = served.http.post("/bulk/dry-run", json=body, headers=HEADERS).json()["plan"]
    first = served.http.post("/bulk", json={**body, "plan": plan}, headers=HEADERS)
    assert first.status_code == 202, first.text
    again = served.http.post("/bulk", json={**body, "plan": plan}, headers=HEADERS)
    assert again.json()["id"] == first.json()["id"], "the same confirmation: the same action"
    fresh = served.http.post("/bulk/dry-run", json=body, headers=HEADERS).json()["plan"]
    assert fresh != plan
    assert served.http.post("/bulk", json={**body, "plan": fresh}, headers=HEADERS).json()["id"] != first.json()["id"]
    other = served.http.post("/bulk", json={**body, "action": "retry", "plan": plan}, headers=HEADERS)
    assert other.status_code == 409 and "dry run" in other.json()["reason"]
    bad = served.http.post("/bulk", json={**body, "plan": "x"}, headers=HEADERS)
    assert bad.status_code == 422 and bad.json()["field"] == "plan"


def test_a_plan_for_another_filter_or_action_or_no_longer_kept_is_a_409(served: Served) -> None:
    """The plan names its dry run's action and filter (as asked): confirmed for another filter it is refused
    (before, it was taken as a new action on whatever that filter matched), as for another action; a plan
    confirmed under one key and sent under another is no longer kept. Nothing is posted."""
    later = time.time() + 3600
    served.engine.start("notified", {"orderId": "ord-bulk-other", "token": "t" * 20}, run_at=later)
    body = {"action": "cancel", "kind": "notified", "state": "sleeping", "since": "1h"}
    plan = served.http.post("/bulk/dry-run", json=body, headers=HEADERS).json()
    assert plan["asked"] == {"kind": "notified", "state": "sleeping", "since": "1h"}
    assert plan["filter"]["since"] == pytest.approx(plan["created"] - 3600), "relative times fixed at the dry run"
    wider = served.http.post("/bulk", json={"action": "cancel", "kind": "notified", "plan": plan["plan"]}, headers=HEADERS)
    assert wider.status_code == 409, wider.text
    made = "was made for cancel of kind=notified, state=sleeping, since=1h, not for cancel of kind=notified"
    assert made in wider.json()["reason"]
    other = served.http.post("/bulk", json={**body, "action": "retry", "plan": plan["plan"]}, headers=HEADERS)
    assert other.status_code == 409 and "not for retry of" in other.json()["reason"]
    assert served.http.get("/bulk", headers=HEADERS).json()["bulk"] == [], "nothing posted"
    first = served.http.post("/bulk", json={**body, "plan": plan["plan"]}, headers={**HEADERS, "Idempotency-Key": "k-a"})
    assert first.status_code == 202 and first.json()["total"] == 1
    gone = served.http.post("/bulk", json={**body, "plan": plan["plan"]}, headers={**HEADERS, "Idempotency-Key": "k-b"})
    assert gone.status_code == 409 and "is not kept" in gone.json()["reason"]


def test_a_dry_run_shows_each_flows_money_and_the_total_per_currency(served: Served) -> None:
    later = time.time() + 3600
    for number, (amount, currency) in enumerate([("700", "EUR"), ("1250", "EUR"), ("5000", "JPY")]):
        order = {"orderId": f"ord-bulk-money-{number}", "amount": amount, "currency": currency}
        served.engine.start("mit", {"order": order, "contractId": "ct-bulk"}, run_at=later)
    plan = served.http.post("/bulk/dry-run", json={"action": "cancel", "kind": "mit", "state": "sleeping"}, headers=HEADERS)
    assert plan.status_code == 200, plan.text
    view = plan.json()
    assert view["totals"] == {"EUR": 1950, "JPY": 5000}
    assert sorted((flow["amount"], flow["currency"]) for flow in view["sample"]) == [(700, "EUR"), (1250, "EUR"), (5000, "JPY")]
