"""``durapay.client.Client`` against the real API (uvicorn, Valkey, a Celery worker, the simulator):
every route of the OpenAPI document is a call of the client, and every call is sent by a method;
idempotent starts, paging by the cursor, the API's problem as an ApiError, retries after real
transport failures (a proxy that drops or swallows), the event feed resumed from its cursor, a start
the API holds for its configured wait. What the real API never answers (a proxy's HTML page, a garbled
body, a newer server's states and fields, an idle feed answered at once) comes from an
``httpx.MockTransport``."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import durapay
import durapay.client
from bench._webhook_receiver import WebhookReceiver
from durapay import _calls
from durapay.client import ApiError, Client, EventPage, EventView, Retries
from durapay.gateway import Unknown
from durapay.service.runtime import Runtime
from durapay.service.server import ApiServer
from durapay.workflows.engine.states import FlowState
from durapay.workflows.listing import BadCursor
from tests.client_support import API_KEY, ClientStack, FlakyProxy, Recording, client_stack, idle_api  # noqa: F401
from tests.ids import unique
from tests.waiting import wait_until
from tests.workflows.integration.test_flows import card, order, session

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]

SCHEDULE = {
    "contractId": "ct-client-1",
    "amount": 1500,
    "currency": "EUR",
    "description": "client test, monthly",
    "rule": {"every": "month", "day": 15},
    "start": "2031-01-15",
}


def quick(url: str, key: str = API_KEY, **options: Any) -> Client:
    """A client with quick retries (the default pauses up to seconds), seeded: the same pauses every run."""
    return Client(url, key, retries=Retries(attempts=3, base=0.01, cap=0.05, rng=random.Random(5)), **options)


def moto(**extra: Any) -> dict[str, Any]:
    return {"order": order(), "card": card(), **extra}


@pytest.fixture
def api(client_stack: ClientStack) -> Iterator[Client]:  # noqa: F811
    with quick(client_stack.url) as client:
        yield client


def documented_routes(stack: ClientStack) -> dict[tuple[str, str], str]:
    """(method, path) -> the answer's model name, of every operation in the app's OpenAPI document, with
    the concrete paths written as the client's templates: one start route per flow kind is
    ``/flows/{kind}``, one route per signal ``/flows/{flow_id}/signals/{name}``. The gateway's
    notification receiver is not the control API (the gateway calls it, not a merchant)."""
    document = httpx.get(f"{stack.url}/openapi.json", timeout=10).json()
    kinds = set(stack.engine.registry)
    found: dict[tuple[str, str], str] = {}
    for path, operations in document["paths"].items():
        if path == stack.runtime.settings.receiver.path:
            continue
        parts = path.split("/")
        if len(parts) == 3 and parts[1] == "flows" and parts[2] in kinds:
            path = "/flows/{kind}"
        elif re.fullmatch(r"/flows/\{flow_id\}/signals/[^/{}]+", path):
            path = "/flows/{flow_id}/signals/{name}"
        for method, operation in operations.items():
            success = next(answer for status, answer in operation["responses"].items() if status.startswith("2"))
            content = success.get("content", {})
            schema = content.get("application/json", {}).get("schema", {})
            found[(method.upper(), path)] = schema.get("$ref", "").rsplit("/", 1)[-1] or "str"
    return found


def test_every_route_of_the_api_document_is_a_call_of_the_client(client_stack: ClientStack) -> None:  # noqa: F811
    documented = documented_routes(client_stack)
    declared = {(route.method, route.path): route.answer.__name__ for route in _calls.ROUTES}
    assert len(declared) == len(_calls.ROUTES), "a route declared twice"
    assert sorted(set(documented) - set(declared)) == [], "routes of the API the client has no call for"
    assert sorted(set(declared) - set(documented)) == [], "calls of the client the API does not document"
    assert declared == documented, "the client reads an answer as another model than the API documents"


def template_of(method: str, path: str) -> tuple[str, str]:
    """The declared route a request went to (the most specific template that fits its path)."""
    fitting = [
        route
        for route in _calls.ROUTES
        if route.method == method and re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", route.path), path)
    ]
    assert fitting, f"{method} {path} is no declared route"
    best = min(fitting, key=lambda route: route.path.count("{"))
    return best.method, best.path


def test_every_call_is_sent_by_a_method_of_the_client(client_stack: ClientStack) -> None:  # noqa: F811
    """A tour of the client's methods against the API; the transport notes what was sent. Together with
    the test above: a route of the API without a client method fails one of the two."""
    recording = Recording()
    with quick(client_stack.url, transport=recording) as api, WebhookReceiver() as receiver:
        tour(api, receiver)
    sent = {template_of(method, path) for method, path in recording.sent}
    assert sorted({(route.method, route.path) for route in _calls.ROUTES} - sent) == [], "calls no method sends"


def refused(status: int, call: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args, **kwargs)
    assert caught.value.status == status, str(caught.value)
    return caught.value


def tour(api: Client, receiver: WebhookReceiver) -> None:
    flow = api.start("moto", moto(), key=unique("tour"))
    done = api.wait(flow.id, timeout=30)
    assert done.state is FlowState.SUCCEEDED, done
    assert api.get(flow.id).id == flow.id and api.history(flow.id).history
    assert any(brief.id == flow.id for brief in api.iter_flows(page=10))
    assert api.list_flows(kind="moto", limit=1).flows
    later = api.start("moto", moto(), run_at="in 1h")
    assert refused(422, api.signal, later.id, "3ds_result", {"threeDSAuthResponse": "x"}).field
    assert api.cancel(later.id, "the customer left").state is FlowState.CANCELLED
    refused(409, api.retry, later.id)
    refused(409, api.refund_late_payment, later.id)
    refused(409, api.keep_late_payment, later.id)

    schedule = api.create_schedule(SCHEDULE, key=unique("tour"))
    assert api.get_schedule(schedule.id).amount == 1500 and api.schedule_history(schedule.id).history
    assert any(item.id == schedule.id for item in api.list_schedules(limit=500).schedules)
    assert api.change_schedule_amount(schedule.id, 1990).amount == 1990
    assert api.pause_schedule(schedule.id).state == "paused" and api.resume_schedule(schedule.id).state == "active"
    refused(409, api.resolve_schedule, schedule.id, "2031-01-15T00:00:00Z", "not_charged")
    assert api.cancel_schedule(schedule.id, "tour over").state == "cancelled"
    refused(409, api.delete_schedule, schedule.id)

    endpoint = api.create_endpoint(receiver.url, events=["flow.succeeded"], description="tour")
    receiver.secrets = [endpoint.secret]
    assert any(item.id == endpoint.id for item in api.list_endpoints().endpoints)
    assert api.get_endpoint(endpoint.id).url == receiver.url
    assert api.test_endpoint(endpoint.id).ok and api.endpoint_attempts(endpoint.id, limit=5).attempts
    assert api.deliver_now(endpoint.id).due_now == 0  # nothing of it waits for a retry
    assert api.rotate_endpoint_secret(endpoint.id).secret != endpoint.secret
    assert api.enable_endpoint(endpoint.id).enabled
    page = api.events(types=["flow.succeeded"], limit=1)
    assert page.events[0].id not in {event.id for event in api.iter_events(after=page.next, until_idle=True, wait=0)}
    assert api.replay_events(endpoint=endpoint.id, types=["flow.succeeded"]).scheduled >= 1
    assert api.delete_endpoint(endpoint.id).id == endpoint.id

    paused = api.pause_kind("wallet", "tour", by="tourist")
    assert paused.paused and paused.pause is not None and paused.pause.by == "api:tourist"
    assert next(kind for kind in api.kinds().kinds if kind.kind == "wallet").paused
    assert api.resume_kind("wallet").released == 0 and api.pauses(limit=2).pauses[0].action == "resume"
    assert refused(404, api.pause_kind, "walet", "typo").reason.count("did you mean `wallet`")
    # a bulk retry of cancelled flows: each is skipped with the engine's reason (a cancelled flow is not retried)
    filters = {"kind": "moto", "state": "cancelled", "since": "1h"}
    plan = api.bulk_dry_run("retry", **filters)
    assert plan.count >= 1 and plan.would_skip == plan.count and plan.totals == {}, "a flow it skips is not at stake"
    assert plan.sample[0].amount is not None and plan.sample[0].currency
    # the plan names its dry run's action and filter: for another filter or action it is refused
    assert "was made for retry of" in refused(409, api.bulk, "retry", plan=plan.plan, kind="moto").reason
    refused(409, api.bulk, "cancel", plan=plan.plan, **filters)
    action = api.confirm_bulk(plan, key=unique("tour"))
    assert action.total == plan.count
    wait_until(lambda: api.get_bulk(action.id).status == "done", 30, "the bulk action to finish")
    assert api.get_bulk(action.id).skipped == action.total and api.bulk_actions().bulk[0].id == action.id

    report = api.reconcile(since="1h")
    wait_until(lambda: not api.reconciliation_report(report.id).running, 30, "the reconciliation to finish")
    assert api.latest_reconciliation().id == report.id
    assert any(item.id == report.id for item in api.reconciliation_reports().reports)
    assert api.healthz().status == "ok" and set(api.readyz().checks) >= {"redis"}
    assert "durapay_flows" in api.metrics()


def test_a_start_with_a_key_twice_is_one_flow(api: Client) -> None:
    data = moto()
    key = unique("twice")
    first = api.start("moto", data, key=key)
    again = api.start("moto", data, key=key)
    assert again.id == first.id and again.start_key == key
    conflict = refused(409, api.start, "moto", moto(), key=key)
    assert conflict.error == "conflict" and not conflict.retryable


def test_paging_through_every_flow_neither_repeats_nor_skips_while_flows_start(api: Client) -> None:
    later = time.time() + 3600  # sleeping flows: they hold still
    ours = [api.start("moto", moto(), run_at=later).id for _ in range(5)]
    first = api.list_flows(limit=2)
    assert len(first.flows) == 2 and first.next is not None
    assert api.list_flows(limit=2, after=first.next).flows[0].id not in {brief.id for brief in first.flows}
    flows = api.iter_flows(page=2)
    seen = [next(flows).id for _ in range(3)]  # two pages read
    new = {api.start("moto", moto(), run_at=later).id for _ in range(3)}
    seen += [brief.id for brief in flows]
    assert len(seen) == len(set(seen)), "a flow seen twice"
    assert set(ours) <= set(seen) and not new & set(seen), "every flow once, none started after the first page"


def test_the_apis_problem_is_an_api_error(api: Client) -> None:
    typo = refused(422, api.start, "moto", moto(captureTyp="EXPLICIT"))
    assert (typo.error, typo.field) == ("invalid_input", "captureTyp") and "did you mean `captureType`?" in typo.reason
    assert not typo.retryable and str(typo).startswith("POST /flows/moto: 422 invalid_input (captureTyp): ")
    missing = refused(404, api.get, "fnothere")
    assert (missing.error, missing.reason, missing.field, missing.retryable) == ("not_found", "no flow 'fnothere'", None, False)
    cursor = refused(422, api.list_flows, after="yesterday:f1")
    assert cursor.field == "query.after" and "not a time" in cursor.reason
    assert refused(404, api.start, "motto", moto()).reason.startswith("no flow kind 'motto'; did you mean `moto`?")


def test_a_start_names_its_tenant(client_stack: ClientStack) -> None:  # noqa: F811
    with quick(client_stack.url) as api:
        flow = api.start("moto", moto(), run_at="in 1h", tenant="acme")
        assert client_stack.engine.get(flow.id).fields["tenant"] == "acme"
        assert refused(422, api.start, "moto", moto(), run_at="in 1h", tenant="no spaces").field == "query.tenant"


def test_a_wrong_key_is_refused(client_stack: ClientStack) -> None:  # noqa: F811
    with quick(client_stack.url, "wrong-key") as stranger:
        assert refused(401, stranger.get, "f1").error == "unauthorized"


def test_a_get_is_tried_again_after_a_transport_failure_and_a_post_without_key_never(client_stack: ClientStack) -> None:  # noqa: F811
    flow = client_stack.engine.start("moto", moto(), run_at=time.time() + 3600)
    with FlakyProxy(client_stack.url, ["drop"]) as proxy, quick(proxy.url) as api:
        assert api.get(flow.id).id == flow.id
        assert proxy.connections == 2, "the dropped connection, then the retry"
    with FlakyProxy(client_stack.url, ["drop"]) as proxy, quick(proxy.url) as api:
        lost = refused_transport(api.start, "moto", moto())
        assert lost.retryable and lost.error == "transport" and proxy.connections == 1, "a start without a key is never resent"
    with FlakyProxy(client_stack.url, ["drop", "drop", "drop"]) as proxy, quick(proxy.url) as api:
        refused_transport(api.get, flow.id)
        assert proxy.connections == 3, "three attempts, then the error"


def test_a_keyed_start_whose_answer_was_lost_is_sent_again_and_starts_one_flow(client_stack: ClientStack) -> None:  # noqa: F811
    key = unique("lost")
    data = moto()
    with FlakyProxy(client_stack.url, ["swallow"]) as proxy, quick(proxy.url) as api:
        started = api.start("moto", data, key=key, run_at=time.time() + 3600)
        assert proxy.connections == 2, "the first answer was swallowed: the start was sent again"
    assert client_stack.engine.get(started.id).start_key == key
    created = [entry for entry in client_stack.engine.history(started.id) if entry.get("what", "").startswith("created")]
    assert len(created) == 1, "the flow was created once; the second start was answered with it"


def refused_transport(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    assert caught.value.status is None, str(caught.value)
    return caught.value


def test_the_event_stream_resumes_from_its_cursor_and_long_polls(api: Client, client_stack: ClientStack) -> None:  # noqa: F811
    tail = api.iter_events(types=["flow.created"], until_idle=True, wait=0)
    for _ in tail:  # read up to now: what follows is this test's
        pass
    later = time.time() + 3600
    started = [api.start("moto", moto(), run_at=later).id for _ in range(2)]
    stream = api.iter_events(after=tail.cursor, types=["flow.created"], wait=5)
    first = next(stream)
    saved = stream.cursor
    assert saved is not None and saved != tail.cursor
    resumed = api.iter_events(after=saved, types=["flow.created"], wait=5)
    second = next(resumed)
    assert sorted([first.model_extra["flow"], second.model_extra["flow"]]) == sorted(started)  # type: ignore[index]
    timer = threading.Timer(0.2, lambda: started.append(client_stack.engine.start("moto", moto(), run_at=later).id))
    timer.start()
    third = next(resumed)  # the long poll (5 s) answers with the event that came while it waited
    timer.join()
    assert third.model_extra["flow"] == started[2]  # type: ignore[index]


def test_wait_gives_up_at_its_timeout(client_stack: ClientStack) -> None:  # noqa: F811
    """Counted on the client's clock (the test's: each look at it moves it 0.1 s), never the machine's."""
    looks: list[int] = []

    def clock() -> float:
        looks.append(1)
        return 0.1 * len(looks)

    with quick(client_stack.url, clock=clock) as api:
        later = api.start("moto", moto(), run_at="in 1h")
        with pytest.raises(TimeoutError, match=f"flow {later.id} still sleeping"):
            api.wait(later.id, timeout=0.3)
    assert len(looks) <= 6, f"{len(looks)} looks at the clock: it did not give up at its timeout"


def test_retry_pauses_grow_are_jittered_bounded_and_only_for_idempotent_retryable_calls() -> None:
    rule = Retries(attempts=4, base=0.2, cap=0.5, rng=random.Random(3))
    get, post = _calls.get("f1"), _calls.cancel("f1", None)
    busy = ApiError(503, "unavailable", "try again")
    pauses = [rule.pause(get, busy, attempt) for attempt in (1, 2, 3)]
    assert [0.1 <= pauses[0] <= 0.2, 0.2 <= pauses[1] <= 0.4, 0.25 <= pauses[2] <= 0.5] == [True] * 3, pauses  # type: ignore[operator]
    assert rule.pause(get, busy, 4) is None, "attempts used up"
    assert rule.pause(post, busy, 1) is None, "a cancel is never resent"
    assert rule.pause(get, ApiError(404, "not_found", "no flow"), 1) is None, "a refusal is not retried"
    assert rule.pause(get, ApiError(429, "rate_limited", "slow down", retry_after=0.4), 1) == pytest.approx(0.4)
    assert rule.pause(get, ApiError(429, "rate_limited", "slow down", retry_after=60), 1) == 0.5, "at most cap"
    keyed = _calls.start("moto", {}, key="k1", run_at=None, wait=_calls.START_WAIT)
    assert keyed.idempotent and not _calls.start("moto", {}, key=None, run_at=None, wait=_calls.START_WAIT).idempotent


def test_a_start_the_api_holds_longer_than_the_read_timeout_is_answered(idle_api: tuple[ApiServer, Runtime]) -> None:  # noqa: F811
    """The API waits 3 s for a customer URL by its setting (up to 60); the client's read timeout here is
    4 s. Without a `wait` of its own the client timed out on a start the API was answering (and, with
    no key, could not send it again); it sends its `start_wait`, and reads that much longer."""
    server, runtime = idle_api
    sent: list[httpx.Request] = []

    class Recording(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(request)
            return super().handle_request(request)

    # A read timeout of 4 s and a wait of 5 s: the API's answer comes a second past the read timeout,
    # and the client reads 4 s longer than the wait (a loaded machine answered 1.5 s late, with 1.5 s of margin).
    with quick(server.url, timeout=4.0, start_wait=5.0, transport=Recording()) as api:
        started = api.start("hpp", {"order": order(), "paymentSession": session()})
    # No worker runs it: the API held the start for the client's wait (5 s, past the 4 s read timeout,
    # which would have failed the call), not its own 3 s, and then answered; the client read for 9 s.
    [start] = [request for request in sent if request.method == "POST"]
    assert start.url.params["wait"] == "5.0", start.url
    assert start.extensions["timeout"]["read"] >= 4.0 + 5.0, start.extensions["timeout"]
    assert started.customer_url is None
    assert [record.id for record in runtime.engine.list(kind="hpp")] == [started.id]


def mocked(handler: Any, **options: Any) -> Client:
    return quick("http://api.test", transport=httpx.MockTransport(handler), **options)


FLOW = {
    "id": "f1",
    "kind": "moto",
    "state": "succeeded",
    "step": "pay",
    "version": 3,
    "attempt": 1,
    "created": 1.0,
    "updated": 2.0,
}


def test_a_proxys_page_or_a_garbled_body_is_an_api_error_saying_what_came() -> None:
    page = "<html>\n<head><title>502 Bad Gateway</title></head>\n<body><center>nginx</center></body></html>"
    calls: list[httpx.Request] = []

    def proxy(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(502, text=page, headers={"Content-Type": "text/html"})

    with mocked(proxy) as api:
        error = refused(502, api.get, "f1")
    assert (error.error, error.field, error.retryable, len(calls)) == ("unavailable", None, True, 3)
    assert error.reason == "HTTP 502 Bad Gateway, no JSON problem in the answer (text/html): 502 Bad Gateway nginx"
    with mocked(lambda request: httpx.Response(404)) as api:
        assert refused(404, api.get, "f1").reason == "HTTP 404 Not Found, no JSON problem in the answer (no content type) (empty)"

    def garbled(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        return httpx.Response(200, content=b"not gzip at all", headers=headers)

    with mocked(garbled) as api:
        broken = refused_transport(api.get, "f1")
    assert broken.error == "bad_answer" and "DecodingError" in broken.reason


def test_a_state_or_a_field_a_newer_server_adds_is_kept_never_read_as_a_known_one() -> None:
    def newer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/flows":
            brief = {key: FLOW[key] for key in ("id", "kind", "step", "created", "updated")}
            return httpx.Response(200, json={"flows": [{**brief, "state": "on_hold"}], "limit": 50, "next": None, "total": 7})
        if request.url.path == "/readyz":
            return httpx.Response(200, json={"ready": True, "checks": {"redis": True}, "region": "eu"})
        return httpx.Response(200, json={**FLOW, "state": "on_hold", "newField": 1})

    with mocked(newer) as api:
        view = api.get("f1")
        assert isinstance(view.state, Unknown) and view.state == "on_hold" and view.state not in set(FlowState)
        assert view.model_extra == {"newField": 1} and view.model_dump(mode="json")["state"] == "on_hold"
        page = api.list_flows()
        assert isinstance(page.flows[0].state, Unknown) and page.model_extra == {"total": 7}
        assert api.readyz().model_extra == {"region": "eu"}
        with pytest.raises(TimeoutError, match="still on_hold at step pay"):
            api.wait("f1", timeout=0.1)
    with mocked(lambda request: httpx.Response(200, json=FLOW)) as api:
        assert api.get("f1").state is FlowState.SUCCEEDED


class Idle:
    """An event feed with nothing new, answered at once; it stops the follower (:class:`Idle.Enough`) at
    its seventh read. The follower counts its pauses on :meth:`clock`, the test's, which only a read moves
    (by ``READ``, as a long poll's wait would): each pause it asks for is then known exactly, however
    loaded the machine. Each read notes when it began and ``ticker`` (the async twin's count of
    its other task's turns)."""

    #: What one read takes on the follower's clock.
    READ = 0.01

    class Enough(Exception):
        pass

    def __init__(self) -> None:
        self.now = 0.0
        self.reads: list[float] = []
        self.ticks: list[int] = []
        self.ticker = 0

    def clock(self) -> float:
        return self.now

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if len(self.reads) == 6:
            raise Idle.Enough
        self.reads.append(time.monotonic())
        self.ticks.append(self.ticker)
        self.now += Idle.READ
        return httpx.Response(200, json={"events": [], "next": "0-0", "limit": 100})

    def check(self) -> None:
        """The follower slept each pause it asked for: a sleep lasts at least what it is given (time.sleep
        and asyncio's timers alike, to the clock's resolution: the microsecond), so each gap between two
        reads is at least its pause. Sized on the machine's clock instead, a pause was shortened by the
        moments between the follower's reading of that clock and the transport's, which a loaded machine
        stretches (27 ms of a 50 ms pause once)."""
        asked = [0.05 * 1.5**n - Idle.READ for n in range(5)]  # 50 ms growing by half, less the read before
        gaps = [later - earlier for earlier, later in zip(self.reads, self.reads[1:], strict=False)]
        assert len(gaps) == 5, gaps
        assert all(gap >= pause - 1e-6 for gap, pause in zip(gaps, asked, strict=True)), (gaps, asked)


def test_following_an_idle_feed_without_a_long_poll_backs_off() -> None:
    idle = Idle()
    with mocked(idle, clock=idle.clock) as api, pytest.raises(Idle.Enough):
        next(api.iter_events(wait=0))
    idle.check()


def test_the_feed_pauses_after_an_empty_read_from_its_start_growing_by_half_to_a_second() -> None:
    """The follower's plan on the test's clock: after an empty read, a pause of 50 ms growing by half at
    each empty read up to a second, less what the read itself took (a long poll has waited already);
    back to 50 ms once events come; with ``until_idle``, no pause: the first empty read ends it."""
    now = 0.0
    empty = EventPage(events=[], next="0-0")
    event = EventView(id="e1", type="flow.created", timestamp="2026-11-26T00:00:00Z", data={}, cursor="1-0")

    def read(plan: Generator[Any, Any, None], took: float, page: EventPage) -> Any:
        """Answer the read the plan asked for, ``took`` seconds after it began; what the plan does next."""
        nonlocal now
        assert isinstance(plan.send(None), _calls.Call), "a read"
        now += took
        return plan.send(page)

    def pauses(plan: Generator[Any, Any, None], took: list[float]) -> list[float]:
        asked = []
        for seconds in took:
            pause = read(plan, seconds, empty)
            assert isinstance(pause, _calls.Pause), pause
            asked.append(pause.seconds)
        return asked

    following = _calls.Feed(None, None, 100, 0, until_idle=False, clock=lambda: now).plan()
    schedule = [min(0.05 * 1.5**n, 1.0) for n in range(10)]
    assert pauses(following, [0.0] * 10) == pytest.approx(schedule)
    assert pauses(following, [0.4, 2.0]) == pytest.approx([0.6, 0.0]), "a read's own time counts, never below 0"
    assert read(following, 0.0, EventPage(events=[event], next="1-0")) == event
    assert pauses(following, [0.0, 0.02]) == pytest.approx([0.05, 0.055]), "events came: 50 ms again"
    idle = _calls.Feed(None, None, 100, 0, until_idle=True, clock=lambda: now).plan()
    with pytest.raises(StopIteration):
        read(idle, 0.0, empty)


def test_the_client_exports_every_answer_model_and_loads_no_web_framework() -> None:
    """README points at durapay.client for the models its methods answer; they are the API's own
    (service/schemas.py: pydantic models, no FastAPI, as docs/architecture.md says)."""
    answers = {route.answer for route in _calls.ROUTES if route.answer is not str}
    assert {getattr(durapay.client, model.__name__, None) for model in answers} == answers
    assert {model.__name__ for model in answers} <= set(durapay.client.__all__)
    assert durapay.BadCursor is BadCursor and "BadCursor" in durapay.__all__, "what Engine.list raises is public"
    code = "import sys, durapay.client; print(sorted({'fastapi', 'starlette', 'uvicorn'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert (loaded.returncode, loaded.stdout.strip()) == (0, "[]"), loaded.stdout + loaded.stderr
