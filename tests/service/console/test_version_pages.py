"""The console's Versions page (``service/console/version_pages.py``): in flight per kind and version,
drained at zero, and a flow's page naming the version it runs on."""

from __future__ import annotations

import re
from typing import Any

from durapay.workflows.flows import REGISTRY
from tests.service.console.conftest import READ_KEY, ConsoleStack
from tests.service.console.test_console_http import signed_in


def moto(order_id: str) -> dict[str, Any]:
    return {
        "order": {"orderId": order_id, "amount": "1500", "currency": "EUR", "description": "x"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
    }


def test_the_versions_page_counts_flows_in_flight_and_says_drained(console_stack: ConsoleStack) -> None:
    engine = console_stack.engine
    later = engine.clock.now() + 3600
    flow_ids = [engine.start("moto", moto(f"{engine.keys.prefix}v{n}"), run_at=later).id for n in range(2)]
    moto_version, refund_version = REGISTRY["moto"].version, REGISTRY["refund"].version
    with signed_in(console_stack, READ_KEY) as reader:
        page = reader.get("/console/versions")
        assert page.status_code == 200
        row = re.search(rf'<tr id="version-moto-{moto_version}">(.*?)</tr>', page.text, re.S)
        assert row is not None and "(current)" in row.group(1)
        assert '<td class="num">2</td>' in row.group(1) and "pay 2" in row.group(1)
        refunds = re.search(rf'<tr id="version-refund-{refund_version}">(.*?)</tr>', page.text, re.S)
        assert refunds is not None and "drained" in refunds.group(1)
        shown = reader.get(f"/console/flows/{flow_ids[0]}")
        assert f'<dd id="flow-definition" class="id">{moto_version}</dd>' in shown.text
