"""Review 36, invariant 8 in the console: a confirmation page's flow at its version.

Run: ``.venv/bin/python -m pytest -n 0 tests/service/console/test_review36_confirm.py``.
"""

from __future__ import annotations

import random

import pytest

from durapay.workflows.states import FlowState
from tests.service.console.conftest import ConsoleStack
from tests.service.console.test_console_http import OPERATOR_KEY, csrf_of, signed_in
from tests.workflows.integration.test_flows import card, order

pytestmark = pytest.mark.integration

APPROVE = "4349940199004549"


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
    carries nothing of what the page showed (no version), and ``Engine.retry`` of a *failed* flow restarts it
    from its first step on a fresh order id with fresh idempotency keys: a new charge of the customer that
    no confirmation showed (service/console/flow_pages.py ``act``: ``engine.retry(flow_id, by=...)``, no
    ``seen``; the confirm page, templates/confirm.html, keeps no version)."""
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
        answer = operator.post(f"/console/flows/{flow.id}/retry", data={"csrf": csrf_of(page)})
    after = stack.engine.wait(flow.id, 30)
    charges = [op for op in sim.operations() if op["orderId"].startswith(flow.order_id)]
    assert answer.status_code == 409, (
        f"the confirmation of a resume restarted the failed flow ({answer.status_code}): "
        f"{after.state}, generation {after.generation}, {len(charges) - len(charges_before)} new charge(s) {charges}"
    )
