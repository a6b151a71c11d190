"""The console's banner while the gateway's circuit breaker is not closed (``workflows.gate``): on every
page, saying since when and that flows wait without using attempts; gone once a call succeeds."""

from __future__ import annotations

from durapay.gateway import ServerError
from tests.service.console.conftest import READ_KEY, ConsoleStack
from tests.service.console.test_console_http import signed_in


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
