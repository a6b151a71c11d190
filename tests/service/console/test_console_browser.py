"""The console in a real browser (headless Chromium from the system's packages, driven by Selenium),
against a whole stack: Valkey, a Celery worker, the dispatcher, the simulator over HTTP, the API.

They sign in, find a flow by its gateway order id, read its timeline, retry a ``needs_attention`` flow
by clicking and watch it succeed, check that a read-only key cannot cancel, check that no page loads
anything from another origin, and that every page has a title, labelled controls and fits 1280 and
390 pixel wide windows. Screenshots land in ``artifacts/console/``.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from durapay.workflows.engine.states import FlowState
from durapay.workflows.schedules import Schedules
from tests.service.console.conftest import OPERATOR_KEY, READ_KEY, ConsoleStack, screenshot
from tests.times import RULE
from tests.waiting import wait_until
from tests.workflows.integration.test_flows import DECLINE, card, order, session
from tests.workflows.schedules.harness import stop_on_a_gone_flow

pytestmark = pytest.mark.integration


def navigate_by(driver: Any, element: Any) -> None:
    """Click ``element`` and wait until the browser shows the next document, fully loaded.

    Without the wait, a lookup right after the click can find an element of the page being left (the
    flow list shows the flow before the search narrows it too), which is stale a moment later. The
    page being left is marked by a property on its window; a new document does not have it. While the
    browser is between documents, a script may fail: that is "not yet".
    """
    from selenium.common.exceptions import WebDriverException

    driver.execute_script("window.__durapayLeaving = true;")
    element.click()

    def arrived() -> bool:
        try:
            return bool(
                driver.execute_script("return window.__durapayLeaving === undefined && document.readyState === 'complete';")
            )
        except WebDriverException:
            return False

    wait_until(arrived, 15, "the next page")


def sign_in(driver: Any, stack: ConsoleStack, key: str, name: str = "Ada") -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{stack.url}/console/login")
    driver.find_element(By.NAME, "name").send_keys(name)
    field = driver.find_element(By.NAME, "key")
    field.send_keys(key)
    navigate_by(driver, driver.find_element(By.ID, "sign-in"))
    wait_until(lambda: driver.find_elements(By.ID, "sign-out"), 15, "the signed-in page")


def wait_text(driver: Any, element_id: str, text: str, timeout: float = 30.0) -> None:
    """Wait until the element shows ``text`` (the page reloads itself when the flow moves)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def shown() -> bool:
        try:
            return any(text in element.text for element in driver.find_elements(By.ID, element_id))
        except StaleElementReferenceException:
            return False

    wait_until(shown, timeout, f"#{element_id} to show {text!r}")


def moto(stack: ConsoleStack) -> Any:
    data = {"order": order(), "card": card()}
    record = stack.engine.start("moto", data)
    return stack.engine.wait(record.id, 30)


def needs_attention(stack: ConsoleStack) -> Any:
    """A MOTO flow stopped for a person: the payment call failed ambiguously (500) every time."""
    stack.simulator.admin.set_faults(mode="error", status=500, operation="create_moto_order", count=1000)
    try:
        record = stack.engine.start("moto", {"order": order(), "card": card()})
        stopped = stack.engine.wait(record.id, 60)
    finally:
        stack.simulator.admin.clear_faults()
    assert stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    return stopped


def test_sign_in_find_by_order_id_and_read_the_timeline(console_stack: ConsoleStack, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    done = moto(console_stack)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    sign_in(browser, console_stack, OPERATOR_KEY)
    assert browser.title.endswith("durapay console")
    browser.get(f"{console_stack.url}/console/flows")
    search = browser.find_element(By.ID, "q")
    search.send_keys(done.order_id)
    navigate_by(browser, browser.find_element(By.ID, "apply"))
    assert parse_qs(urlsplit(browser.current_url).query).get("q") == [done.order_id], browser.current_url
    link = wait_until(lambda: browser.find_elements(By.LINK_TEXT, done.id), 15, "the flow in the search results")
    screenshot(browser, "flows-search")
    navigate_by(browser, link[0])
    wait_text(browser, "flow-id", done.id)
    svg = browser.find_element(By.CSS_SELECTOR, "svg.timeline")
    steps = [step for step in done.outputs]
    lanes = [lane.get_attribute("data-step") for lane in svg.find_elements(By.CSS_SELECTOR, "g.tl-lane")]
    for step in steps:
        assert step in lanes, (step, lanes)
    calls = svg.find_elements(By.CSS_SELECTOR, "rect[data-op]")
    history = console_stack.engine.history(done.id)
    made = [entry["call"] for entry in history if entry.get("call")]
    assert made and len(calls) == len(made), (made, [c.get_attribute("data-op") for c in calls])
    assert {c.get_attribute("data-op") for c in calls} == {call["op"] for call in made}
    table = browser.find_element(By.ID, "calls").text
    for call in made:
        assert call["op"] in table and str(call["status"]) in table
    outcome = browser.find_element(By.ID, "outcome").text
    assert done.outcome is not None and done.outcome["operation"]["operationId"] in outcome
    record = browser.find_element(By.ID, "record-json").get_attribute("textContent")
    assert card()["pan"] not in record and card()["pan"][:6] in record, "the card number is masked"
    screenshot(browser, "flow-timeline")


def test_retry_a_needs_attention_flow_by_clicking(console_stack: ConsoleStack, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    stopped = needs_attention(console_stack)
    sign_in(browser, console_stack, OPERATOR_KEY)
    browser.get(f"{console_stack.url}/console")
    assert stopped.id in browser.find_element(By.ID, "h-attention").find_element(By.XPATH, "..").text
    browser.get(f"{console_stack.url}/console/flows/{stopped.id}")
    wait_text(browser, "flow-state", "needs_attention")
    timeline = browser.find_element(By.CSS_SELECTOR, "svg.timeline")
    assert timeline.find_elements(By.CSS_SELECTOR, 'rect[data-kind="backoff"]'), "the retries' backoffs are drawn"
    assert timeline.find_elements(By.CSS_SELECTOR, 'rect[data-status="500"]'), "the failed calls show their status"
    navigate_by(browser, browser.find_element(By.ID, "action-retry"))
    assert "reads the order back" in browser.find_element(By.TAG_NAME, "main").text
    screenshot(browser, "confirm-retry")
    navigate_by(browser, browser.find_element(By.ID, "confirm"))
    wait_text(browser, "flow-state", "succeeded", timeout=60)
    done = console_stack.engine.get(stopped.id)
    assert done.state is FlowState.SUCCEEDED, done.summary()
    screenshot(browser, "flow-retried")


def test_a_read_only_key_cannot_cancel(console_stack: ConsoleStack, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    sleeping = console_stack.engine.start("moto", {"order": order(), "card": card()}, run_at=time.time() + 3600)
    sign_in(browser, console_stack, READ_KEY)
    browser.get(f"{console_stack.url}/console/flows/{sleeping.id}")
    wait_text(browser, "flow-state", "sleeping")
    assert not browser.find_elements(By.ID, "action-cancel"), "a read-only session is offered no action"
    browser.get(f"{console_stack.url}/console/flows/{sleeping.id}/confirm/cancel")
    assert "may look, not act" in browser.find_element(By.TAG_NAME, "main").text
    screenshot(browser, "read-only-refused")
    # Posting the form anyway (with the session's own CSRF token) is refused too, and so is the API.
    token = browser.find_element(By.NAME, "csrf").get_attribute("value")
    status = browser.execute_script(
        "return fetch(arguments[0], {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},"
        " body: 'csrf=' + encodeURIComponent(arguments[1]) + '&reason=x'}).then(r => r.status);",
        f"/console/flows/{sleeping.id}/cancel",
        token,
    )
    assert status == 403
    answer = console_stack.http.post(f"/flows/{sleeping.id}/cancel", headers={"X-Api-Key": READ_KEY})
    assert answer.status_code == 403, answer.text
    assert console_stack.engine.get(sleeping.id).state is FlowState.SLEEPING


def test_the_flow_list_pages_by_cursor_while_flows_start(console_stack: ConsoleStack, browser: Any) -> None:
    """The "Older" link goes on from the last flow shown: flows started meanwhile neither repeat nor hide one."""
    from selenium.webdriver.common.by import By

    def shown() -> list[str]:
        return [link.text for link in browser.find_elements(By.CSS_SELECTOR, "table.flows a.id")]

    later = time.time() + 3600  # sleeping flows: nothing runs, the list holds still but for the new starts
    older = [console_stack.engine.start("moto", {"order": order(), "card": card()}, run_at=later).id for _ in range(53)]
    sign_in(browser, console_stack, READ_KEY)
    browser.get(f"{console_stack.url}/console/flows")
    first = shown()
    assert len(first) == 50 and set(first) <= set(older)
    for _ in range(4):
        console_stack.engine.start("moto", {"order": order(), "card": card()}, run_at=later)
    navigate_by(browser, browser.find_element(By.ID, "next-page"))
    second = shown()
    assert sorted(first + second) == sorted(older), "every flow once, the new ones before the cursor"
    assert not browser.find_elements(By.ID, "next-page"), "the last page"
    screenshot(browser, "flows-second-page")
    navigate_by(browser, browser.find_element(By.LINK_TEXT, "Newest"))
    assert len(shown()) == 50 and set(shown()) - set(older), "the first page again, the new flows on it"


PAGES = (
    "/console",
    "/console/flows",
    "/console/flows/{flow}",
    "/console/flows/{flow}/confirm/cancel",
    "/console/flows/no-such-flow",
    "/console/schedules",
    "/console/schedules/{schedule}",
    "/console/schedules/{schedule}/confirm/amount",
    "/console/schedules/{gone}",
    "/console/schedules/{gone}/confirm/resolve",
    "/console/kinds",
    "/console/bulk?action=cancel&kind=moto&state=sleeping",
)
SCHEDULE = {
    "contractId": "contract-browser-1",
    "amount": 990,
    "currency": "EUR",
    "description": "weekly coffee",
    "rule": {"every": "week", "weekday": "monday"},
    "timezone": "America/New_York",
    "start": "2031-01-01",
}


def test_every_page_is_same_origin_titled_labelled_and_fits(console_stack: ConsoleStack, browser: Any) -> None:
    """No page loads anything from another origin (the browser's own record of every resource), every
    page has a title, every control a label, and nothing is wider than a 1280 or a 390 px window."""
    sleeping = console_stack.engine.start("moto", {"order": order(), "card": card()}, run_at=time.time() + 3600)
    created = console_stack.http.post("/schedules", json=SCHEDULE)
    assert created.status_code == 201, created.text
    gone = console_stack.http.post("/schedules", json={**SCHEDULE, "contractId": "contract-browser-2"}).json()["id"]
    stop_on_a_gone_flow(Schedules(console_stack.engine), gone)  # offers "resolve": its form has radios
    origin = urlsplit(console_stack.url)
    browser.delete_all_cookies()
    try:
        for width in (1280, 390):
            browser.set_window_size(width, 900)
            browser.get(f"{console_stack.url}/console/login")
            check_page(browser, origin, "login", width)
        sign_in(browser, console_stack, OPERATOR_KEY)
        for width in (1280, 390):
            browser.set_window_size(width, 900)
            for page in PAGES:
                browser.get(console_stack.url + page.format(flow=sleeping.id, schedule=created.json()["id"], gone=gone))
                check_page(browser, origin, page, width)
    finally:
        browser.set_window_size(1280, 900)


def check_page(driver: Any, origin: Any, page: str, width: int) -> None:
    from selenium.webdriver.common.by import By

    assert driver.title.strip(), f"{page}: no title"
    loaded = driver.execute_script("return [document.URL].concat(performance.getEntriesByType('resource').map(e => e.name));")
    for url in loaded:
        parts = urlsplit(url)
        assert (parts.scheme, parts.netloc) == (origin.scheme, origin.netloc) or parts.scheme == "data", (page, url)
    for control in driver.find_elements(By.CSS_SELECTOR, "input:not([type=hidden]), select, textarea"):
        ident = control.get_attribute("id")
        label = driver.find_elements(By.CSS_SELECTOR, f"label[for='{ident}']") if ident else []
        labelled = control.get_attribute("aria-label") or label
        assert labelled, f"{page}: control {control.get_attribute('name')!r} has no label"
    for button in driver.find_elements(By.CSS_SELECTOR, "button, a.button"):
        assert button.text.strip() or button.get_attribute("aria-label"), f"{page}: a button without a name"
    overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth;")
    assert overflow <= 1, f"{page} is {overflow}px wider than a {width}px window"
    name = page.strip("/").replace("/", "-").replace("{", "").replace("}", "")
    screenshot(driver, f"{name}-{width}")


#: How many lines of text each id in a table takes (a range over its text: one rect per line).
ID_LINES = """return Array.from(document.querySelectorAll('table .id')).map(e => {
  const r = document.createRange(); r.selectNodeContents(e);
  const tops = new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top)));
  return [e.textContent.trim(), tops.size];
});"""


def test_amounts_possible_actions_and_whole_ids_at_1400_px(console_stack: ConsoleStack, browser: Any) -> None:
    """Issue 27: amounts read "9900 EUR" for 99.00 EUR, a declined card flow offered a Retry the engine
    refuses, a waiting flow showed no deadline, and the list broke ids in their middle."""
    from selenium.webdriver.common.by import By

    paid = console_stack.engine.wait(console_stack.engine.start("moto", {"order": order(9900), "card": card()}).id, 30)
    declined = console_stack.engine.wait(console_stack.engine.start("moto", {"order": order(2500), "card": card(DECLINE)}).id, 30)
    waiting = console_stack.engine.start("hpp", {"order": order(150000, "JPY"), "paymentSession": session(150000)})
    assert (paid.state, declined.state) == (FlowState.SUCCEEDED, FlowState.FAILED), (paid.summary(), declined.summary())
    console_stack.engine.wait(waiting.id, 30, states=frozenset({FlowState.WAITING}))
    browser.set_window_size(1400, 900)
    try:
        sign_in(browser, console_stack, OPERATOR_KEY)
        browser.get(f"{console_stack.url}/console/flows")
        rows = {row.get_attribute("data-id"): row for row in browser.find_elements(By.CSS_SELECTOR, "table.flows tbody tr")}
        amounts = {flow_id: rows[flow_id].find_element(By.CSS_SELECTOR, "td.amount").text for flow_id in rows}
        assert amounts[paid.id] == "99.00 EUR" and amounts[declined.id] == "25.00 EUR", amounts
        assert amounts[waiting.id] == "150,000 JPY", "the currency's own decimals (none for JPY)"
        assert "until" in rows[waiting.id].text, "a waiting flow says until when"
        colour = rows[declined.id].find_element(By.CSS_SELECTOR, "td.state").value_of_css_property("color")
        assert colour != rows[paid.id].find_element(By.CSS_SELECTOR, "td.state").value_of_css_property("color")
        wrapped = [(text, lines) for text, lines in browser.execute_script(ID_LINES) if lines != 1]
        assert wrapped == [], f"ids broken over lines at 1400 px: {wrapped}"
        screenshot(browser, "flows-1400")

        navigate_by(browser, rows[paid.id].find_element(By.LINK_TEXT, paid.id))
        assert "99.00 EUR" in browser.find_element(By.ID, "outcome").text
        assert (
            paid.outcome is not None and paid.outcome["operation"]["operationId"] in browser.find_element(By.ID, "outcome").text
        )

        browser.get(f"{console_stack.url}/console/flows/{declined.id}")
        assert browser.find_elements(By.ID, "action-retry") == [], "no Retry the engine would refuse (card data erased)"
        assert browser.find_element(By.CSS_SELECTOR, ".legend .tl-failed"), "the legend names the failed bar"

        browser.get(f"{console_stack.url}/console/flows/{waiting.id}")
        assert RULE.match(browser.find_element(By.ID, "flow-deadline").text), "the one rule for times"
        assert [a.get_attribute("id") for a in browser.find_elements(By.CSS_SELECTOR, "#h-actions ~ p a")] == ["action-cancel"]
    finally:
        browser.set_window_size(1280, 900)


def test_a_late_payment_being_refunded_links_its_refund_and_offers_nothing(console_stack: ConsoleStack, browser: Any) -> None:
    """Issue 27: after "Refund" (the flow stays in needs_attention until its refund succeeded) the page
    still offered "Accept late payment", which the engine refuses while the refund is under way, and did
    not name the refund flow; the "waiting for a person" bar sits on the lane of the step the flow stopped
    at. The refund kind is paused so that the refund stays under way while the page is read."""
    from selenium.webdriver.common.by import By

    from durapay.gateway import Catalogue

    engine = console_stack.engine
    flow = engine.start("hpp", {"order": order(4200), "paymentSession": session(4200), "waitSeconds": 2})
    failed = engine.wait(flow.id, 60)
    assert failed.state is FlowState.FAILED, failed.summary()
    paid = console_stack.simulator.admin.complete_hpp(failed.order_id)
    operation = engine.gateway().call(Catalogue.get_operation, paid["operationId"]).wire()
    assert engine.signal(flow.id, "notification", {"operation": operation}, by="notification") == "late_payment"
    engine.pauses.pause("refund", "the refund stays under way while the page is read", by="test")
    try:
        browser.set_window_size(1400, 900)
        sign_in(browser, console_stack, OPERATOR_KEY)
        browser.get(f"{console_stack.url}/console/flows/{flow.id}")
        assert [a.get_attribute("id") for a in browser.find_elements(By.CSS_SELECTOR, "p.actions a")] == [
            "action-accept",
            "action-refund",
        ]
        navigate_by(browser, browser.find_element(By.ID, "action-refund"))
        browser.find_element(By.ID, "reason").send_keys("the customer asked")
        browser.find_element(By.ID, "confirm").click()
        wait_until(lambda: "done=refund" in browser.current_url, 15, "the flow page after the refund")
        refund = engine.refund_under_way(engine.get(flow.id))
        assert refund is not None and engine.get(flow.id).state is FlowState.NEEDS_ATTENTION
        assert browser.find_elements(By.CSS_SELECTOR, "p.actions a") == [], "no Accept the engine would refuse"
        link = browser.find_element(By.CSS_SELECTOR, "a.refund-flow")
        assert link.text == refund.id and link.get_attribute("href").endswith(f"/console/flows/{refund.id}")
        person = browser.find_element(By.CSS_SELECTOR, "svg.timeline rect[data-kind=person]")
        lane = browser.find_element(By.CSS_SELECTOR, f"svg.timeline g.tl-lane[data-step={failed.step}] rect")
        assert person.get_attribute("data-step") == failed.step
        top = float(lane.get_attribute("y"))
        assert top <= float(person.get_attribute("y")) < top + float(lane.get_attribute("height"))
        screenshot(browser, "late-payment-being-refunded")
    finally:
        engine.pauses.resume("refund", by="test")
    closed = engine.wait(flow.id, 30, states=frozenset({FlowState.CANCELLED}))
    assert closed.outcome is not None and closed.outcome["refund"]["flow"] == refund.id
