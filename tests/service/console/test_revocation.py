"""Console sessions can be taken back: a cookie copied before sign-out, or before its key was rotated
out of the configuration, gets the sign-in page and changes nothing (a real browser signs in and out;
the copy is replayed over HTTP as an attacker holding it would)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from durapay.service.app import create_app
from durapay.service.runtime import build_runtime
from durapay.service.server import ApiServer
from tests.service.console.conftest import OPERATOR_KEY, READ_KEY, ConsoleStack
from tests.service.console.test_console_browser import navigate_by, sign_in
from tests.workflows.integration.conftest import stack_settings

pytestmark = pytest.mark.integration

SCHEDULE = {
    "contractId": "contract-revocation-1",
    "amount": 1500,
    "currency": "EUR",
    "description": "monthly box",
    "rule": {"every": "month", "day": 1},
    "timezone": "Europe/Rome",
    "start": "2030-01-01",
}


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


def replay(url: str, cookie: str, schedule_id: str, csrf: str) -> tuple[httpx.Response, httpx.Response]:
    """What a copied cookie gets: the console's home, and a pause of the schedule with the old token."""
    with httpx.Client(base_url=url, timeout=10.0, cookies={"durapay_console": cookie}) as thief:
        home = thief.get("/console")
        pause = thief.post(f"/console/schedules/{schedule_id}/pause", data={"csrf": csrf})
    return home, pause


@pytest.fixture
def schedule_id(console_stack: ConsoleStack) -> str:
    created = console_stack.http.post("/schedules", json=SCHEDULE)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def test_a_cookie_copied_before_sign_out_opens_nothing(console_stack: ConsoleStack, browser: Any, schedule_id: str) -> None:
    from selenium.webdriver.common.by import By

    sign_in(browser, console_stack, OPERATOR_KEY)
    cookie = browser.get_cookie("durapay_console")["value"]
    assert OPERATOR_KEY not in cookie
    browser.get(f"{console_stack.url}/console/schedules/{schedule_id}/confirm/pause")
    csrf = browser.find_element(By.NAME, "csrf").get_attribute("value")
    home, _ = replay(console_stack.url, cookie, schedule_id, "not-the-token")
    assert home.status_code == 200, "the copy works while the session lasts"
    navigate_by(browser, browser.find_element(By.ID, "sign-out"))
    assert "/console/login" in browser.current_url
    home, pause = replay(console_stack.url, cookie, schedule_id, csrf)
    assert home.status_code == 303 and home.headers["location"].startswith("/console/login")
    assert pause.status_code in (303, 401, 403), pause.text
    assert console_stack.http.get(f"/schedules/{schedule_id}").json()["state"] == "active"


@pytest.fixture
def rotated(console_stack: ConsoleStack, key_prefix: str) -> Iterator[str]:
    """A second API process on the same store whose operator key was rotated and read key removed."""
    settings = stack_settings(
        key_prefix, console_stack.simulator.base_url, api={"key": "rotated-operator-key-0123456789", "keys": {}}
    )
    runtime = build_runtime(settings, redis_url=console_stack.runtime.redis_url)
    try:
        with ApiServer(create_app(runtime)) as server:
            yield server.url
    finally:
        runtime.close()


def test_a_cookie_of_a_rotated_or_removed_key_opens_nothing(console_stack: ConsoleStack, schedule_id: str, rotated: str) -> None:
    for key in (OPERATOR_KEY, READ_KEY):
        with httpx.Client(base_url=console_stack.url, timeout=10.0) as client:
            login = client.get("/console/login")
            assert client.post("/console/login", data={"name": "Ada", "key": key, "csrf": csrf_of(login)}).status_code == 303
            confirm = client.get(f"/console/schedules/{schedule_id}")
            assert confirm.status_code == 200
            cookie = client.cookies["durapay_console"]
            home, pause = replay(rotated, cookie, schedule_id, csrf_of(confirm))
        assert home.status_code == 303 and home.headers["location"].startswith("/console/login"), key
        assert pause.status_code in (303, 401, 403), pause.text
        home, _ = replay(console_stack.url, cookie, schedule_id, "x")
        assert home.status_code == 303, "ended for every process, also one still configured with the old key"
    assert console_stack.http.get(f"/schedules/{schedule_id}").json()["state"] == "active"
