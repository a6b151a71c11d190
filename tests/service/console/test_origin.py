"""The console's POSTs check ``Origin`` as a second line behind ``SameSite=Strict`` and the CSRF token:
a form posted from another site's page (or a sandboxed one, ``Origin: null``) is refused even with a
valid session and token."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.service.console.conftest import OPERATOR_KEY, ConsoleStack
from tests.service.console.test_console_http import confirmation
from tests.workflows.integration.test_flows import card, order

pytestmark = pytest.mark.integration


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


def test_a_post_from_another_origin_is_refused(console_stack: ConsoleStack) -> None:
    import time

    sleeping = console_stack.engine.start("moto", {"order": order(), "card": card()}, run_at=time.time() + 3600)
    with httpx.Client(base_url=console_stack.url, timeout=10.0) as client:
        login = client.get("/console/login")
        foreign = client.post(
            "/console/login",
            data={"name": "Ada", "key": OPERATOR_KEY, "csrf": csrf_of(login)},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403
        login = client.get("/console/login")
        own = {"Origin": console_stack.url}
        signed = client.post("/console/login", data={"name": "Ada", "key": OPERATOR_KEY, "csrf": csrf_of(login)}, headers=own)
        assert signed.status_code == 303
        confirm = client.get(f"/console/flows/{sleeping.id}/confirm/cancel")
        for origin in ("https://evil.example", "null", console_stack.url.replace("127.0.0.1", "localhost")):
            answer = client.post(
                f"/console/flows/{sleeping.id}/cancel", data={**confirmation(confirm), "reason": "x"}, headers={"Origin": origin}
            )
            assert answer.status_code == 403, origin
        assert console_stack.engine.get(sleeping.id).state.value == "sleeping"
        answer = client.post(f"/console/flows/{sleeping.id}/cancel", data={**confirmation(confirm), "reason": "x"}, headers=own)
        assert answer.status_code == 303
