"""The console as a new user meets it on the first day (issue 41), in Chromium against one whole stack for
the module (Valkey, a Celery worker, the dispatcher, the simulator over HTTP, the API with the console):

* the money at stake on every page a flow is listed or acted on, before it has an outcome (finding 4);
* every time written by one rule, a schedule's own time zone named (finding 5);
* the daily reconciliation's next run said, not "turn it on" (finding 9);
* a succeeded payment's refund and capture offered, a failed card flow saying why nothing is, actions
  recorded under the signed-in operator's name, the timeline's diamonds only for a signal or an operator,
  and a reconcile try's row naming the read it made (finding 11).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from celery.contrib.testing.worker import start_worker

from bench._webhook_receiver import WebhookReceiver
from durapay.service.app import create_app
from durapay.service.runtime import build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorServer
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from durapay.workflows.moments import moment_text
from durapay.workflows.reconciliation.daily import next_run
from tests.ids import unique
from tests.service.console.conftest import OPERATOR_KEY, READ_KEY, ConsoleStack, screenshot
from tests.service.console.test_console_browser import navigate_by, needs_attention, sign_in, wait_text
from tests.times import off_rule
from tests.waiting import wait_until
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_flows import DECLINE, card, order, session

pytestmark = pytest.mark.integration

NAME = "Grace Hopper"


@pytest.fixture(scope="module")
def stack(redis_url: str, console_simulator: SimulatorServer) -> Iterator[ConsoleStack]:
    """One stack for the module; the daily reconciliation on (the default), in a zone of its own."""
    prefix = "t" + unique("")[1:11]
    settings = stack_settings(
        prefix,
        console_simulator.base_url,
        api={"key": OPERATOR_KEY, "keys": {READ_KEY: "read"}, "start_wait_seconds": 2.0},
        reconcile={"daily": True, "daily_at": "03:00", "time_zone": "Europe/Rome"},
        webhooks={"allow_private": True},
    )
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(41))
    dispatcher = Dispatcher(runtime.engine, interval=0.05)
    with ExitStack() as opened:
        opened.enter_context(start_worker(runtime.celery, pool="threads", concurrency=2, perform_ping_check=False))
        dispatcher.start()
        opened.callback(dispatcher.stop)
        server = opened.enter_context(ApiServer(create_app(runtime)))
        http = opened.enter_context(httpx.Client(base_url=server.url, timeout=10.0, headers={"X-Api-Key": OPERATOR_KEY}))
        yield ConsoleStack(runtime, console_simulator, server, http)
    console_simulator.admin.clear_faults()
    runtime.close()


def main_text(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.TAG_NAME, "main").text)


def test_the_money_at_stake_shows_before_the_outcome(stack: ConsoleStack, browser: Any) -> None:
    """A needs_attention MOTO of 314.15 EUR and a waiting hosted page of 25.00 EUR read "amount —" on their
    page; the home page's "Needs a person" showed neither amount nor order id."""
    from selenium.webdriver.common.by import By

    stuck = needs_attention_of(stack, 31415)
    waiting = stack.engine.start("hpp", {"order": order(2500), "paymentSession": session(2500)})
    stack.engine.wait(waiting.id, 30, states=frozenset({FlowState.WAITING}))
    sign_in(browser, stack, OPERATOR_KEY, NAME)
    for flow, amount in ((stuck, "314.15 EUR"), (waiting, "25.00 EUR")):
        browser.get(f"{stack.url}/console/flows/{flow.id}")
        wait_text(browser, "flow-amount", amount)
    browser.get(f"{stack.url}/console")
    [line] = browser.find_elements(By.CSS_SELECTOR, f'ul.attention li[data-id="{stuck.id}"]')
    assert "314.15 EUR" in line.text and stuck.order_id in line.text, line.text
    screenshot(browser, "home-needs-a-person-money")
    browser.get(f"{stack.url}/console/flows?state=waiting")
    [row] = browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{waiting.id}"]')
    assert row.find_element(By.CSS_SELECTOR, "td.amount").text == "25.00 EUR"


def needs_attention_of(stack: ConsoleStack, amount: int) -> Any:
    """A MOTO of ``amount`` stopped for a person (its payment call answered 500 every time)."""
    stack.simulator.admin.set_faults(mode="error", status=500, operation="create_moto_order", count=1000)
    try:
        record = stack.engine.start("moto", {"order": order(amount), "card": card()})
        stopped = stack.engine.wait(record.id, 60)
    finally:
        stack.simulator.admin.clear_faults()
    assert stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    return stopped


def test_every_page_writes_times_one_way(stack: ConsoleStack, browser: Any) -> None:
    """Flow, schedule and webhook pages: ISO 8601 with the offset, UTC as Z, a schedule's zone named (the
    console wrote "... UTC", webhook pages ISO Z with milliseconds, a schedule's next run an unnamed offset)."""
    paid = stack.engine.wait(stack.engine.start("moto", {"order": order(), "card": card()}).id, 30)
    schedule = stack.http.post(
        "/schedules",
        json={
            "contractId": "contract-times-1",
            "amount": 990,
            "currency": "EUR",
            "description": "weekly coffee",
            "rule": {"every": "week", "weekday": "monday"},
            "timezone": "America/New_York",
            "start": "2031-01-01T09:30:00",
        },
    ).json()
    with WebhookReceiver() as receiver:
        endpoint = stack.runtime.webhooks.endpoints.add(receiver.url, [])
        receiver.secrets = [endpoint.secret]
        assert stack.runtime.webhooks.test(endpoint.id) is not None
    sign_in(browser, stack, OPERATOR_KEY, NAME)
    pages = {
        f"/console/flows/{paid.id}": moment_text(paid.created),
        f"/console/schedules/{schedule['id']}": "2031-01-06T09:30:00-05:00 (America/New_York)",
        "/console/schedules": "2031-01-06T09:30:00-05:00 (America/New_York)",
        "/console/webhooks": "",
        "/console/flows": moment_text(paid.updated),
    }
    for page, expected in pages.items():
        browser.get(stack.url + page)
        text = main_text(browser)
        assert expected in text, (page, text)
        assert off_rule(text) == [], (page, text)


def test_the_reconciliation_pages_say_when_the_daily_run_comes(stack: ConsoleStack, browser: Any) -> None:
    """Home and Reconciliation said "turn on the daily run (DURAPAY_RECONCILE__DAILY=true)", on by default."""
    expected = moment_text(next_run(stack.runtime.settings.reconcile, stack.engine.clock.now()), "Europe/Rome")
    sign_in(browser, stack, READ_KEY, NAME)
    for page in ("/console", "/console/reconciliation"):
        browser.get(stack.url + page)
        wait_text(browser, "daily-run", f"next at {expected}")
        assert "turn on" not in main_text(browser) and "DAILY=true" not in main_text(browser)


def test_a_succeeded_payment_offers_its_refund_and_an_authorization_its_capture(stack: ConsoleStack, browser: Any) -> None:
    """A succeeded payment's page offered no refund nor capture; the new flow notes who asked."""
    from selenium.webdriver.common.by import By

    paid = stack.engine.wait(stack.engine.start("moto", {"order": order(2500), "card": card()}).id, 30)
    held = stack.engine.start("moto", {"order": order(1200), "card": card(), "captureType": "EXPLICIT"})
    held = stack.engine.wait(held.id, 30)
    assert (paid.state, held.state) == (FlowState.SUCCEEDED, FlowState.SUCCEEDED)
    sign_in(browser, stack, OPERATOR_KEY, NAME)
    browser.get(f"{stack.url}/console/flows/{held.id}")
    assert {e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "a[id^=follow-]")} == {
        "follow-capture",
        "follow-refund",
    }
    browser.get(f"{stack.url}/console/flows/{paid.id}")
    navigate_by(browser, browser.find_element(By.ID, "follow-refund"))
    assert "refund 25.00 EUR of operation" in main_text(browser)
    screenshot(browser, "confirm-follow-refund")
    amount = browser.find_element(By.ID, "amount")
    amount.clear()
    amount.send_keys("1000")
    browser.find_element(By.ID, "reason").send_keys("customer returned one item")
    navigate_by(browser, browser.find_element(By.ID, "confirm"))
    refund_id = wait_until(lambda: _flow_on_page(browser), 15, "the refund flow's page")
    assert refund_id != paid.id
    refund = stack.engine.wait(refund_id, 30)
    assert refund.kind == "refund" and refund.state is FlowState.SUCCEEDED, refund.summary()
    assert refund.input["amount"] == "1000" or refund.input["amount"] == 1000, refund.input
    note = json.loads(refund.fields["note"])
    assert note["by"] == f"console:{NAME}" and note["from"] == paid.id, note
    wait_text(browser, "flow-note", f"console:{NAME}")


def _flow_on_page(browser: Any) -> str | None:
    from selenium.webdriver.common.by import By

    found = browser.find_elements(By.ID, "flow-id")
    return str(found[0].text) if found else None


def test_a_failed_card_flow_says_why_it_offers_no_action(stack: ConsoleStack, browser: Any) -> None:
    declined = stack.engine.wait(stack.engine.start("moto", {"order": order(), "card": card(DECLINE)}).id, 30)
    assert declined.state is FlowState.FAILED, declined.summary()
    sign_in(browser, stack, OPERATOR_KEY, NAME)
    browser.get(f"{stack.url}/console/flows/{declined.id}")
    wait_text(browser, "no-action", "card data was erased when it ended; start a new flow with the card")


def test_actions_are_the_operators_and_only_they_and_signals_get_a_diamond(stack: ConsoleStack, browser: Any) -> None:
    """A console cancel was recorded as by ``console``; a flow no person touched showed the legend's
    "signal or operator" diamonds (for its start and its end)."""
    from selenium.webdriver.common.by import By

    paid = stack.engine.wait(stack.engine.start("moto", {"order": order(), "card": card()}).id, 30)
    sleeping = stack.engine.start("moto", {"order": order(), "card": card()}, run_at=time.time() + 3600)
    sign_in(browser, stack, OPERATOR_KEY, NAME)
    browser.get(f"{stack.url}/console/flows/{paid.id}")
    svg = browser.find_element(By.CSS_SELECTOR, "svg.timeline")
    assert svg.find_elements(By.CSS_SELECTOR, "path.tl-mark") == [], "no signal nor operator: no diamond"
    assert len(svg.find_elements(By.CSS_SELECTOR, "circle.tl-edge")) == 2  # its start and its end
    assert not browser.find_elements(By.ID, "legend-acts")
    browser.get(f"{stack.url}/console/flows/{sleeping.id}")
    navigate_by(browser, browser.find_element(By.ID, "action-cancel"))
    browser.find_element(By.ID, "reason").send_keys("customer asked")
    navigate_by(browser, browser.find_element(By.ID, "confirm"))
    wait_text(browser, "flow-state", "cancelled")
    [cancel] = [entry for entry in stack.engine.history(sleeping.id) if entry.get("to") == "cancelled"]
    assert cancel["by"] == f"console:{NAME}", cancel
    svg = browser.find_element(By.CSS_SELECTOR, "svg.timeline")
    marks = svg.find_elements(By.CSS_SELECTOR, "path.tl-mark")
    assert len(marks) == 1 and browser.find_elements(By.ID, "legend-acts")
    assert NAME in marks[0].get_attribute("textContent")


def test_a_reconcile_try_names_the_read_it_made(stack: ConsoleStack, browser: Any) -> None:
    """A try after an unanswered payment call reads the order back first: its row named the payment call
    (``create_moto_order``), which that try may never have sent."""
    from selenium.webdriver.common.by import By

    stuck = needs_attention(stack)
    reads = [entry["call"] for entry in stack.engine.history(stuck.id) if (entry.get("call") or {}).get("reconcile")]
    assert reads and all(call["op"].startswith("get_order") for call in reads), reads
    sign_in(browser, stack, READ_KEY, NAME)
    browser.get(f"{stack.url}/console/flows/{stuck.id}")
    rows = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#calls tbody tr") if "(reconcile read)" in row.text]
    assert rows and all("get_order" in row for row in rows), rows


def test_each_kind_s_page_gives_an_example_input_that_starts(stack: ConsoleStack, browser: Any) -> None:
    """Issue 41 finding 8: the Kinds page listed steps only; the hpp body had to be found in docs/api.md."""
    from selenium.webdriver.common.by import By

    sign_in(browser, stack, READ_KEY, NAME)
    browser.get(f"{stack.url}/console/kinds")
    navigate_by(browser, browser.find_element(By.LINK_TEXT, "hpp"))
    shown = json.loads(browser.find_element(By.ID, "example-json").text)
    assert "durapay flows kinds hpp --example | durapay start hpp" in browser.find_element(By.ID, "example-cli").text
    screenshot(browser, "kind-example")
    started = stack.http.post("/flows/hpp", json=shown)
    assert started.status_code == 201, started.text
    browser.get(f"{stack.url}/console/kinds/refund")
    assert "replace operationId" in main_text(browser)
