"""The console's kinds and bulk pages in a real browser (headless Chromium) against a whole stack:
pause a flow kind by typing a reason and clicking (the banner on every page), resume it; a bulk cancel's
dry run, its confirmation, and its progress bar filling to the end, as the worker acts."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.workflows.engine.states import FlowState
from tests.service.bulk_support import make_flows
from tests.service.console.conftest import OPERATOR_KEY, ConsoleStack, screenshot
from tests.service.console.test_console_browser import navigate_by, sign_in
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
COUNT = 1000


def test_pause_a_kind_and_see_the_banner_then_resume(console_stack: ConsoleStack, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    sign_in(browser, console_stack, OPERATOR_KEY)
    browser.get(f"{console_stack.url}/console/kinds")
    browser.find_element(By.ID, "reason-wallet").send_keys("acquirer maintenance")
    navigate_by(browser, browser.find_element(By.ID, "pause-wallet"))
    banner = browser.find_element(By.ID, "paused-banner").text
    assert "wallet" in banner and "acquirer maintenance" in banner and "by console" in banner
    assert console_stack.engine.pauses.paused()["wallet"].by == "console:Ada"
    browser.get(f"{console_stack.url}/console/flows")
    assert browser.find_elements(By.ID, "paused-banner"), "the banner is on every page while a kind is paused"
    screenshot(browser, "kinds-paused-banner")
    browser.get(f"{console_stack.url}/console/kinds")
    navigate_by(browser, browser.find_element(By.ID, "resume-wallet"))
    assert not browser.find_elements(By.ID, "paused-banner")
    assert "wallet" not in console_stack.engine.pauses.paused()
    assert [entry["action"] for entry in console_stack.engine.pauses.log(2)] == ["resume", "pause"]


@pytest.mark.parametrize(
    ("action", "state", "after", "done"),
    [("cancel", FlowState.WAITING, FlowState.CANCELLED, "cancelled"), ("retry", FlowState.FAILED, FlowState.READY, "retried")],
)
def test_a_bulk_action_dry_run_then_the_action_and_its_progress(
    console_stack: ConsoleStack, browser: Any, action: str, state: FlowState, after: FlowState, done: str
) -> None:
    """1,000 flows. The retried ones meet a pause of ``mit`` on the worker and wait (the simulator knows
    no such contract: the retry itself is what is shown)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    flows = make_flows(console_stack.runtime, COUNT, state)
    if action == "retry":
        console_stack.engine.pauses.pause("mit", "the retried flows wait", by="test")
    sign_in(browser, console_stack, OPERATOR_KEY)
    browser.get(f"{console_stack.url}/console/bulk")
    Select(browser.find_element(By.ID, "action")).select_by_value(action)
    Select(browser.find_element(By.ID, "kind")).select_by_value("mit")
    Select(browser.find_element(By.ID, "state")).select_by_value(state.value)
    navigate_by(browser, browser.find_element(By.ID, "dry-run"))
    assert f"{COUNT} flow(s) match; 0 would be skipped" in browser.find_element(By.ID, "plan-count").text
    money = browser.find_element(By.ID, "plan-money").text
    assert f"the {COUNT} flow(s) it would act on): 7,000.00 EUR" in money, money  # 1,000 flows of 7.00 EUR
    amounts = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#plan td.amount")]
    assert amounts and set(amounts) == {"7.00 EUR"}, "each listed flow's amount"
    assert console_stack.engine.get(flows[0]).state is state, "a dry run changes nothing"
    screenshot(browser, f"bulk-{action}-dry-run")
    navigate_by(browser, browser.find_element(By.ID, "confirm"))
    assert "/console/bulk/" in browser.current_url

    def finished() -> bool:
        browser.refresh()  # the page reloads itself each second while it runs; this does not wait for that
        status = browser.find_element(By.ID, "bulk-status")
        return status.get_attribute("data-status") == "done"

    wait_until(finished, 180, f"the bulk {action} to finish")
    progress = browser.find_element(By.ID, "progress")
    assert (progress.get_attribute("value"), progress.get_attribute("max")) == (str(COUNT), str(COUNT))
    assert f"done: {COUNT} {done}" in browser.find_element(By.ID, "bulk-status").text
    screenshot(browser, f"bulk-{action}-progress")
    assert all(flow.state is after for flow in console_stack.engine.store.many(flows))
    if action == "retry":  # every retried flow's step met the pause on the worker (the broker left empty)
        pauses = console_stack.engine.pauses
        wait_until(lambda: pauses.held_counts(["mit"])["mit"] == COUNT, 180, "every retried flow to be held")


def test_a_read_only_key_sees_no_button_and_cannot_pause_or_act(console_stack: ConsoleStack) -> None:
    from tests.service.console.conftest import READ_KEY
    from tests.service.console.test_console_http import csrf_of, signed_in

    with signed_in(console_stack, READ_KEY) as reader:
        page = reader.get("/console/kinds")
        assert page.status_code == 200 and 'id="pause-moto"' not in page.text
        token = csrf_of(page)
        assert reader.post("/console/kinds/moto/pause", data={"csrf": token, "reason": "x"}).status_code == 403
        plan = reader.get("/console/bulk", params={"action": "cancel", "kind": "moto", "state": "sleeping"})
        assert plan.status_code == 200 and 'id="confirm"' not in plan.text, "a dry run to look at, no action"
        assert reader.post("/console/bulk", data={"csrf": token, "action": "cancel", "kind": "moto"}).status_code == 403
    with signed_in(console_stack, OPERATOR_KEY) as operator:
        assert operator.post("/console/kinds/moto/pause", data={"reason": "x"}).status_code == 403, "no CSRF token"
        token = csrf_of(operator.get("/console/kinds"))
        typo = operator.post("/console/kinds/mtoo/pause", data={"csrf": token, "reason": "x"})
        assert typo.status_code == 404 and "did you mean `moto`" in typo.text
    assert "moto" not in console_stack.engine.pauses.paused()


def test_a_confirmation_sent_twice_is_one_action_and_a_new_dry_run_a_new_one(console_stack: ConsoleStack) -> None:
    """The confirmation's form carries its dry run's plan: sent twice (a double click, a resent form) it
    is one action; the same filter after a new dry run is a new action, on what the filter matches then."""
    import re

    from tests.service.console.test_console_http import csrf_of, signed_in

    query = {"action": "retry", "kind": "mit", "state": "waiting"}  # skipped (not retryable): found again
    with signed_in(console_stack, OPERATOR_KEY) as operator:

        def confirm() -> str:
            page = operator.get("/console/bulk", params=query)
            found = re.search(r'name="plan" value="([0-9a-f]{32})"', page.text)
            assert found, "the confirmation carries its dry run's plan"
            form = {"csrf": csrf_of(page), "plan": found.group(1), **query}
            first = operator.post("/console/bulk", data=form)
            again = operator.post("/console/bulk", data={**form, "csrf": csrf_of(operator.get("/console/bulk"))})
            assert first.status_code == again.status_code == 303, first.text[:300]
            assert first.headers["location"] == again.headers["location"], "one dry run confirmed twice: one action"
            return first.headers["location"]

        make_flows(console_stack.runtime, 1, FlowState.WAITING)
        assert confirm() != confirm(), "a new dry run: a new action"


def test_a_confirmation_for_another_filter_or_action_is_refused(console_stack: ConsoleStack, browser: Any) -> None:
    """The confirmation form carries its dry run's plan and filter: sent with another filter (its hidden
    field changed in the page) or another action, it is refused (409, nothing done; before, another filter
    was a new action on what it matched), and with its own it acts on the flows the dry run listed only."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests.service.console.test_console_http import csrf_of, signed_in

    ids = make_flows(console_stack.runtime, 2, FlowState.WAITING)
    sign_in(browser, console_stack, OPERATOR_KEY)
    browser.get(f"{console_stack.url}/console/bulk")
    Select(browser.find_element(By.ID, "action")).select_by_value("cancel")
    Select(browser.find_element(By.ID, "kind")).select_by_value("mit")
    Select(browser.find_element(By.ID, "state")).select_by_value("waiting")
    navigate_by(browser, browser.find_element(By.ID, "dry-run"))
    assert "2 flow(s) match" in browser.find_element(By.ID, "plan-count").text
    assert "14.00 EUR" in browser.find_element(By.ID, "plan-money").text
    plan = browser.find_element(By.CSS_SELECTOR, "#plan input[name=plan]").get_attribute("value")
    browser.execute_script("document.querySelector('#plan input[name=state]').remove();")  # the filter widened
    navigate_by(browser, browser.find_element(By.ID, "confirm"))
    refusal = browser.find_element(By.CSS_SELECTOR, "p.problem").text
    assert "was made for cancel of kind=mit, state=waiting, not for cancel of kind=mit" in refusal, refusal
    screenshot(browser, "bulk-confirmation-refused")
    bulk = console_stack.runtime.bulk
    assert bulk is not None and bulk.list() == [], "nothing posted"
    with signed_in(console_stack, OPERATOR_KEY) as operator:
        form = {"csrf": csrf_of(operator.get("/console/bulk")), "plan": plan, "kind": "mit", "state": "waiting"}
        other = operator.post("/console/bulk", data={**form, "action": "retry"})
        assert other.status_code == 409 and "not for retry of kind=mit, state=waiting" in other.text
        wider = operator.post("/console/bulk", data={**form, "action": "cancel", "state": ""})
        assert wider.status_code == 409
        [later] = make_flows(console_stack.runtime, 1, FlowState.WAITING)  # after the dry run: not in it
        confirmed = operator.post("/console/bulk", data={**form, "action": "cancel"})
        assert confirmed.status_code == 303, confirmed.text[:300]
    [posted] = bulk.list()
    assert posted["total"] == 2
    wait_until(lambda: bulk.get(posted["id"])["status"] == "done", 60, "the bulk cancel")
    states = [flow.state for flow in console_stack.engine.store.many([*ids, later])]
    assert states == [FlowState.CANCELLED, FlowState.CANCELLED, FlowState.WAITING]
