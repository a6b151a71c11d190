"""``/webhooks`` (endpoints, their attempts, test sends) and ``/events`` (the pull feed, replay).

Endpoints: ``POST /webhooks`` answers the endpoint *with its secret* (the only time it is shown, with
``rotate``); the rest never show it. ``GET /events?after=<cursor>&types=...&wait=<s>`` is the feed for
merchants who cannot receive webhooks: each page answers ``next``, the cursor to resume from (any
cursor, any time within the retention); with ``wait`` the call long-polls, answering as soon as an
event comes or after ``wait`` seconds (at most 30) with an empty page.
"""

from __future__ import annotations

import functools
import time
from typing import Annotated, Any, Literal

import anyio
from anyio.to_thread import run_sync
from fastapi import APIRouter, Body, Path, Query
from pydantic import Field

from durapay.gateway import StrictInput, StrictModel
from durapay.service.errors import ERRORS, invalid, not_found
from durapay.service.schemas import (
    AttemptList,
    EndpointList,
    EndpointView,
    EndpointWithSecret,
    EventPage,
    ReplayAnswer,
    TestAnswer,
    WebhookDueNow,
)
from durapay.workflows.engine import EVENT_TYPES, Cursor, EventFeed
from durapay.workflows.webhooks import EndpointError, Webhooks

EventType = Literal[EVENT_TYPES]  # type: ignore[valid-type]
EndpointId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^we_[A-Za-z0-9_]+$")]
CURSOR = r"^[a-z][0-9]{1,4}=[0-9]{1,20}-[0-9]{1,20}(\.[a-z][0-9]{1,4}=[0-9]{1,20}-[0-9]{1,20})*$"
#: The longest long-poll (seconds): below the usual proxy idle timeouts.
MAX_WAIT = 30.0
POLL = 0.1


class EndpointInput(StrictModel):
    url: str = Field(
        min_length=8,
        max_length=2000,
        pattern=r"^https?://[^\s/@]+(/\S*)?$",
        description="https:// URL; no loopback or private address (unless DURAPAY_WEBHOOKS__ALLOW_PRIVATE)",
    )
    events: list[EventType] = Field(default_factory=list, max_length=len(EVENT_TYPES), description="types sent; empty: all")
    description: str = Field(default="", max_length=500)


class ReplayInput(StrictModel):
    after: str | None = Field(default=None, max_length=100_000, pattern=CURSOR, description="cursor: replay what follows it")
    until: float | None = Field(default=None, ge=0, description="POSIX seconds: replay events up to this time")
    endpoint: str | None = Field(default=None, max_length=64, pattern=r"^we_[A-Za-z0-9_]+$", description="only this endpoint")
    types: list[EventType] = Field(default_factory=list, max_length=len(EVENT_TYPES))


def webhooks_router(webhooks: Webhooks) -> APIRouter:
    router = APIRouter(prefix="/webhooks", tags=["webhooks"], responses=ERRORS)
    store = webhooks.endpoints

    def found(endpoint: Any, endpoint_id: str) -> Any:
        if endpoint is None:
            raise not_found(f"no webhook endpoint {endpoint_id!r}")
        return endpoint

    @router.post("", status_code=201, response_model=EndpointWithSecret, summary="Add an endpoint (answers its secret)")
    def add_endpoint(body: Annotated[EndpointInput, StrictInput(), Body()]) -> dict[str, Any]:
        try:
            endpoint = store.add(body.url, list(body.events), description=body.description)
        except EndpointError as exc:
            raise invalid(exc.field, exc.reason) from None
        return endpoint.view(with_secret=True)

    @router.get("", response_model=EndpointList, summary="List the endpoints (no secrets)")
    def list_endpoints() -> dict[str, Any]:
        return {"endpoints": [endpoint.view() for endpoint in store.all()], "pending": webhooks.pending()}

    @router.get("/{endpoint_id}", response_model=EndpointView, summary="One endpoint (no secret)")
    def get_endpoint(endpoint_id: EndpointId) -> dict[str, Any]:
        return dict(found(store.get(endpoint_id), endpoint_id).view())

    @router.delete("/{endpoint_id}", response_model=EndpointView, summary="Remove an endpoint (its pending deliveries dropped)")
    def remove_endpoint(endpoint_id: EndpointId) -> dict[str, Any]:
        endpoint = found(store.get(endpoint_id), endpoint_id)
        store.remove(endpoint_id)
        return dict(endpoint.view())

    @router.post(
        "/{endpoint_id}/rotate",
        response_model=EndpointWithSecret,
        summary="A new secret (answered); the old one stays valid for DURAPAY_WEBHOOKS__ROTATION_HOURS",
    )
    def rotate_secret(endpoint_id: EndpointId) -> dict[str, Any]:
        return dict(found(store.rotate(endpoint_id), endpoint_id).view(with_secret=True))

    @router.post(
        "/{endpoint_id}/enable", response_model=EndpointView, summary="Enable a disabled endpoint again; ends its failing streak"
    )
    def enable_endpoint(endpoint_id: EndpointId) -> dict[str, Any]:
        return dict(found(store.enable(endpoint_id), endpoint_id).view())

    @router.post(
        "/{endpoint_id}/test",
        response_model=TestAnswer,
        summary="Send a webhook.test event now (not retried); a 2xx ends the failing streak",
    )
    def test_endpoint(endpoint_id: EndpointId) -> dict[str, Any]:
        return dict(found(webhooks.test(endpoint_id), endpoint_id))

    @router.get("/{endpoint_id}/attempts", response_model=AttemptList, summary="The endpoint's latest attempts, newest first")
    def endpoint_attempts(endpoint_id: EndpointId, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> dict[str, Any]:
        found(store.get(endpoint_id), endpoint_id)
        return {"attempts": webhooks.attempts(endpoint_id, limit=limit)}

    @router.post(
        "/{endpoint_id}/deliver-now",
        response_model=WebhookDueNow,
        summary="Deliver what is pending now: the endpoint's deliveries waiting for a later retry are made due (at most 10,000)",
    )
    def deliver_now(endpoint_id: EndpointId) -> dict[str, Any]:
        found(store.get(endpoint_id), endpoint_id)
        return {"due_now": webhooks.deliver_now(endpoint_id)}

    return router


def events_router(webhooks: Webhooks, feed: EventFeed) -> APIRouter:
    router = APIRouter(prefix="/events", tags=["events"], responses=ERRORS)

    @router.get("", response_model=EventPage, summary="Events after a cursor, in order per partition (long-polls with wait)")
    async def read_events(
        after: Annotated[str | None, Query(max_length=100_000, pattern=CURSOR, description="the `next` of a page")] = None,
        types: Annotated[list[EventType] | None, Query(max_length=len(EVENT_TYPES), description="repeat for several")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT, description="seconds to wait for an event (long poll)")] = 0,
    ) -> dict[str, Any]:
        # async: a long poll waits without holding one of the server's threads; each read borrows one.
        try:
            cursor = Cursor.parse(after)
        except ValueError as exc:
            raise invalid("after", str(exc)) from None
        deadline = time.monotonic() + wait
        while True:
            page, following = await run_sync(functools.partial(feed.read, cursor, types=types or None, limit=limit))
            if page or time.monotonic() >= deadline:
                break
            cursor = following
            await anyio.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        resume = cursor
        events = []
        for event in page:
            resume = resume.after(event)
            events.append({**event.wire(), "cursor": resume.text()})
        return {"events": events, "next": following.text() or None}

    @router.post("/replay", response_model=ReplayAnswer, summary="Send a range of events again to the endpoints")
    def replay_events(body: Annotated[ReplayInput, StrictInput(), Body()]) -> dict[str, Any]:
        if body.endpoint is not None and webhooks.endpoints.get(body.endpoint) is None:
            raise not_found(f"no webhook endpoint {body.endpoint!r}")
        try:
            cursor = Cursor.parse(body.after)
        except ValueError as exc:
            raise invalid("after", str(exc)) from None
        count = webhooks.replay(cursor, until=body.until, endpoint_id=body.endpoint, types=body.types or None)
        return {"scheduled": count}

    return router
