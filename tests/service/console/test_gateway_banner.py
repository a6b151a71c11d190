"""The console's banner while the gateway's circuit breaker is not closed (``workflows.engine.gate``): on every
page, saying since when and that flows wait without using attempts; gone once a call succeeds. Over
HTTP (every page) and in Chromium (shown above the title)."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.gateway import ServerError
from tests.service.console.conftest import READ_KEY, ConsoleStack, screenshot
from tests.service.console.test_console_browser import sign_in
from tests.service.console.test_console_http import signed_in
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_every_page_shows_the_banner_while_the_breaker_is_open(console_stack: ConsoleStack) -> None:
    gate = console_stack.engine.gate
    with signed_in(console_stack, READ_KEY) as client:
        assert 'id="gateway-banner"' not in client.get("/console").text
        for _ in range(console_stack.engine.settings.gateway_health.failures):
            gate.failed(ServerError("create_moto_order: HTTP 503", status_code=503))
        for page in ("/console", "/console/flows", "/console/schedules"):
            html = client.get(page).text
            assert 'id="gateway-banner"' in html and "Gateway unavailable since" in html, page
            assert "circuit breaker is open" in html and "use no attempts" in html
        gate.succeeded()
        assert 'id="gateway-banner"' not in client.get("/console/flows").text


def test_the_banner_in_a_browser(console_stack: ConsoleStack, browser: Any) -> None:
    """Chromium: the banner is shown above the page's title while the breaker is open, and gone after."""
    from selenium.webdriver.common.by import By

    gate = console_stack.engine.gate
    sign_in(browser, console_stack, READ_KEY)
    for _ in range(console_stack.engine.settings.gateway_health.failures):
        gate.failed(ServerError("create_moto_order: HTTP 503", status_code=503))
    browser.get(f"{console_stack.url}/console/flows")
    banner = wait_until(lambda: browser.find_elements(By.ID, "gateway-banner"), 15, "the banner")[0]
    assert banner.is_displayed() and banner.get_attribute("role") == "alert"
    assert "Gateway unavailable since" in banner.text
    assert banner.location["y"] < browser.find_element(By.TAG_NAME, "h1").location["y"]
    screenshot(browser, "gateway-banner")
    gate.succeeded()
    browser.get(f"{console_stack.url}/console/flows")
    assert browser.find_elements(By.ID, "gateway-banner") == []


def test_the_banner_names_the_terminal_whose_breaker_is_open_and_a_flow_page_its_terminal(console_stack: ConsoleStack) -> None:
    gate = console_stack.engine.terminals.gate("it")
    record = console_stack.engine.start(
        "refund", {"operationId": "800000000000000001", "amount": 100, "currency": "EUR"}, terminal="it"
    )
    with signed_in(console_stack, READ_KEY) as client:
        for _ in range(console_stack.engine.settings.gateway_health.failures):
            gate.failed(ServerError("create_moto_order: HTTP 503", status_code=503))
        html = client.get("/console").text
        assert "Gateway unavailable for terminal <code>it</code> since" in html and "other terminals' flows run" in html
        assert 'id="flow-terminal"' in client.get(f"/console/flows/{record.id}").text
        gate.succeeded()
        assert 'id="gateway-banner"' not in client.get("/console").text
