"""The console's confirmation pages (``service/console/flow_pages.py``, ``schedule_pages.py``): a person's
confirmation acts only on the flow, or schedule, as the page showed it (money invariant 8: its state and
version, posted back with the form), and is refused "changed since you looked" otherwise (review of
issue 36, finding 3).
"""

from __future__ import annotations

import html
import random

import pytest

from durapay.workflows.engine.states import FlowState
from tests.service.console.conftest import READ_KEY, ConsoleStack
from tests.service.console.test_console_http import OPERATOR_KEY, confirmation, csrf_of, signed_in
from tests.workflows.integration.test_flows import card, order

pytestmark = pytest.mark.integration

APPROVE = "4349940199004549"
SCHEDULE = {
    "contractId": "contract-confirm-1",
    "description": "weekly coffee",
    "amount": 990,
    "currency": "EUR",
    "rule": {"every": "week", "weekday": "monday"},
    "timezone": "Europe/Rome",
    "start": "2031-01-01",
}


def contract_of(stack: ConsoleStack) -> str:
    contract_id = f"ct{random.Random().getrandbits(40)}"
    recurrence = {"action": "CONTRACT_CREATION", "contractId": contract_id, "contractType": "MIT_UNSCHEDULED"}
    first = stack.engine.start("three_steps", {"order": order(), "card": card(APPROVE), "recurrence": recurrence})
    assert stack.engine.wait(first.id, 30).state is FlowState.SUCCEEDED
    return contract_id


def test_a_retry_confirmed_on_a_page_that_showed_a_resume_never_restarts_the_flow(console_stack: ConsoleStack) -> None:
    """Invariant 8. A merchant-initiated charge stops for a person (the gateway refused the API key). An
    operator opens its confirmation page: "goes back to step 'pay' ... No payment is made twice: the call
    keeps its idempotency key". Before they click, another retry (a colleague, the API) runs it: the customer
    is declined and the flow fails. The operator's click then posts ``/console/flows/<id>/retry``, which
    carried nothing of what the page showed, and ``Engine.retry`` of a *failed* flow restarted it from its
    first step on a fresh order id with fresh idempotency keys: a new charge of the customer that no
    confirmation showed. The page now posts the flow's state and version: refused, nothing sent."""
    stack = console_stack
    sim = stack.simulator.admin
    contract = contract_of(stack)
    sim.set_faults(mode="error", status=401, operation="create_mit_order", count=1)
    flow = stack.engine.start("mit", {"order": order(700), "contractId": contract})
    stopped = stack.engine.wait(flow.id, 30)
    assert stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    sim.clear_faults()
    with signed_in(stack, OPERATOR_KEY) as operator:
        page = operator.get(f"/console/flows/{flow.id}/confirm/retry")
        assert page.status_code == 200 and "keeps its idempotency key" in page.text, page.text[:2000]
        # Meanwhile another retry runs the flow: the customer's bank declines it.
        sim.script_outcomes(["116"], contract_id=contract)
        stack.engine.retry(flow.id, by="colleague")
        failed = stack.engine.wait(flow.id, 30)
        assert failed.state is FlowState.FAILED, failed.summary()
        charges_before = [op for op in sim.operations() if op["orderId"].startswith(flow.order_id)]
        answer = operator.post(f"/console/flows/{flow.id}/retry", data=confirmation(page))
        unbound = operator.post(f"/console/flows/{flow.id}/retry", data={"csrf": csrf_of(page)})
    after = stack.engine.wait(flow.id, 30)
    charges = [op for op in sim.operations() if op["orderId"].startswith(flow.order_id)]
    assert answer.status_code == 409, (
        f"the confirmation of a resume restarted the failed flow ({answer.status_code}): "
        f"{after.state}, generation {after.generation}, {len(charges) - len(charges_before)} new charge(s) {charges}"
    )
    assert "changed since you looked (it was needs_attention, it is failed now)" in html.unescape(answer.text)
    assert unbound.status_code == 409 and "open its page and confirm again" in html.unescape(unbound.text)
    assert after.state is FlowState.FAILED and after.generation == failed.generation and charges == charges_before


def test_a_schedule_paused_meanwhile_is_not_cancelled_by_a_confirmation_of_the_active_one(
    console_stack: ConsoleStack,
) -> None:
    """The schedule's confirmation page is bound the same way: shown active, changed (paused by another
    person) before the click: the confirmed change is refused, the schedule stays as the other person left it."""
    stack = console_stack
    created = stack.http.post("/schedules", json=SCHEDULE)
    assert created.status_code == 201, created.text
    schedule_id = created.json()["id"]
    with signed_in(stack, OPERATOR_KEY) as operator:
        page = operator.get(f"/console/schedules/{schedule_id}/confirm/cancel")
        assert page.status_code == 200, page.text[:500]
        assert stack.http.post(f"/schedules/{schedule_id}/pause").status_code == 200
        answer = operator.post(f"/console/schedules/{schedule_id}/cancel", data={**confirmation(page), "reason": "stop"})
    assert answer.status_code == 409 and "changed since you looked" in html.unescape(answer.text), answer.text[:500]
    assert stack.http.get(f"/schedules/{schedule_id}").json()["state"] == "paused"


def test_the_flow_list_filters_by_terminal_and_names_each_flow_s(console_stack: ConsoleStack) -> None:
    """With more than one terminal declared, the list offers a terminal filter and a terminal column; an
    undeclared terminal is refused naming the known ones (as the API's and the CLI's filters do)."""
    engine = console_stack.engine
    refund = {"amount": 100, "currency": "EUR"}
    on_it = engine.start("refund", {"operationId": "800000000000000011", **refund}, terminal="it")
    on_default = engine.start("refund", {"operationId": "800000000000000012", **refund})
    with signed_in(console_stack, READ_KEY) as client:
        everything = client.get("/console/flows").text
        assert '<select id="terminal" name="terminal">' in everything and '<td class="terminal">it</td>' in everything
        only_it = client.get("/console/flows", params={"terminal": "it"})
        assert only_it.status_code == 200
        assert f'data-id="{on_it.id}"' in only_it.text and f'data-id="{on_default.id}"' not in only_it.text
        assert '<option value="it" selected>' in only_it.text
        only_default = client.get("/console/flows", params={"terminal": "default"}).text
        assert f'data-id="{on_default.id}"' in only_default and f'data-id="{on_it.id}"' not in only_default
        unknown = client.get("/console/flows", params={"terminal": "fr"})
        assert unknown.status_code == 422
        assert "terminal: unknown terminal &#39;fr&#39;; known terminals: default, it" in unknown.text
