"""The console over HTTP (no browser) against a whole stack: sign-in and CSRF, roles in the console and
the API, search, the late-payment actions end to end at the simulator, and the schedule pages (among
their actions, resolving an occurrence whose flow is gone)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from durapay.gateway import Catalogue
from durapay.workflows.engine.operator_actions import ACTIONS
from durapay.workflows.engine.states import FlowState
from durapay.workflows.schedules import Schedules
from tests.service.console.conftest import OPERATOR_KEY, READ_KEY, ConsoleStack
from tests.waiting import wait_until
from tests.workflows.integration.test_flows import card, order, session
from tests.workflows.schedules.harness import stop_on_a_gone_flow

pytestmark = pytest.mark.integration


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


def confirmation(page: httpx.Response) -> dict[str, str]:
    """What a confirmation page's form posts: its CSRF token and the flow (or schedule) as it showed it."""
    seen = re.search(r'name="seen" value="([^"]+)"', page.text)
    assert seen, page.text[:500]
    return {"csrf": csrf_of(page), "seen": seen.group(1)}


@contextmanager
def signed_in(stack: ConsoleStack, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=10.0) as client:
        login = client.get("/console/login")
        answer = client.post("/console/login", data={"name": "Ada", "key": key, "csrf": csrf_of(login), "next": "/console"})
        assert answer.status_code == 303 and answer.headers["location"] == "/console", answer.text
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and key.lower() not in cookie
        yield client


@pytest.fixture
def operator(console_stack: ConsoleStack) -> Iterator[httpx.Client]:
    with signed_in(console_stack, OPERATOR_KEY) as client:
        yield client


def act(client: httpx.Client, path: str, **form: str) -> httpx.Response:
    """Open the confirmation page, then post its form with its CSRF token."""
    page = client.get(path.rsplit("/", 1)[0] + "/confirm/" + path.rsplit("/", 1)[1])
    assert page.status_code == 200, page.text
    return client.post(path, data={**confirmation(page), **form})


def test_pages_need_a_session_and_forms_need_their_token(console_stack: ConsoleStack) -> None:
    anonymous = httpx.Client(base_url=console_stack.url, timeout=10.0)
    answer = anonymous.get("/console/flows")
    assert answer.status_code == 303 and answer.headers["location"].startswith("/console/login")
    assert anonymous.get("/console/live/home").status_code == 401
    login = anonymous.get("/console/login")
    assert "default-src 'none'" in login.headers["content-security-policy"]
    assert anonymous.post("/console/login", data={"name": "Ada", "key": "wrong", "csrf": csrf_of(login)}).status_code == 401
    assert anonymous.post("/console/login", data={"name": "Ada", "key": OPERATOR_KEY, "csrf": "forged"}).status_code == 403
    with signed_in(console_stack, OPERATOR_KEY) as client:
        sleeping = console_stack.engine.start("moto", {"order": order(), "card": card()}, run_at=time.time() + 3600)
        assert client.post(f"/console/flows/{sleeping.id}/cancel", data={"reason": "x"}).status_code == 403
        assert client.post(f"/console/flows/{sleeping.id}/cancel", data={"reason": "x", "csrf": "0" * 64}).status_code == 403
        assert console_stack.engine.get(sleeping.id).state is FlowState.SLEEPING
        home = client.get("/console")
        signed_out = client.post("/console/logout", data={"csrf": csrf_of(home)})
        assert signed_out.status_code == 303
        assert client.get("/console").status_code == 303


def test_read_only_keys_look_but_do_not_act_in_the_api(console_stack: ConsoleStack) -> None:
    reader = {"X-Api-Key": READ_KEY}
    assert console_stack.http.get("/flows", headers=reader).status_code == 200
    answer = console_stack.http.post("/flows/moto", headers=reader, json={"order": order(), "card": card()})
    assert answer.status_code == 403 and answer.json()["error"] == "forbidden"
    assert console_stack.http.post("/schedules", headers=reader, json={}).status_code == 403
    assert console_stack.http.get("/flows", headers={"X-Api-Key": "nope"}).status_code == 401


def test_search_by_order_id_operation_id_and_start_key(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    data = {"order": order(), "card": card()}
    started = console_stack.engine.start("moto", data, "shop-key-42")
    done = console_stack.engine.wait(started.id, 30)
    assert done.state is FlowState.SUCCEEDED and done.outcome is not None
    operation_id = done.outcome["operation"]["operationId"]
    for text in (done.id, done.order_id, operation_id, "shop-key-42"):
        page = operator.get("/console/flows", params={"q": text})
        assert page.status_code == 200 and f'href="/console/flows/{done.id}"' in page.text, text
    listed = operator.get("/console/flows", params={"state": "succeeded", "kind": "moto"})
    assert done.id in listed.text
    assert operator.get("/console/flows", params={"state": "nope"}).status_code == 422
    assert operator.get("/console/flows", params={"since": "yesterday"}).status_code == 422


def late_payment(stack: ConsoleStack) -> tuple[str, str]:
    """A hosted-page flow that failed (no payment by its short deadline), then the customer paid: the
    notification makes it a LatePayment. Returns (flow id, the paid operation id)."""
    started = stack.engine.start("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 0.5})
    failed = stack.engine.wait(started.id, 30)
    assert failed.state is FlowState.FAILED, failed.summary()
    paid = stack.simulator.admin.complete_hpp(failed.order_id)
    operation = {"orderId": failed.order_id, "operationId": paid["operationId"], "operationResult": paid["operationResult"]}
    assert stack.engine.signal(started.id, "notification", {"operation": operation}, by="notification") == "late_payment"
    return started.id, str(paid["operationId"])


def test_refund_a_late_payment_and_cancel(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    flow_id, operation_id = late_payment(console_stack)
    page = operator.get(f"/console/flows/{flow_id}")
    assert "LatePayment" in page.text and 'id="action-refund"' in page.text and 'id="action-accept"' in page.text
    for action in ("refund", "accept"):  # each button says what its confirmation page's title says
        assert re.search(rf'id="action-{action}"[^>]*>{re.escape(ACTIONS[action])}</a>', page.text), action
    confirm = operator.get(f"/console/flows/{flow_id}/confirm/refund")
    assert f"Confirm: {ACTIONS['refund']}" in confirm.text
    assert f"refund operation {operation_id}" in confirm.text
    answer = operator.post(f"/console/flows/{flow_id}/refund", data={**confirmation(confirm), "reason": "customer asked"})
    assert answer.status_code == 303, answer.text
    # The flow is closed once the refund succeeded (the refund flow's end closes it).
    cancelled = console_stack.engine.wait(flow_id, 30, states=frozenset({FlowState.CANCELLED}))
    assert cancelled.outcome is not None
    refund = console_stack.engine.wait(cancelled.outcome["refund"]["flow"], 30)
    assert refund.state is FlowState.SUCCEEDED, refund.summary()
    shown = operator.get(f"/console/flows/{flow_id}").text
    assert f'href="/console/flows/{refund.id}"' in shown, "the refund flow is linked"
    assert 'class="problem" id="flow-reason"' not in shown and 'class="note" id="flow-reason"' in shown, (
        "the operator's own reason is not shown as an error"
    )
    refunds = [
        op
        for op in console_stack.simulator.admin.operations(order_id=cancelled.order_id)
        if op["operationType"] in {"REFUND", "VOID"}
    ]
    assert len(refunds) == 1, refunds
    # Asking again refunds nothing more: the flow is no longer a late payment.
    again = operator.get(f"/console/flows/{flow_id}/confirm/refund")
    assert again.status_code == 409


def test_accept_a_late_payment(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    flow_id, operation_id = late_payment(console_stack)
    confirm = operator.get(f"/console/flows/{flow_id}/confirm/accept")
    assert "Nothing is sent to the gateway" in confirm.text
    assert operator.post(f"/console/flows/{flow_id}/accept", data={**confirmation(confirm)}).status_code == 303
    done = console_stack.engine.wait(flow_id, 30)
    assert done.state is FlowState.SUCCEEDED, (done.summary(), console_stack.engine.history(flow_id))
    assert done.outcome is not None and operation_id in done.outcome["operationIds"]


def test_a_second_payment_beside_a_succeeded_one_is_kept_or_refunded_never_cancelled(
    console_stack: ConsoleStack, operator: httpx.Client
) -> None:
    """The flow's first payment stays its outcome: the console offers keep and refund, not cancel or accept."""
    done = console_stack.engine.wait(console_stack.engine.start("moto", {"order": order(), "card": card()}).id, 30)
    assert done.state is FlowState.SUCCEEDED and done.outcome is not None
    first = done.outcome["operation"]["operationId"]
    second_order = {**order(), "orderId": f"{done.order_id}-2"}  # the customer pays a page of it too
    client = console_stack.engine.gateway()
    client.call(Catalogue.create_hpp_order, request={"order": second_order, "paymentSession": session()})
    paid = console_stack.simulator.admin.complete_hpp(second_order["orderId"])
    operation = client.call(Catalogue.get_operation, paid["operationId"]).wire()
    assert console_stack.engine.signal(done.id, "notification", {"operation": operation}, by="notification") == "late_payment"
    page = operator.get(f"/console/flows/{done.id}")
    assert 'id="action-keep"' in page.text and 'id="action-refund"' in page.text
    assert 'id="action-cancel"' not in page.text and 'id="action-accept"' not in page.text
    confirm = operator.get(f"/console/flows/{done.id}/confirm/keep")
    assert "first payment stays its outcome" in confirm.text
    assert operator.post(f"/console/flows/{done.id}/keep", data={**confirmation(confirm)}).status_code == 303
    kept = console_stack.engine.get(done.id)
    assert kept.state is FlowState.SUCCEEDED and kept.outcome is not None
    assert kept.outcome["operation"]["operationId"] == first and operation["operationId"] in kept.outcome["operationIds"]


def test_schedule_pages_and_actions(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    body = {
        "contractId": "contract-console-1",
        "amount": 1500,
        "currency": "EUR",
        "description": "monthly box",
        "rule": {"every": "month", "day": 1},
        "timezone": "Europe/Rome",
        "start": "2030-01-01",
    }
    created = console_stack.http.post("/schedules", json=body)
    assert created.status_code == 201, created.text
    schedule_id = created.json()["id"]
    listed = operator.get("/console/schedules")
    assert schedule_id in listed.text and "Europe/Rome" in listed.text
    page = operator.get(f"/console/schedules/{schedule_id}")
    assert "2030-01-01T00:00:00+01:00" in page.text, "the next run in the schedule's own time zone"
    confirm = operator.get(f"/console/schedules/{schedule_id}/confirm/amount")
    assert (
        operator.post(f"/console/schedules/{schedule_id}/amount", data={**confirmation(confirm), "amount": "1700"}).status_code
        == 303
    )
    confirm = operator.get(f"/console/schedules/{schedule_id}/confirm/pause")
    assert operator.post(f"/console/schedules/{schedule_id}/pause", data={**confirmation(confirm)}).status_code == 303
    shown = console_stack.http.get(f"/schedules/{schedule_id}").json()
    assert shown["state"] == "paused" and shown["amount"] == 1700
    with signed_in(console_stack, READ_KEY) as reader:
        assert 'id="action-resume"' not in reader.get(f"/console/schedules/{schedule_id}").text
        assert reader.get(f"/console/schedules/{schedule_id}/confirm/resume").status_code == 403
    wait_until(lambda: operator.get("/console/live/home").json()["states"], 5, "the live counters")


def test_resolve_an_occurrence_whose_flow_is_gone_then_resume(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    body = {
        "contractId": "contract-console-2",
        "amount": 1500,
        "currency": "EUR",
        "description": "monthly box",
        "rule": {"every": "month", "day": 1},
        "timezone": "Europe/Rome",
        "start": "2030-01-01",
    }
    schedule_id = console_stack.http.post("/schedules", json=body).json()["id"]
    attempt = stop_on_a_gone_flow(Schedules(console_stack.engine), schedule_id)
    order_id = attempt.data["order"]["orderId"]
    page = operator.get(f"/console/schedules/{schedule_id}")
    assert 'id="action-resolve"' in page.text and 'id="action-resume"' not in page.text, "resume would be refused"
    assert 'id="gone"' in page.text and order_id in page.text and attempt.occurrence in page.text
    refused = operator.get(f"/console/schedules/{schedule_id}/confirm/resume")
    assert refused.status_code == 409 and "resolve it first" in refused.text

    confirm = operator.get(f"/console/schedules/{schedule_id}/confirm/resolve")
    assert confirm.status_code == 200 and f'value="{attempt.occurrence}"' in confirm.text and "never charges" in confirm.text
    form = {"occurrence": attempt.occurrence, "outcome": "charge"}
    misspelt = operator.post(f"/console/schedules/{schedule_id}/resolve", data={**confirmation(confirm), **form})
    assert misspelt.status_code == 422 and "did you mean `charged`?" in misspelt.text
    form = {"occurrence": attempt.occurrence, "outcome": "charged", "operationId": "<b>op-7</b>"}
    done = operator.post(f"/console/schedules/{schedule_id}/resolve", data={**confirmation(confirm), **form})
    assert done.status_code == 303, done.text
    shown = console_stack.http.get(f"/schedules/{schedule_id}").json()
    assert shown["counts"]["charged"] == 1 and shown["open"] == [] and shown["last"]["by"] == "console:Ada"
    page = operator.get(f"/console/schedules/{schedule_id}?done=resolve")
    assert "&lt;b&gt;op-7&lt;/b&gt;" in page.text and "<b>op-7" not in page.text, "what an operator typed is escaped"
    assert 'id="action-resume"' in page.text and 'id="action-resolve"' not in page.text and 'id="gone"' not in page.text
    again = operator.get(f"/console/schedules/{schedule_id}/confirm/resolve")
    assert again.status_code == 409
    assert act(operator, f"/console/schedules/{schedule_id}/resume").status_code == 303
    assert console_stack.http.get(f"/schedules/{schedule_id}").json()["state"] == "active"
    with signed_in(console_stack, READ_KEY) as reader:
        assert reader.get(f"/console/schedules/{schedule_id}/confirm/resolve").status_code == 403


def test_a_waiting_flow_shows_the_customer_url_and_its_wait(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    started = console_stack.engine.start("hpp", {"order": order(), "paymentSession": session(), "waitSeconds": 600})
    waiting = console_stack.engine.wait(started.id, 30, states=frozenset({FlowState.WAITING}))
    assert waiting.customer_url
    page = operator.get(f"/console/flows/{waiting.id}")
    assert 'id="customer-url"' in page.text and waiting.customer_url.replace("&", "&amp;") in page.text
    assert 'data-kind="wait"' in page.text and 'id="action-cancel"' in page.text
    assert operator.get(f"/console/live/flows/{waiting.id}").json() == {"state": "waiting", "version": waiting.version}
    confirm = operator.get(f"/console/flows/{waiting.id}/confirm/cancel")
    assert "first closes it where the gateway allows" in confirm.text and "a late payment" in confirm.text


def test_the_api_refunds_a_late_payment_for_operators_only(console_stack: ConsoleStack) -> None:
    flow_id, operation_id = late_payment(console_stack)
    refused = console_stack.http.post(f"/flows/{flow_id}/refund-late-payment", headers={"X-Api-Key": READ_KEY})
    assert refused.status_code == 403
    answer = console_stack.http.post(f"/flows/{flow_id}/refund-late-payment", json={"reason": "customer asked"})
    assert answer.status_code in {200, 202}, answer.text  # 202: the refund is under way
    done = console_stack.engine.wait(flow_id, 30, states=frozenset({FlowState.CANCELLED}))
    assert done.outcome is not None and done.outcome["refund"]["operationId"] == operation_id
    again = console_stack.http.post(f"/flows/{flow_id}/refund-late-payment")
    assert again.status_code == 409 and again.json()["error"] == "conflict"


def test_a_late_payment_being_refunded_has_no_accept_to_confirm(console_stack: ConsoleStack, operator: httpx.Client) -> None:
    """Not offered is not confirmable either: the confirmation page of an accept (or keep) while the
    payment is being refunded says why not, as the engine would, and shows the refund's flow."""
    flow_id, _ = late_payment(console_stack)
    console_stack.engine.pauses.pause("refund", "the refund stays under way", by="test")
    try:
        confirm = operator.get(f"/console/flows/{flow_id}/confirm/refund")
        operator.post(f"/console/flows/{flow_id}/refund", data={**confirmation(confirm), "reason": "customer asked"})
        refund = console_stack.engine.refund_under_way(console_stack.engine.get(flow_id))
        assert refund is not None
        for action in ("accept", "keep"):
            page = operator.get(f"/console/flows/{flow_id}/confirm/{action}")
            assert page.status_code == 409 and f"being refunded by flow {refund.id}" in page.text, page.text
    finally:
        console_stack.engine.pauses.resume("refund", by="test")
