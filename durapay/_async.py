"""``AsyncClient``: :class:`durapay.client.Client` for asyncio, the same methods awaited.

Kept apart only for size: every method is the sync one's twin (same name, arguments and answer), its
call built by the same function of ``durapay._calls`` and its plans (wait, every page, the event feed)
driven by the same generators; only the driving awaits. Import it from ``durapay.client``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Collection, Generator
from typing import Any, TypeVar

import httpx

from durapay import _calls as calls
from durapay._calls import Body, Call, Feed, Pause, Step, When
from durapay._http import ApiError, Retries, answer, no_answer, request, settings
from durapay.service.ops_schemas import BulkList, BulkPlan, BulkView, KindList, KindView, PauseLog
from durapay.service.reconcile_schemas import ReconciliationList, ReconciliationReport
from durapay.service.schemas import (
    AttemptList,
    EndpointList,
    EndpointView,
    EndpointWithSecret,
    EventPage,
    EventView,
    FlowBrief,
    FlowList,
    FlowView,
    Health,
    History,
    Readiness,
    ReplayAnswer,
    ScheduleList,
    ScheduleView,
    SignalAnswer,
    TestAnswer,
    WebhookDueNow,
)
from durapay.workflows.engine import STOPPED, FlowState

T = TypeVar("T")
Y = TypeVar("Y")
R = TypeVar("R")


class AsyncEventStream(AsyncIterator[EventView]):
    """``EventStream`` for :class:`AsyncClient` (``async for``); :attr:`cursor` resumes it."""

    def __init__(self, client: AsyncClient, feed: Feed) -> None:
        self._feed = feed
        self._events = client._stream(feed.plan())

    @property
    def cursor(self) -> str | None:
        return self._feed.cursor

    async def __anext__(self) -> EventView:
        return await anext(self._events)


class AsyncClient:
    """``Client`` for asyncio: the same methods, each awaited (``iter_flows`` and ``iter_events``
    give async iterators). Use it with ``async with`` or call :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = 10.0,
        retries: int | Retries = 3,
        rng: random.Random | None = None,
        start_wait: float = calls.START_WAIT,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: calls.Clock = time.monotonic,
    ) -> None:
        headers, self.timeout, self.retries = settings(api_key, timeout, retries, rng)
        self.start_wait = start_wait
        self.clock = clock
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=self.timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                try:
                    response = await self._http.send(request(self._http, call, self.timeout))
                except httpx.RequestError as exc:  # no answer, or one that cannot be read
                    raise no_answer(call, exc) from exc
                return answer(call, response)
            except ApiError as error:
                pause = self.retries.pause(call, error, attempt)
                if pause is None:
                    raise
            await asyncio.sleep(pause)

    async def _step(self, step: Step) -> Any:
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            return None
        return await self._run(step)

    async def _finish(self, plan: Generator[Step, Any, R]) -> R:
        reply: Any = None
        while True:
            try:
                step = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply = await self._step(step)

    async def _stream(self, plan: Generator[Step | Y, Any, None]) -> AsyncIterator[Y]:
        reply: Any = None
        while True:
            try:
                step = plan.send(reply)
            except StopIteration:
                return
            if isinstance(step, Call | Pause):
                reply = await self._step(step)
            else:
                reply = None
                yield step

    # -- flows (see Client) ---------------------------------------------------------------------

    async def start(
        self,
        kind: str,
        input: Body,
        *,
        key: str | None = None,
        run_at: When | None = None,
        wait: float | None = None,
        terminal: str | None = None,
        tenant: str | None = None,
    ) -> FlowView:
        wait = self.start_wait if wait is None else wait
        return await self._run(calls.start(kind, input, key=key, run_at=run_at, wait=wait, terminal=terminal, tenant=tenant))

    async def get(self, flow_id: str) -> FlowView:
        return await self._run(calls.get(flow_id))

    async def wait(self, flow_id: str, timeout: float = 30.0, *, states: Collection[FlowState] = STOPPED) -> FlowView:
        return await self._finish(calls.wait(flow_id, timeout, states, self.clock))

    async def list_flows(
        self,
        *,
        state: FlowState | str | None = None,
        kind: str | None = None,
        since: When | None = None,
        limit: int = 50,
        after: str | None = None,
        terminal: str | None = None,
    ) -> FlowList:
        return await self._run(calls.list_flows(state=state, kind=kind, since=since, limit=limit, after=after, terminal=terminal))

    def iter_flows(
        self,
        *,
        state: FlowState | str | None = None,
        kind: str | None = None,
        since: When | None = None,
        page: int = 100,
        terminal: str | None = None,
    ) -> AsyncIterator[FlowBrief]:
        first = calls.list_flows(state=state, kind=kind, since=since, limit=page, after=None, terminal=terminal)
        return self._stream(calls.every_flow(first))

    async def history(self, flow_id: str) -> History:
        return await self._run(calls.history(flow_id))

    async def signal(self, flow_id: str, name: str, payload: Body | None = None) -> SignalAnswer:
        return await self._run(calls.signal(flow_id, name, payload))

    async def cancel(self, flow_id: str, reason: str | None = None) -> FlowView:
        return await self._run(calls.cancel(flow_id, reason))

    async def retry(self, flow_id: str) -> FlowView:
        return await self._run(calls.retry(flow_id))

    async def refund_late_payment(self, flow_id: str, reason: str | None = None) -> FlowView:
        return await self._run(calls.refund_late_payment(flow_id, reason))

    async def keep_late_payment(self, flow_id: str) -> FlowView:
        return await self._run(calls.keep_late_payment(flow_id))

    # -- schedules ------------------------------------------------------------------------------

    async def create_schedule(self, input: Body, *, key: str | None = None) -> ScheduleView:
        return await self._run(calls.create_schedule(input, key=key))

    async def list_schedules(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> ScheduleList:
        return await self._run(calls.list_schedules(state=state, limit=limit, offset=offset))

    async def get_schedule(self, schedule_id: str) -> ScheduleView:
        return await self._run(calls.schedule(calls.GET_SCHEDULE, schedule_id))

    async def schedule_history(self, schedule_id: str) -> History:
        return await self._run(calls.schedule(calls.SCHEDULE_HISTORY, schedule_id))

    async def change_schedule_amount(self, schedule_id: str, amount: int) -> ScheduleView:
        return await self._run(calls.schedule(calls.CHANGE_SCHEDULE, schedule_id, {"amount": amount}))

    async def pause_schedule(self, schedule_id: str) -> ScheduleView:
        return await self._run(calls.schedule(calls.PAUSE_SCHEDULE, schedule_id))

    async def resume_schedule(self, schedule_id: str) -> ScheduleView:
        return await self._run(calls.schedule(calls.RESUME_SCHEDULE, schedule_id))

    async def cancel_schedule(self, schedule_id: str, reason: str | None = None) -> ScheduleView:
        return await self._run(calls.schedule(calls.CANCEL_SCHEDULE, schedule_id, calls.some(reason=reason) or None))

    async def resolve_schedule(
        self, schedule_id: str, occurrence: str, outcome: str, *, operation_id: str | None = None
    ) -> ScheduleView:
        resolution = calls.some(occurrence=occurrence, outcome=outcome, operationId=operation_id)
        return await self._run(calls.schedule(calls.RESOLVE_SCHEDULE, schedule_id, resolution))

    async def delete_schedule(self, schedule_id: str) -> ScheduleView:
        return await self._run(calls.schedule(calls.DELETE_SCHEDULE, schedule_id))

    # -- webhook endpoints ----------------------------------------------------------------------

    async def create_endpoint(
        self, url: str, *, events: Collection[str] = (), description: str | None = None
    ) -> EndpointWithSecret:
        return await self._run(calls.create_endpoint(url, events, description))

    async def list_endpoints(self) -> EndpointList:
        return await self._run(calls.LIST_ENDPOINTS.call())

    async def get_endpoint(self, endpoint_id: str) -> EndpointView:
        return await self._run(calls.endpoint(calls.GET_ENDPOINT, endpoint_id))

    async def delete_endpoint(self, endpoint_id: str) -> EndpointView:
        return await self._run(calls.endpoint(calls.DELETE_ENDPOINT, endpoint_id))

    async def rotate_endpoint_secret(self, endpoint_id: str) -> EndpointWithSecret:
        return await self._run(calls.endpoint(calls.ROTATE_SECRET, endpoint_id))

    async def enable_endpoint(self, endpoint_id: str) -> EndpointView:
        return await self._run(calls.endpoint(calls.ENABLE_ENDPOINT, endpoint_id))

    async def test_endpoint(self, endpoint_id: str) -> TestAnswer:
        return await self._run(calls.endpoint(calls.TEST_ENDPOINT, endpoint_id))

    async def endpoint_attempts(self, endpoint_id: str, *, limit: int = 50) -> AttemptList:
        return await self._run(calls.endpoint(calls.ENDPOINT_ATTEMPTS, endpoint_id, {"limit": limit}))

    async def deliver_now(self, endpoint_id: str) -> WebhookDueNow:
        return await self._run(calls.endpoint(calls.DELIVER_NOW, endpoint_id))

    # -- events ---------------------------------------------------------------------------------

    async def events(
        self, *, after: str | None = None, types: Collection[str] | None = None, limit: int = 100, wait: float = 0.0
    ) -> EventPage:
        return await self._run(calls.events(after=after, types=types, limit=limit, wait=wait))

    def iter_events(
        self,
        *,
        after: str | None = None,
        types: Collection[str] | None = None,
        limit: int = 100,
        wait: float = 25.0,
        until_idle: bool = False,
    ) -> AsyncEventStream:
        return AsyncEventStream(self, Feed(after, types, limit, wait, until_idle, self.clock))

    async def replay_events(
        self,
        *,
        after: str | None = None,
        until: float | None = None,
        endpoint: str | None = None,
        types: Collection[str] | None = None,
    ) -> ReplayAnswer:
        return await self._run(calls.replay(after=after, until=until, endpoint=endpoint, types=types))

    # -- flow kinds (pauses) and bulk actions --------------------------------------------------------

    async def kinds(self) -> KindList:
        """Every flow kind, with its pause when paused."""
        return await self._run(calls.LIST_KINDS.call())

    async def pause_kind(self, kind: str, reason: str, *, by: str | None = None) -> KindView:
        """Pause a flow kind: none of its flows runs a step until it is resumed (a pause in force stands)."""
        return await self._run(calls.pause_kind(kind, reason, by))

    async def resume_kind(self, kind: str, *, by: str | None = None) -> KindView:
        """Resume a paused flow kind; ``released``: the flows it held that go on now."""
        return await self._run(calls.resume_kind(kind, by))

    async def pauses(self, *, limit: int = 100) -> PauseLog:
        """The audit list of pauses and resumes, newest first."""
        return await self._run(calls.PAUSES.call(params={"limit": limit}))

    async def bulk_dry_run(self, action: str, **filters: Any) -> BulkPlan:
        """What a bulk ``retry`` or ``cancel`` of the flows matching ``filters`` (kind, state, error, since,
        until) would do: the count, a sample with each flow's money, the money at stake by currency
        (``totals``), what it would skip and why. Changes no flow; the flows it lists are kept an hour for
        its confirmation (:meth:`confirm_bulk`)."""
        return await self._run(calls.bulk(calls.BULK_DRY_RUN, action, filters))

    async def bulk(self, action: str, *, plan: str | None = None, key: str | None = None, **filters: Any) -> BulkView:
        """Retry or cancel every flow matching ``filters``, in the background: the action with its progress.
        ``plan``: the dry run's (:meth:`bulk_dry_run`'s ``plan``) this action confirms, with the same action
        and filters (otherwise a 409): it acts on the flows that dry run listed, each only if unchanged since
        (:meth:`confirm_bulk` sends them for you); the same ``plan`` (or ``key``) again answers the same
        action; with neither, each call is a new action on the flows matching then."""
        return await self._run(calls.bulk(calls.POST_BULK, action, {**filters, "plan": plan}, key=key))

    async def confirm_bulk(self, plan: BulkPlan, *, by: str | None = None, key: str | None = None) -> BulkView:
        """Confirm a dry run (:meth:`bulk_dry_run`'s answer): its action on the flows it listed, each only if
        unchanged since (skipped as ``changed`` otherwise); confirmed again, the same action. A 409 once the
        dry run is no longer kept (an hour): make a new one."""
        return await self._run(calls.confirm_bulk(plan, by=by, key=key))

    async def bulk_actions(self, *, limit: int = 50) -> BulkList:
        return await self._run(calls.LIST_BULK.call(params={"limit": limit}))

    async def get_bulk(self, bulk_id: str) -> BulkView:
        return await self._run(calls.GET_BULK.call(path={"bulk_id": bulk_id}))

    # -- reconciliation and operations ----------------------------------------------------------

    async def reconcile(self, *, since: When | None = None, until: When | None = None) -> ReconciliationReport:
        return await self._run(calls.reconcile(since, until))

    async def reconciliation_reports(self) -> ReconciliationList:
        return await self._run(calls.LIST_REPORTS.call())

    async def latest_reconciliation(self) -> ReconciliationReport:
        return await self._run(calls.LATEST_REPORT.call())

    async def reconciliation_report(self, report_id: str) -> ReconciliationReport:
        return await self._run(calls.report(report_id))

    async def healthz(self) -> Health:
        return await self._run(calls.HEALTHZ.call())

    async def readyz(self) -> Readiness:
        return await self._run(calls.READYZ.call())

    async def metrics(self) -> str:
        return await self._run(calls.METRICS.call())
