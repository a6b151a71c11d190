"""The console's schedule pages over HTTP: what an operator types in a schedule's forms."""

from __future__ import annotations

import html
from collections.abc import Iterator

import httpx
import pytest

from tests.service.console.conftest import OPERATOR_KEY, ConsoleStack
from tests.service.console.test_console_http import confirmation, signed_in

pytestmark = pytest.mark.integration

BODY = {
    "contractId": "contract-console-amount",
    "amount": 1500,
    "currency": "EUR",
    "description": "monthly box",
    "rule": {"every": "month", "day": 1},
    "timezone": "Europe/Rome",
    "start": "2030-01-01",
}


@pytest.fixture
def operator(console_stack: ConsoleStack) -> Iterator[httpx.Client]:
    with signed_in(console_stack, OPERATOR_KEY) as client:
        yield client


#: Superscript two (what the finding typed), Arabic-Indic and full-width digits: str.isdigit takes them all.
NOT_ASCII = ["\u00b2", "1\u00b2", "\u0661\u0665\u0660\u0660", "\uff11\uff15\uff10\uff10"]


@pytest.mark.parametrize("typed", [*NOT_ASCII, "15.00", "-5", " ", "9" * 5000, "1" + "0" * 20])
def test_an_amount_that_is_not_ascii_digits_is_a_field_error(
    console_stack: ConsoleStack, operator: httpx.Client, typed: str
) -> None:
    """Issue 23, item 10: ``"²"`` passed ``str.isdigit`` and ``int()`` then refused it: a 500. Every amount
    that is not ASCII digits is refused as the amount field's error, and nothing changes."""
    schedule_id = console_stack.http.post("/schedules", json=BODY).json()["id"]
    confirm = operator.get(f"/console/schedules/{schedule_id}/confirm/amount")
    answer = operator.post(f"/console/schedules/{schedule_id}/amount", data={**confirmation(confirm), "amount": typed})
    assert answer.status_code == 422, (answer.status_code, answer.text[:300])
    shown = html.unescape(answer.text)
    assert "amount: must be" in shown
    assert console_stack.http.get(f"/schedules/{schedule_id}").json()["amount"] == 1500
    # The API says the same of the same text: one parser (gateway's parse_minor) for both.
    api = console_stack.http.patch(f"/schedules/{schedule_id}", json={"amount": typed})
    assert (api.status_code, api.json()["field"]) == (422, "amount"), api.text
    if typed != "1" + "0" * 20:  # the API's model bounds any currency, the schedule its own (EUR)
        assert f"amount: {api.json()['reason']}" in shown


def test_an_amount_with_leading_zeros_is_taken_as_the_api_takes_it(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    schedule_id = console_stack.http.post("/schedules", json=BODY).json()["id"]
    confirm = operator.get(f"/console/schedules/{schedule_id}/confirm/amount")
    answer = operator.post(f"/console/schedules/{schedule_id}/amount", data={**confirmation(confirm), "amount": "0001990"})
    assert answer.status_code == 303, (answer.status_code, answer.text[:300])
    assert console_stack.http.get(f"/schedules/{schedule_id}").json()["amount"] == 1990
