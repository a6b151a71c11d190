"""The control API's routes, each declared once: what the HTTP client (``durapay.client``) sends.

Why a table: there are two clients (``Client`` and ``AsyncClient``) and some forty routes; writing each
route in each client is eighty near-identical methods that drift apart. Here each route is a
:class:`Route` (method, the path as the OpenAPI document writes it, the answer's model, whether the
server takes an ``Idempotency-Key``), and one plain function per client method turns its arguments
into a :class:`Call`: the path filled in, the query, the body, the headers and whether the call may be
sent again. The clients only run Calls. ``tests/test_client.py`` compares :data:`ROUTES` with the
app's OpenAPI document, so a route added to the API without a client method fails a test.

The longer conversations (waiting for a flow, every page of the flow list, following the event feed)
are *plans*: generators that yield Calls to run and :class:`Pause` to take and receive the answers,
with no I/O of their own, so that the sync and the async client drive the same plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from pydantic import BaseModel

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

#: Every route the client calls, in declaration order (:class:`Route` adds itself).
ROUTES: list[Route[Any]] = []
#: What a body may be: a mapping, or a model (its fields as set, by alias).
Body = Mapping[str, Any] | BaseModel
#: A time on the wire: POSIX seconds, an aware datetime, or the API's own text (``2h``, ``in 2h``, ISO 8601).
When = str | float | datetime


@dataclass(frozen=True)
class Route(Generic[T]):
    """One route of the control API. ``answer``: the model of a success's body (``str`` for a text
    answer); ``keyed``: it takes an ``Idempotency-Key``, and a call with one may be sent again;
    ``answers``: the statuses whose body is the answer (``/readyz`` answers its checks with 503 too)."""

    method: str
    path: str
    answer: type[T]
    keyed: bool = False
    answers: frozenset[int] = frozenset({200, 201, 202})

    def __post_init__(self) -> None:
        ROUTES.append(self)

    def call(
        self,
        *,
        path: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        key: str | None = None,
        hold: float = 0.0,
    ) -> Call[T]:
        """The call of this route: ``path`` fills the template, ``params`` without the ``None`` ones."""
        filled = self.path.format_map({name: quote(value, safe="") for name, value in (path or {}).items()})
        headers: tuple[tuple[str, str], ...] = ()
        if key is not None:
            assert self.keyed, f"{self.method} {self.path} takes no Idempotency-Key"
            headers = (("Idempotency-Key", key),)
        # GET only reads; a keyed call sent twice is answered by the first one (the server's rule).
        idempotent = self.method == "GET" or key is not None
        return Call(self, filled, query(params or {}), json, headers, idempotent, hold)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to make. ``hold``: seconds the server may hold its answer (``wait``: a long poll),
    added to the read timeout."""

    route: Route[T]
    path: str
    params: tuple[tuple[str, str], ...] = ()
    json: Any = None
    headers: tuple[tuple[str, str], ...] = ()
    idempotent: bool = False
    hold: float = 0.0

    def __str__(self) -> str:
        return f"{self.route.method} {self.path}"


@dataclass(frozen=True)
class Pause:
    """A plan's pause between two calls (the driver sleeps, or awaits)."""

    seconds: float


#: What a plan yields to its driver besides its items.
Step = Call[Any] | Pause


def query(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Query pairs: ``None`` left out, a list repeated (``types=a&types=b``), times as the API reads them."""
    pairs: list[tuple[str, str]] = []
    for name, value in params.items():
        values = value if isinstance(value, list | tuple) else [value]
        pairs += [(name, wire(item)) for item in values if item is not None]
    return tuple(pairs)


def wire(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, datetime):
        return value.isoformat()  # a naive one has no offset: the API refuses it, naming the parameter
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def body(value: Body | None) -> Any:
    """A body as JSON: a model's fields as the caller set them (by alias), a mapping as it is."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return None if value is None else dict(value)


def some(**fields: Any) -> dict[str, Any]:
    """A body of the fields given (``None``: left for the server's default)."""
    return {name: value for name, value in fields.items() if value is not None}


# -- flows ---------------------------------------------------------------------------------------

START = Route("POST", "/flows/{kind}", FlowView, keyed=True)
LIST_FLOWS = Route("GET", "/flows", FlowList)
GET_FLOW = Route("GET", "/flows/{flow_id}", FlowView)
FLOW_HISTORY = Route("GET", "/flows/{flow_id}/history", History)
SIGNAL = Route("POST", "/flows/{flow_id}/signals/{name}", SignalAnswer)
CANCEL = Route("POST", "/flows/{flow_id}/cancel", FlowView)
RETRY = Route("POST", "/flows/{flow_id}/retry", FlowView)
REFUND_LATE_PAYMENT = Route("POST", "/flows/{flow_id}/refund-late-payment", FlowView)
KEEP_LATE_PAYMENT = Route("POST", "/flows/{flow_id}/keep-late-payment", FlowView)


#: Seconds a start waits for the customer URL when the caller gives none: the API's own default
#: (DURAPAY_API__START_WAIT_SECONDS, 5). Always sent: the server's setting may be up to 60, and a wait
#: the client did not send is one its read timeout does not cover.
START_WAIT = 5.0


def start(
    kind: str,
    data: Body,
    *,
    key: str | None,
    run_at: When | None,
    wait: float,
    terminal: str | None = None,
    tenant: str | None = None,
) -> Call[FlowView]:
    params = {"run_at": run_at, "wait": wait, "terminal": terminal, "tenant": tenant}
    return START.call(path={"kind": kind}, params=params, json=body(data), key=key, hold=wait)


def get(flow_id: str) -> Call[FlowView]:
    return GET_FLOW.call(path={"flow_id": flow_id})


def list_flows(
    *,
    state: FlowState | str | None,
    kind: str | None,
    since: When | None,
    limit: int,
    after: str | None,
    terminal: str | None = None,
) -> Call[FlowList]:
    params = {"state": state, "kind": kind, "since": since, "limit": limit, "after": after, "terminal": terminal}
    return LIST_FLOWS.call(params=params)


def history(flow_id: str) -> Call[History]:
    return FLOW_HISTORY.call(path={"flow_id": flow_id})


def signal(flow_id: str, name: str, payload: Body | None) -> Call[SignalAnswer]:
    return SIGNAL.call(path={"flow_id": flow_id, "name": name}, json=body(payload))


def cancel(flow_id: str, reason: str | None) -> Call[FlowView]:
    return CANCEL.call(path={"flow_id": flow_id}, json=some(reason=reason) or None)


def retry(flow_id: str) -> Call[FlowView]:
    return RETRY.call(path={"flow_id": flow_id})


def refund_late_payment(flow_id: str, reason: str | None) -> Call[FlowView]:
    return REFUND_LATE_PAYMENT.call(path={"flow_id": flow_id}, json=some(reason=reason) or None)


def keep_late_payment(flow_id: str) -> Call[FlowView]:
    return KEEP_LATE_PAYMENT.call(path={"flow_id": flow_id})


# -- schedules -----------------------------------------------------------------------------------

CREATE_SCHEDULE = Route("POST", "/schedules", ScheduleView, keyed=True)
LIST_SCHEDULES = Route("GET", "/schedules", ScheduleList)
GET_SCHEDULE = Route("GET", "/schedules/{schedule_id}", ScheduleView)
SCHEDULE_HISTORY = Route("GET", "/schedules/{schedule_id}/history", History)
CHANGE_SCHEDULE = Route("PATCH", "/schedules/{schedule_id}", ScheduleView)
PAUSE_SCHEDULE = Route("POST", "/schedules/{schedule_id}/pause", ScheduleView)
RESUME_SCHEDULE = Route("POST", "/schedules/{schedule_id}/resume", ScheduleView)
CANCEL_SCHEDULE = Route("POST", "/schedules/{schedule_id}/cancel", ScheduleView)
RESOLVE_SCHEDULE = Route("POST", "/schedules/{schedule_id}/resolve", ScheduleView)
DELETE_SCHEDULE = Route("DELETE", "/schedules/{schedule_id}", ScheduleView)


def create_schedule(data: Body, *, key: str | None) -> Call[ScheduleView]:
    return CREATE_SCHEDULE.call(json=body(data), key=key)


def list_schedules(*, state: str | None, limit: int, offset: int) -> Call[ScheduleList]:
    return LIST_SCHEDULES.call(params={"state": state, "limit": limit, "offset": offset})


def schedule(route: Route[T], schedule_id: str, json: Any = None) -> Call[T]:
    """A call of one of the routes of one schedule (get, history, pause, resume, cancel, resolve, delete)."""
    return route.call(path={"schedule_id": schedule_id}, json=json)


# -- webhook endpoints and events ----------------------------------------------------------------

CREATE_ENDPOINT = Route("POST", "/webhooks", EndpointWithSecret)
LIST_ENDPOINTS = Route("GET", "/webhooks", EndpointList)
GET_ENDPOINT = Route("GET", "/webhooks/{endpoint_id}", EndpointView)
DELETE_ENDPOINT = Route("DELETE", "/webhooks/{endpoint_id}", EndpointView)
ROTATE_SECRET = Route("POST", "/webhooks/{endpoint_id}/rotate", EndpointWithSecret)
ENABLE_ENDPOINT = Route("POST", "/webhooks/{endpoint_id}/enable", EndpointView)
TEST_ENDPOINT = Route("POST", "/webhooks/{endpoint_id}/test", TestAnswer)
ENDPOINT_ATTEMPTS = Route("GET", "/webhooks/{endpoint_id}/attempts", AttemptList)
DELIVER_NOW = Route("POST", "/webhooks/{endpoint_id}/deliver-now", WebhookDueNow)
EVENTS = Route("GET", "/events", EventPage)
REPLAY = Route("POST", "/events/replay", ReplayAnswer)


def create_endpoint(url: str, events: Iterable[str], description: str | None) -> Call[EndpointWithSecret]:
    return CREATE_ENDPOINT.call(json=some(url=url, events=list(events), description=description))


def endpoint(route: Route[T], endpoint_id: str, params: Mapping[str, Any] | None = None) -> Call[T]:
    """A call of one of the routes of one endpoint (get, delete, rotate, enable, test, attempts, deliver now)."""
    return route.call(path={"endpoint_id": endpoint_id}, params=params)


def events(*, after: str | None, types: Collection[str] | None, limit: int, wait: float) -> Call[EventPage]:
    params = {"after": after, "types": list(types or ()), "limit": limit, "wait": wait or None}
    return EVENTS.call(params=params, hold=wait)


def replay(*, after: str | None, until: float | None, endpoint: str | None, types: Collection[str] | None) -> Call[ReplayAnswer]:
    return REPLAY.call(json=some(after=after, until=until, endpoint=endpoint, types=list(types or ()) or None))


# -- flow kinds (pauses) and bulk actions ------------------------------------------------------------

LIST_KINDS = Route("GET", "/kinds", KindList)
PAUSE_KIND = Route("POST", "/kinds/{kind}/pause", KindView)
RESUME_KIND = Route("POST", "/kinds/{kind}/resume", KindView)
PAUSES = Route("GET", "/pauses", PauseLog)
BULK_DRY_RUN = Route("POST", "/bulk/dry-run", BulkPlan)
POST_BULK = Route("POST", "/bulk", BulkView, keyed=True)
LIST_BULK = Route("GET", "/bulk", BulkList)
GET_BULK = Route("GET", "/bulk/{bulk_id}", BulkView)


def pause_kind(kind: str, reason: str, by: str | None) -> Call[KindView]:
    return PAUSE_KIND.call(path={"kind": kind}, json=some(reason=reason, by=by))


def resume_kind(kind: str, by: str | None) -> Call[KindView]:
    return RESUME_KIND.call(path={"kind": kind}, json=some(by=by))


def bulk(route: Route[T], action: str, filters: Mapping[str, Any], *, key: str | None = None) -> Call[T]:
    """A bulk action's dry run or post: ``filters`` = kind, state, error, since, until, by, and the post's
    ``plan`` (the dry run's token it confirms) (None: left out)."""
    times = {name: wire(value) for name in ("since", "until") if (value := filters.get(name)) is not None}
    return route.call(json=some(action=action, **{**dict(filters), **times}), key=key)


def confirm_bulk(plan: BulkPlan, *, by: str | None = None, key: str | None = None) -> Call[BulkView]:
    """The action a dry run names: its action, its filter as it was asked and its ``plan``, so that the
    confirmation is of exactly that dry run (the server acts on the flows it listed, each as shown)."""
    return POST_BULK.call(json=some(action=plan.action, **dict(plan.asked), by=by, plan=plan.plan), key=key)


# -- reconciliation and operations ---------------------------------------------------------------

LIST_REPORTS = Route("GET", "/reconciliation/reports", ReconciliationList)
RUN_REPORT = Route("POST", "/reconciliation/reports", ReconciliationReport)
LATEST_REPORT = Route("GET", "/reconciliation/reports/latest", ReconciliationReport)
GET_REPORT = Route("GET", "/reconciliation/reports/{report_id}", ReconciliationReport)
HEALTHZ = Route("GET", "/healthz", Health)
READYZ = Route("GET", "/readyz", Readiness, answers=frozenset({200, 503}))
METRICS = Route("GET", "/metrics", str)


def reconcile(since: When | None, until: When | None) -> Call[ReconciliationReport]:
    return RUN_REPORT.call(json=some(since=None if since is None else wire(since), until=None if until is None else wire(until)))


def report(report_id: str) -> Call[ReconciliationReport]:
    return GET_REPORT.call(path={"report_id": report_id})


# -- plans ---------------------------------------------------------------------------------------

#: How a wait polls: 50 ms at first, growing by half each time to a second (a flow's steps take from
#: milliseconds to minutes; a second's delay in seeing the end costs nothing, a tight loop costs the API).
FIRST_POLL, LAST_POLL = 0.05, 1.0


#: A monotonic clock in seconds; the clients pass theirs (``clock=``) to the plans.
Clock = Callable[[], float]


def wait(
    flow_id: str, timeout: float, states: Collection[FlowState] = STOPPED, clock: Clock = time.monotonic
) -> Generator[Step, Any, FlowView]:
    """Read the flow until it is in one of ``states`` (by default stopped: finished or waiting for a
    person, as ``Engine.wait``); TimeoutError after ``timeout`` seconds (of ``clock``)."""
    deadline = clock() + timeout
    pause = FIRST_POLL
    while True:
        view: FlowView = yield get(flow_id)
        if view.state in states:
            return view
        left = deadline - clock()
        if left <= 0:
            raise TimeoutError(f"flow {flow_id} still {view.state!s} at step {view.step} after {timeout:g}s")
        yield Pause(min(pause, left))
        pause = min(pause * 1.5, LAST_POLL)


def every_flow(first: Call[FlowList]) -> Generator[Step | FlowBrief, Any, None]:
    """Every flow of every page, following each page's ``next`` until the end."""
    call = first
    seen: str | None = None
    while True:
        page: FlowList = yield call
        yield from page.flows
        if page.next is None:
            return
        if page.next == seen:  # a cursor that does not move would read the same page forever
            raise RuntimeError(f"the API answered the same cursor twice ({page.next!r}); stopping")
        seen = page.next
        call = LIST_FLOWS.call(params={**dict(first.params), "after": page.next})


class Feed:
    """The event feed read page after page from a cursor, keeping it: :attr:`cursor` is the position
    after the last event handed out (persist it, and resume with ``after=cursor``). ``wait``: each read
    long-polls up to that many seconds (the API's bound is 30); ``until_idle``: stop at the first empty
    page (read up to now) instead of following the feed.

    Following, an empty read is repeated no sooner than a pause after the previous one began (50 ms,
    growing by half at each empty read to a second; back to 50 ms once events come): a long poll
    already waited that long and goes on at once, but without one (``wait=0``, or a server or proxy
    that answers at once) the follower would read as fast as the API answers. The pauses are counted on
    ``clock`` (the client's), so that a test given its own clock knows each pause asked for exactly."""

    def __init__(
        self,
        after: str | None,
        types: Collection[str] | None,
        limit: int,
        wait: float,
        until_idle: bool,
        clock: Clock = time.monotonic,
    ) -> None:
        self.cursor = after
        self.clock = clock
        self.types = list(types or ())
        self.limit = limit
        self.wait = wait
        self.until_idle = until_idle

    def plan(self) -> Generator[Step | EventView, Any, None]:
        pause = FIRST_POLL
        while True:
            began = self.clock()
            page: EventPage = yield events(after=self.cursor, types=self.types, limit=self.limit, wait=self.wait)
            for event in page.events:
                self.cursor = event.cursor  # before handing it out: handled, then saved, is past it
                yield event
            self.cursor = page.next or self.cursor
            if page.events:
                pause = FIRST_POLL
                continue
            if self.until_idle:
                return
            yield Pause(max(0.0, pause - (self.clock() - began)))
            pause = min(pause * 1.5, LAST_POLL)
