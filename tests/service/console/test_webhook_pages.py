"""The console's Webhooks page in Chromium (issue 27: no "deliver what is pending now"): each endpoint
with its latest attempt and when the next comes; an operator's "Deliver pending now" makes the endpoint's
backing-off deliveries due at once; a read-only key is offered no button and refused the POST."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.service.app import create_app
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.workflows.moments import moment_text
from tests.service.conftest import NOTIFIED, service_settings
from tests.service.console.conftest import OPERATOR_KEY, READ_KEY, screenshot
from tests.waiting import wait_until


@pytest.fixture
def webhook_stack(redis_url: str, key_prefix: str) -> Iterator[tuple[str, Runtime]]:
    settings = service_settings(
        key_prefix, api={"key": OPERATOR_KEY, "keys": {READ_KEY: "read"}}, webhooks={"allow_private": True}
    )
    built = build_runtime(settings, redis_url=redis_url, flows={"notified": NOTIFIED})
    built.engine.sender = None
    built.webhooks.send = None  # no worker: the test makes the attempts itself
    with ApiServer(create_app(built)) as server:
        yield server.url, built
    built.close()


def sign_in(browser: Any, url: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(f"{url}/console/login")
    browser.find_element(By.NAME, "name").send_keys("Ada")
    browser.find_element(By.NAME, "key").send_keys(key)
    browser.find_element(By.ID, "sign-in").click()
    wait_until(lambda: browser.find_elements(By.ID, "sign-out"), 15, "the signed-in page")


def backing_off(built: Runtime) -> list[tuple[str, str]]:
    """Fan the new events out and fail each delivery twice: the next try is minutes away."""
    webhooks = built.webhooks
    webhooks.fanout()
    found = []
    for tag, slot in webhooks.slots.items():
        for member in [m.decode() for m in built.engine.redis.zrange(slot.due, 0, -1)]:
            webhooks.deliver(tag, member)
            failed = webhooks.deliver(tag, member)
            assert failed is not None and failed["nextAt"] > webhooks.now() + 200, failed
            found.append((slot.due, member))
    return found


def test_deliver_pending_now_from_the_console(webhook_stack: tuple[str, Runtime], browser: Any) -> None:
    from selenium.webdriver.common.by import By

    url, built = webhook_stack
    with WebhookReceiver() as receiver, httpx.Client(base_url=url, headers={"X-Api-Key": OPERATOR_KEY}) as http:
        receiver.answer = lambda body: (503, {})  # (unsigned for it: it refuses each with a 400 first)
        endpoint = http.post("/webhooks", json={"url": receiver.url, "events": ["flow.created"]}).json()
        built.engine.start("notified", {"orderId": "o-console-hook", "token": "t"})
        # The fan-out takes an event once it is settled (a loaded machine may need a second look).
        [(due, member)] = wait_until(lambda: backing_off(built), 30, "the delivery to back off")

        sign_in(browser, url, READ_KEY)
        browser.get(f"{url}/console/webhooks")
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{endpoint["id"]}"]')
        [latest] = http.get(f"/webhooks/{endpoint['id']}/attempts", params={"limit": 1}).json()["attempts"]
        assert f": {latest['status']} (retry)" in row.text, row.text
        next_try = moment_text(latest["nextAttempt"])  # the one rule for times (workflows.moments)
        assert row.find_element(By.CSS_SELECTOR, "td.next").text == next_try, "says when the next try comes"
        assert row.find_elements(By.CSS_SELECTOR, "button") == [], "a read-only key is offered no action"
        csrf = browser.find_element(By.CSS_SELECTOR, "form[action='/console/logout'] input[name=csrf]").get_attribute("value")
        refused = browser.execute_script(
            "return fetch(arguments[0], {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},"
            " body: 'csrf=' + arguments[1]}).then(r => r.status)",
            f"{url}/console/webhooks/{endpoint['id']}/deliver-now",
            csrf,
        )
        assert refused == 403
        assert float(built.engine.redis.zscore(due, member)) > built.webhooks.now() + 200

        sign_in(browser, url, OPERATOR_KEY)
        browser.get(f"{url}/console/webhooks")
        browser.find_element(By.ID, f"deliver-{endpoint['id']}").click()
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "p.done"), 15, "the page after the click")
        assert "1 pending delivery" in browser.find_element(By.CSS_SELECTOR, "p.done").text
        assert float(built.engine.redis.zscore(due, member)) <= built.webhooks.now()
        screenshot(browser, "webhooks")
