"""``durapay.client.AsyncClient`` against the real API: every call sent by one of its methods, idempotent
starts, paging by the cursor, the event stream resumed from its cursor, a GET tried again after a real
transport failure, an idle feed followed without spinning the event loop. Each test runs its coroutine
with ``asyncio.run`` (no event-loop plugin needed)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay import _calls
from durapay.client import ApiError, AsyncClient, Retries
from durapay.workflows.engine.states import FlowState
from tests.client_support import API_KEY, AsyncRecording, ClientStack, FlakyProxy, client_stack  # noqa: F401
from tests.ids import unique
from tests.test_client import SCHEDULE, Idle, moto, template_of

pytestmark = pytest.mark.integration


def quick(url: str, **options: Any) -> AsyncClient:
    return AsyncClient(url, API_KEY, retries=Retries(attempts=3, base=0.01, cap=0.05, rng=random.Random(6)), **options)


async def refused(status: int | None, call: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await call(*args, **kwargs)
    assert caught.value.status == status, str(caught.value)
    return caught.value


def test_every_call_is_sent_by_a_method_of_the_async_client(client_stack: ClientStack) -> None:  # noqa: F811
    recording = AsyncRecording()
    with WebhookReceiver() as receiver:
        asyncio.run(tour(quick(client_stack.url, transport=recording), receiver))
    sent = {template_of(method, path) for method, path in recording.sent}
    assert sorted({(route.method, route.path) for route in _calls.ROUTES} - sent) == [], "calls no method sends"


async def tour(client: AsyncClient, receiver: WebhookReceiver) -> None:
    async with client as api:
        flow = await api.start("moto", moto(), key=unique("atour"))
        assert (await api.wait(flow.id, timeout=30)).state is FlowState.SUCCEEDED
        assert (await api.get(flow.id)).id == flow.id and (await api.history(flow.id)).history
        assert [brief.id async for brief in api.iter_flows(kind="moto", page=50) if brief.id == flow.id] == [flow.id]
        assert (await api.list_flows(limit=1)).flows
        later = await api.start("moto", moto(), run_at="in 1h")
        await refused(422, api.signal, later.id, "3ds_result", {"threeDSAuthResponse": "x"})
        assert (await api.cancel(later.id)).state is FlowState.CANCELLED
        for action in (api.retry, api.refund_late_payment, api.keep_late_payment):
            await refused(409, action, later.id)

        schedule = await api.create_schedule(SCHEDULE | {"contractId": "ct-client-async"}, key=unique("atour"))
        assert (await api.get_schedule(schedule.id)).id == schedule.id and (await api.schedule_history(schedule.id)).history
        assert (await api.list_schedules(state="active", limit=500)).schedules
        assert (await api.change_schedule_amount(schedule.id, 990)).amount == 990
        assert (await api.pause_schedule(schedule.id)).state == "paused"
        assert (await api.resume_schedule(schedule.id)).state == "active"
        await refused(409, api.resolve_schedule, schedule.id, "2031-01-15T00:00:00Z", "charged")
        assert (await api.cancel_schedule(schedule.id)).state == "cancelled"
        await refused(409, api.delete_schedule, schedule.id)

        endpoint = await api.create_endpoint(receiver.url)
        receiver.secrets = [endpoint.secret]
        assert (await api.list_endpoints()).endpoints and (await api.get_endpoint(endpoint.id)).id == endpoint.id
        assert (await api.test_endpoint(endpoint.id)).ok and (await api.endpoint_attempts(endpoint.id)).attempts
        assert (await api.deliver_now(endpoint.id)).due_now == 0
        assert (await api.rotate_endpoint_secret(endpoint.id)).rotating and (await api.enable_endpoint(endpoint.id)).enabled
        page = await api.events(limit=1)
        assert page.events[0].id not in [event.id async for event in api.iter_events(after=page.next, until_idle=True, wait=0)]
        assert (await api.replay_events(endpoint=endpoint.id)).scheduled >= 0
        assert (await api.delete_endpoint(endpoint.id)).id == endpoint.id

        assert (await api.pause_kind("svs", "atour")).paused and (await api.kinds()).kinds
        assert (await api.resume_kind("svs", by="atour")).pause is None and (await api.pauses()).pauses
        plan = await api.bulk_dry_run("retry", kind="moto", state="cancelled")
        await refused(409, api.bulk, "retry", plan=plan.plan, kind="moto")  # another filter than the dry run's
        action = await api.confirm_bulk(plan, by="atour")
        assert plan.count >= 1 and action.total == plan.count and (await api.get_bulk(action.id)).id == action.id
        assert (await api.bulk("retry", kind="moto", state="cancelled", by="atour")).id != action.id, "a new action"
        assert (await api.bulk_actions(limit=5)).bulk

        report = await api.reconcile(since="1h")
        for _ in range(300):  # bounded: 30 s at most
            if not (await api.reconciliation_report(report.id)).running:
                break
            await asyncio.sleep(0.1)
        assert (await api.latest_reconciliation()).id == report.id and (await api.reconciliation_reports()).reports
        assert (await api.healthz()).status == "ok" and "redis" in (await api.readyz()).checks
        assert "durapay_flows" in await api.metrics()


def test_a_start_with_a_key_twice_is_one_flow(client_stack: ClientStack) -> None:  # noqa: F811
    async def twice() -> None:
        async with quick(client_stack.url) as api:
            data, key = moto(), unique("atwice")
            first, again = await asyncio.gather(api.start("moto", data, key=key), api.start("moto", data, key=key))
            assert first.id == again.id
            assert (await refused(409, api.start, "moto", moto(), key=key)).error == "conflict"

    asyncio.run(twice())


def test_paging_and_the_event_stream_resume_where_they_were(client_stack: ClientStack) -> None:  # noqa: F811
    async def pages() -> None:
        async with quick(client_stack.url) as api:
            tail = api.iter_events(types=["flow.created"], until_idle=True, wait=0)
            async for _ in tail:
                pass
            later = time.time() + 3600
            ours = [(await api.start("moto", moto(), run_at=later)).id for _ in range(4)]
            flows = api.iter_flows(page=2)
            seen = [(await anext(flows)).id for _ in range(3)]
            new = (await api.start("moto", moto(), run_at=later)).id
            seen += [brief.id async for brief in flows]
            assert len(seen) == len(set(seen)) and set(ours) <= set(seen) and new not in seen

            stream = api.iter_events(after=tail.cursor, types=["flow.created"], wait=5)
            first = await anext(stream)
            resumed = api.iter_events(after=stream.cursor, types=["flow.created"], wait=5)
            rest = [(await anext(resumed)).model_extra["flow"] for _ in range(4)]  # type: ignore[index]
            assert sorted([first.model_extra["flow"], *rest]) == sorted([*ours, new]), "each once, none skipped"  # type: ignore[index]

    asyncio.run(pages())


def test_a_get_is_tried_again_after_a_transport_failure(client_stack: ClientStack) -> None:  # noqa: F811
    flow = client_stack.engine.start("moto", moto(), run_at=time.time() + 3600)

    async def get(proxy: FlakyProxy) -> None:
        async with quick(proxy.url) as api:
            assert (await api.get(flow.id)).id == flow.id

    async def cancel(proxy: FlakyProxy) -> None:
        async with quick(proxy.url) as api:
            assert (await refused(None, api.cancel, flow.id)).retryable

    with FlakyProxy(client_stack.url, ["drop"]) as proxy:
        asyncio.run(get(proxy))
        assert proxy.connections == 2, "dropped, then tried again"
    with FlakyProxy(client_stack.url, ["drop"]) as proxy:
        asyncio.run(cancel(proxy))
        assert proxy.connections == 1, "a cancel is never resent"
    assert client_stack.engine.get(flow.id).state is FlowState.SLEEPING


def test_following_an_idle_feed_backs_off_and_lets_the_loop_run() -> None:
    """The twin of the sync client's test: six empty reads take the pauses asked between them (on the
    test's clock: exact), and the event loop runs another task in each pause. The ticker wakes every
    millisecond and its timer is always set before a pause begins (it ran once before the first read), so
    asyncio, firing timers in the order of their deadlines, runs it before any pause of at least 40 ms
    ends: a tick in every gap, on any machine, unless a pause blocks the loop."""
    idle = Idle()

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.001)
            idle.ticker += 1

    async def follow() -> None:
        beside = asyncio.create_task(ticker())
        await asyncio.sleep(0)  # the ticker's first timer is set
        async with AsyncClient("http://api.test", API_KEY, transport=httpx.MockTransport(idle), clock=idle.clock) as api:
            with pytest.raises(Idle.Enough):
                await anext(api.iter_events(wait=0))
        beside.cancel()

    asyncio.run(follow())
    idle.check()
    assert all(later > earlier for earlier, later in zip(idle.ticks, idle.ticks[1:], strict=False)), idle.ticks
