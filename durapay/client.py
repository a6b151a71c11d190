"""A typed client of durapay's HTTP API, for a backend that is not on the workers' Redis.

``Client`` and its twin ``AsyncClient`` (httpx) cover every route of the control API: start a flow
(with an idempotency key), read it, wait for it, list flows page by page, history, signals, cancel,
retry, the late-payment actions, schedules, webhook endpoints, the event feed with its cursor, replay,
reconciliation reports, health, readiness and metrics. Answers are the API's own pydantic models
(declared in ``durapay.service.schemas``, the OpenAPI document's source; exported here, in
``__all__``: ``FlowView``, ``FlowList``, ``EventView``...); a refusal is an :class:`ApiError` carrying
the API's problem (status, error, field, reason, whether to retry)::

    with Client("https://payments.internal", api_key) as api:
        flow = api.start("moto", {"order": {...}, "card": {...}}, key="ord-42")
        done = api.wait(flow.id, timeout=60)

Each method is one line: the route's :class:`~durapay._calls.Call` is built in ``durapay._calls``
(one declaration per route) and run here, with retries of idempotent calls (``durapay._http``).
``AsyncClient`` (``durapay._async``, exported here) has the same methods, awaited.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Generator, Iterator
from typing import Any, TypeVar

import httpx

from durapay import _calls as calls
from durapay._async import AsyncClient, AsyncEventStream
from durapay._calls import Body, Call, Feed, Pause, Step, When
from durapay._http import ApiError, Retries, answer, no_answer, request, settings
from durapay.service.ops_schemas import BulkList, BulkPlan, BulkView, KindList, KindView, PauseLog
from durapay.service.reconcile_schemas import ReconciliationList, ReconciliationReport
from durapay.service.schemas import (
    AttemptList,
    AttemptView,
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

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncEventStream",
    "AttemptList",
    "AttemptView",
    "BulkList",
    "BulkPlan",
    "BulkView",
    "Client",
    "EndpointList",
    "EndpointView",
    "EndpointWithSecret",
    "EventPage",
    "EventStream",
    "EventView",
    "FlowBrief",
    "FlowList",
    "FlowView",
    "Health",
    "History",
    "KindList",
    "KindView",
    "PauseLog",
    "Readiness",
    "ReconciliationList",
    "ReconciliationReport",
    "ReplayAnswer",
    "Retries",
    "ScheduleList",
    "ScheduleView",
    "SignalAnswer",
    "TestAnswer",
    "WebhookDueNow",
]

T = TypeVar("T")
Y = TypeVar("Y")
R = TypeVar("R")


class EventStream(Iterator[EventView]):
    """Events one after another, read page by page (long-polling). :attr:`cursor` is the position after
    the last event handed out: save it once the event is handled, and resume with ``after=cursor``."""

    def __init__(self, client: Client, feed: Feed) -> None:
        self._feed = feed
        self._events = client._stream(feed.plan())

    @property
    def cursor(self) -> str | None:
        return self._feed.cursor

    def __next__(self) -> EventView:
        return next(self._events)


class Client:
    """The HTTP API at ``base_url`` with ``api_key`` (sent as ``X-Api-Key``).

    ``timeout``: seconds (or an ``httpx.Timeout``) per try; a long poll (``wait=``) adds its wait to the
    read timeout. ``retries``: tries after the first of an idempotent call failing with a retryable
    error (or a :class:`Retries` for the whole rule); ``rng``: the jitter's randomness when ``retries``
    is a number (seed it in tests). ``start_wait``: seconds a start waits for the customer URL when its
    ``wait`` is not given (always sent, so that the read timeout covers what the server holds).
    ``transport``: an ``httpx`` transport (a proxy, a test's fault). ``clock``: the monotonic clock
    :meth:`wait` and :meth:`iter_events` count their pauses on (a test's, to know each pause exactly).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = 10.0,
        retries: int | Retries = 3,
        rng: random.Random | None = None,
        start_wait: float = calls.START_WAIT,
        transport: httpx.BaseTransport | None = None,
        clock: calls.Clock = time.monotonic,
    ) -> None:
        headers, self.timeout, self.retries = settings(api_key, timeout, retries, rng)
        self.start_wait = start_wait
        self.clock = clock
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=self.timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running calls and plans ----------------------------------------------------------------

    def _run(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                try:
                    response = self._http.send(request(self._http, call, self.timeout))
                except httpx.RequestError as exc:  # no answer, or one that cannot be read
                    raise no_answer(call, exc) from exc
                return answer(call, response)
            except ApiError as error:
                pause = self.retries.pause(call, error, attempt)
                if pause is None:
                    raise
            time.sleep(pause)

    def _step(self, step: Step) -> Any:
        if isinstance(step, Pause):
            time.sleep(step.seconds)
            return None
        return self._run(step)

    def _finish(self, plan: Generator[Step, Any, R]) -> R:
        reply: Any = None
        while True:
            try:
                step = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply = self._step(step)

    def _stream(self, plan: Generator[Step | Y, Any, None]) -> Iterator[Y]:
        reply: Any = None
        while True:
            try:
                step = plan.send(reply)
            except StopIteration:
                return
            if isinstance(step, Call | Pause):
                reply = self._step(step)
            else:
                reply = None
                yield step

    # -- flows ----------------------------------------------------------------------------------

    def start(
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
        """Start a ``kind`` flow. ``key`` (the ``Idempotency-Key``): the same key and input give the same
        flow, so a start with a key is retried after a lost answer, one without never is. ``run_at``: a
        future time (POSIX seconds, an aware datetime, ``in 2h``); ``wait``: seconds the API waits for the
        customer URL (hosted page, link; the client's ``start_wait`` when not given), added to the read
        timeout. ``tenant``: the merchant a platform starts the flow for (its fairness key with the
        terminal, docs/operations.md)."""
        wait = self.start_wait if wait is None else wait
        return self._run(calls.start(kind, input, key=key, run_at=run_at, wait=wait, terminal=terminal, tenant=tenant))

    def get(self, flow_id: str) -> FlowView:
        return self._run(calls.get(flow_id))

    def wait(self, flow_id: str, timeout: float = 30.0, *, states: Collection[FlowState] = STOPPED) -> FlowView:
        """Poll the flow (50 ms growing to 1 s) until it is in ``states`` (stopped: finished or needing a
        person, as ``Engine.wait``); TimeoutError after ``timeout`` seconds."""
        return self._finish(calls.wait(flow_id, timeout, states, self.clock))

    def list_flows(
        self,
        *,
        state: FlowState | str | None = None,
        kind: str | None = None,
        since: When | None = None,
        limit: int = 50,
        after: str | None = None,
        terminal: str | None = None,
    ) -> FlowList:
        """One page, newest first; its ``next`` is the ``after`` of the following page (None: the last)."""
        return self._run(calls.list_flows(state=state, kind=kind, since=since, limit=limit, after=after, terminal=terminal))

    def iter_flows(
        self,
        *,
        state: FlowState | str | None = None,
        kind: str | None = None,
        since: When | None = None,
        page: int = 100,
        terminal: str | None = None,
    ) -> Iterator[FlowBrief]:
        """Every flow, page after page by the cursor: flows started meanwhile neither repeat nor hide one."""
        first = calls.list_flows(state=state, kind=kind, since=since, limit=page, after=None, terminal=terminal)
        return self._stream(calls.every_flow(first))

    def history(self, flow_id: str) -> History:
        return self._run(calls.history(flow_id))

    def signal(self, flow_id: str, name: str, payload: Body | None = None) -> SignalAnswer:
        return self._run(calls.signal(flow_id, name, payload))

    def cancel(self, flow_id: str, reason: str | None = None) -> FlowView:
        """Cancel (its ``state`` says whether at once, or ``cancel_requested`` while money may be in flight)."""
        return self._run(calls.cancel(flow_id, reason))

    def retry(self, flow_id: str) -> FlowView:
        return self._run(calls.retry(flow_id))

    def refund_late_payment(self, flow_id: str, reason: str | None = None) -> FlowView:
        return self._run(calls.refund_late_payment(flow_id, reason))

    def keep_late_payment(self, flow_id: str) -> FlowView:
        return self._run(calls.keep_late_payment(flow_id))

    # -- schedules ------------------------------------------------------------------------------

    def create_schedule(self, input: Body, *, key: str | None = None) -> ScheduleView:
        return self._run(calls.create_schedule(input, key=key))

    def list_schedules(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> ScheduleList:
        return self._run(calls.list_schedules(state=state, limit=limit, offset=offset))

    def get_schedule(self, schedule_id: str) -> ScheduleView:
        return self._run(calls.schedule(calls.GET_SCHEDULE, schedule_id))

    def schedule_history(self, schedule_id: str) -> History:
        return self._run(calls.schedule(calls.SCHEDULE_HISTORY, schedule_id))

    def change_schedule_amount(self, schedule_id: str, amount: int) -> ScheduleView:
        return self._run(calls.schedule(calls.CHANGE_SCHEDULE, schedule_id, {"amount": amount}))

    def pause_schedule(self, schedule_id: str) -> ScheduleView:
        return self._run(calls.schedule(calls.PAUSE_SCHEDULE, schedule_id))

    def resume_schedule(self, schedule_id: str) -> ScheduleView:
        return self._run(calls.schedule(calls.RESUME_SCHEDULE, schedule_id))

    def cancel_schedule(self, schedule_id: str, reason: str | None = None) -> ScheduleView:
        return self._run(calls.schedule(calls.CANCEL_SCHEDULE, schedule_id, calls.some(reason=reason) or None))

    def resolve_schedule(
        self, schedule_id: str, occurrence: str, outcome: str, *, operation_id: str | None = None
    ) -> ScheduleView:
        resolution = calls.some(occurrence=occurrence, outcome=outcome, operationId=operation_id)
        return self._run(calls.schedule(calls.RESOLVE_SCHEDULE, schedule_id, resolution))

    def delete_schedule(self, schedule_id: str) -> ScheduleView:
        return self._run(calls.schedule(calls.DELETE_SCHEDULE, schedule_id))

    # -- webhook endpoints ----------------------------------------------------------------------

    def create_endpoint(self, url: str, *, events: Collection[str] = (), description: str | None = None) -> EndpointWithSecret:
        """Add an endpoint; the answer carries its secret, shown this once. Never retried (no key)."""
        return self._run(calls.create_endpoint(url, events, description))

    def list_endpoints(self) -> EndpointList:
        return self._run(calls.LIST_ENDPOINTS.call())

    def get_endpoint(self, endpoint_id: str) -> EndpointView:
        return self._run(calls.endpoint(calls.GET_ENDPOINT, endpoint_id))

    def delete_endpoint(self, endpoint_id: str) -> EndpointView:
        return self._run(calls.endpoint(calls.DELETE_ENDPOINT, endpoint_id))

    def rotate_endpoint_secret(self, endpoint_id: str) -> EndpointWithSecret:
        return self._run(calls.endpoint(calls.ROTATE_SECRET, endpoint_id))

    def enable_endpoint(self, endpoint_id: str) -> EndpointView:
        return self._run(calls.endpoint(calls.ENABLE_ENDPOINT, endpoint_id))

    def test_endpoint(self, endpoint_id: str) -> TestAnswer:
        return self._run(calls.endpoint(calls.TEST_ENDPOINT, endpoint_id))

    def endpoint_attempts(self, endpoint_id: str, *, limit: int = 50) -> AttemptList:
        return self._run(calls.endpoint(calls.ENDPOINT_ATTEMPTS, endpoint_id, {"limit": limit}))

    def deliver_now(self, endpoint_id: str) -> WebhookDueNow:
        """Make the endpoint's pending deliveries that wait for a later retry due now (after its outage)."""
        return self._run(calls.endpoint(calls.DELIVER_NOW, endpoint_id))

    # -- events ---------------------------------------------------------------------------------

    def events(
        self, *, after: str | None = None, types: Collection[str] | None = None, limit: int = 100, wait: float = 0.0
    ) -> EventPage:
        """One page of the feed after the cursor ``after``; ``wait``: long-poll up to that many seconds (at most 30)."""
        return self._run(calls.events(after=after, types=types, limit=limit, wait=wait))

    def iter_events(
        self,
        *,
        after: str | None = None,
        types: Collection[str] | None = None,
        limit: int = 100,
        wait: float = 25.0,
        until_idle: bool = False,
    ) -> EventStream:
        """The feed from ``after`` on, event by event, long-polling ``wait`` seconds per read; it follows
        the feed until you stop, or (``until_idle``) up to the first empty read. Its ``cursor`` resumes it."""
        return EventStream(self, Feed(after, types, limit, wait, until_idle, self.clock))

    def replay_events(
        self,
        *,
        after: str | None = None,
        until: float | None = None,
        endpoint: str | None = None,
        types: Collection[str] | None = None,
    ) -> ReplayAnswer:
        return self._run(calls.replay(after=after, until=until, endpoint=endpoint, types=types))

    # -- flow kinds (pauses) and bulk actions --------------------------------------------------------

    def kinds(self) -> KindList:
        """Every flow kind, with its pause when paused."""
        return self._run(calls.LIST_KINDS.call())

    def pause_kind(self, kind: str, reason: str, *, by: str | None = None) -> KindView:
        """Pause a flow kind: none of its flows runs a step until it is resumed (a pause in force stands)."""
        return self._run(calls.pause_kind(kind, reason, by))

    def resume_kind(self, kind: str, *, by: str | None = None) -> KindView:
        """Resume a paused flow kind; ``released``: the flows it held that go on now."""
        return self._run(calls.resume_kind(kind, by))

    def pauses(self, *, limit: int = 100) -> PauseLog:
        """The audit list of pauses and resumes, newest first."""
        return self._run(calls.PAUSES.call(params={"limit": limit}))

    def bulk_dry_run(self, action: str, **filters: Any) -> BulkPlan:
        """What a bulk ``retry`` or ``cancel`` of the flows matching ``filters`` (kind, state, error, since,
        until) would do: the count, a sample with each flow's money, the money at stake by currency
        (``totals``), what it would skip and why. Changes no flow; the flows it lists are kept an hour for
        its confirmation (:meth:`confirm_bulk`)."""
        return self._run(calls.bulk(calls.BULK_DRY_RUN, action, filters))

    def bulk(self, action: str, *, plan: str | None = None, key: str | None = None, **filters: Any) -> BulkView:
        """Retry or cancel every flow matching ``filters``, in the background: the action with its progress.
        ``plan``: the dry run's (:meth:`bulk_dry_run`'s ``plan``) this action confirms, with the same action
        and filters (otherwise a 409): it acts on the flows that dry run listed, each only if unchanged since
        (:meth:`confirm_bulk` sends them for you); the same ``plan`` (or ``key``) again answers the same
        action; with neither, each call is a new action on the flows matching then."""
        return self._run(calls.bulk(calls.POST_BULK, action, {**filters, "plan": plan}, key=key))

    def confirm_bulk(self, plan: BulkPlan, *, by: str | None = None, key: str | None = None) -> BulkView:
        """Confirm a dry run (:meth:`bulk_dry_run`'s answer): its action on the flows it listed, each only if
        unchanged since (skipped as ``changed`` otherwise); confirmed again, the same action. A 409 once the
        dry run is no longer kept (an hour): make a new one."""
        return self._run(calls.confirm_bulk(plan, by=by, key=key))

    def bulk_actions(self, *, limit: int = 50) -> BulkList:
        return self._run(calls.LIST_BULK.call(params={"limit": limit}))

    def get_bulk(self, bulk_id: str) -> BulkView:
        return self._run(calls.GET_BULK.call(path={"bulk_id": bulk_id}))

    # -- reconciliation and operations ----------------------------------------------------------

    def reconcile(self, *, since: When | None = None, until: When | None = None) -> ReconciliationReport:
        """Start a reconciliation of the window (in the background: the report answers ``running``)."""
        return self._run(calls.reconcile(since, until))

    def reconciliation_reports(self) -> ReconciliationList:
        return self._run(calls.LIST_REPORTS.call())

    def latest_reconciliation(self) -> ReconciliationReport:
        return self._run(calls.LATEST_REPORT.call())

    def reconciliation_report(self, report_id: str) -> ReconciliationReport:
        return self._run(calls.report(report_id))

    def healthz(self) -> Health:
        return self._run(calls.HEALTHZ.call())

    def readyz(self) -> Readiness:
        """Readiness, ready or not (a 503 answers the failing checks; it is not an error here)."""
        return self._run(calls.READYZ.call())

    def metrics(self) -> str:
        return self._run(calls.METRICS.call())
