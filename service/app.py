"""The HTTP app: the notification receiver and the control API on one FastAPI application.

Why one app: the gateway's notifications and the merchant's control calls reach the same flows; one
process type (``durapay api``, one uvicorn worker per process, as many processes as needed) serves
both. Only the receiver path (and ``/healthz``, ``/docs``, ``/openapi.json``, which hold no data) is
open; every other route needs ``DURAPAY_API__KEY`` as ``X-Api-Key``, checked by ``service.guard`` before
any body is read, and takes a body of at most ``DURAPAY_API__MAX_BODY_BYTES``.

``/docs`` is served from the installed packages (Swagger UI's files ship in ``fastapi-offline``): it
loads nothing from another host, so it works offline and behind a strict proxy.

The web console (``service.console``) is served at ``/console`` by the same app: its pages check their
own session cookie, signed in with the same keys.

Build it with :func:`create_app` from a :class:`~service.runtime.Runtime`; there is no module-level app.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from durapay.service.api_bulk import bulk_router
from durapay.service.api_flows import flows_router
from durapay.service.api_kinds import kinds_router
from durapay.service.api_ops import ops_router
from durapay.service.api_receiver import receiver_router
from durapay.service.api_reconcile import reconcile_router
from durapay.service.api_webhooks import events_router, webhooks_router
from durapay.service.auth import api_key_scheme, bearer_scheme, require_key
from durapay.service.console import install_console
from durapay.service.console.session import PATH as CONSOLE
from durapay.service.errors import install_error_handlers
from durapay.service.guard import ControlGate
from durapay.service.query import refuse_unknown_query
from durapay.service.receiver import NotificationReceiver
from durapay.service.runtime import Runtime
from durapay.service.throttle import Limits, Throttle
from durapay.tasks.celery_tasks import CelerySender
from durapay.workflows.bulk import BulkActions

DESCRIPTION = """\
Durable payment flows against the payment gateway.

* **Notifications** (`POST {receiver}`, open): the gateway's server-to-server notifications; the
  security token is checked in constant time, a refusal is 401 whatever the reason.
* **Flows**: start one of any kind (`Idempotency-Key` makes the start idempotent), read, list, history,
  signal (`3ds_result`, `form_completed`), cancel, retry.
* **Schedules**: recurring MIT payments; create, read, list, pause, resume, change the amount, cancel.
* **Webhooks**: endpoints (Standard Webhooks signatures, `whsec_` secrets, rotation), their attempts,
  test sends. **Events**: the pull feed (`GET /events?after=<cursor>`, long-polling with `wait`), replay.
* **Kinds**: pause and resume a flow kind (a maintenance window: its flows wait), the audit list of pauses.
  **Bulk**: retry or cancel every flow a filter matches (a dry run first; the action runs in the background).
* **Operations**: `/healthz`, `/readyz`, `/metrics` (Prometheus text).

Every route but the receiver, `/healthz` and these docs needs `X-Api-Key` (or `Authorization: Bearer`),
checked before the body is read; bodies above `DURAPAY_API__MAX_BODY_BYTES` are refused with 413.
Inputs are read strictly: an unknown field or value is a 422 naming it (and the closest known name).
Bodies are UTF-8 JSON (RFC 8259 §8.1; anything else is a 415 naming the encoding), at most 32 levels deep;
no string holds a lone surrogate, none a control character but tab and line breaks in free text (never in
a key or an identifier), no number is beyond 64 bits or a double: a 422 naming the field (the
receiver's 400). Errors are `{"error", "reason"}` (+ `"field"` on 422); none repeats a card number.
"""

#: Where ``/docs`` finds Swagger UI's files (the ``fastapi-offline`` package ships them).
DOCS_ASSETS = "/docs/assets"
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect"})


def create_app(runtime: Runtime, *, insecure: bool = False, schedules: Any = None) -> FastAPI:
    """The app for ``runtime``. Raises ``service.auth.MissingApiKey`` when ``DURAPAY_API__KEY`` is empty
    unless ``insecure``. ``schedules`` (a ``workflows.schedules.Schedules``) adds ``/schedules``;
    by default one is built when the schedules module is present."""
    settings = runtime.settings
    key_ok = require_key(settings.api.key.get_secret_value(), insecure=insecure, keys=settings.api.keys)
    limits = Limits(settings.api.auth_failures, settings.api.auth_window_seconds, settings.api.auth_prefix_chars)
    throttle = Throttle(runtime.engine.redis, runtime.engine.keys, limits)
    app = FastAPI(
        # FastAPI's own server span of each request, on durapay's tracer provider when traces are on.
        telemetry=runtime.tracing.fastapi_telemetry(),  # type: ignore[arg-type]
        title="durapay",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        description=DESCRIPTION.replace("{receiver}", settings.receiver.path),
        openapi_tags=[
            {"name": "notifications", "description": "The gateway's notifications (open path)."},
            {"name": "flows", "description": "Payment flows."},
            {"name": "schedules", "description": "Recurring payments."},
            {"name": "webhooks", "description": "Webhook endpoints, their attempts, test sends."},
            {"name": "events", "description": "Merchant events: the pull feed (long-polling) and replay."},
            {"name": "reconciliation", "description": "The gateway's operations against the flows: reports."},
            {"name": "kinds", "description": "Flow kinds: pause and resume one (a maintenance window), the audit list."},
            {"name": "bulk", "description": "Retry or cancel every flow a filter matches: a dry run, then in the background."},
            {"name": "operations", "description": "Health, readiness, metrics."},
        ],
    )
    install_error_handlers(app)
    receiver = NotificationReceiver(runtime.engine, settings.receiver)
    app.state.receiver = receiver
    app.state.runtime = runtime
    app.include_router(receiver_router(receiver))
    # The schemes are declared for the OpenAPI document (ControlGate checks the key); query parameters
    # a route does not take are refused (service.query).
    protected = [Depends(api_key_scheme), Depends(bearer_scheme), Depends(refuse_unknown_query)]
    app.include_router(flows_router(runtime.engine, settings.api), dependencies=protected)
    if schedules is None:
        schedules = default_schedules(runtime)
    if schedules is not None:
        from durapay.service.api_schedules import schedules_router

        app.include_router(schedules_router(schedules), dependencies=protected)
    app.include_router(webhooks_router(runtime.webhooks), dependencies=protected)
    app.include_router(events_router(runtime.webhooks, runtime.webhooks.feed), dependencies=protected)
    app.include_router(reconcile_router(runtime.engine), dependencies=protected)
    app.include_router(kinds_router(runtime.engine), dependencies=protected)
    app.include_router(bulk_router(runtime.engine, bulk_actions(runtime)), dependencies=protected)
    app.include_router(ops_router(runtime.engine, protected))
    _offline_docs(app)
    install_console(
        app,
        runtime.engine,
        key_ok,
        hours=settings.api.console_session_hours,
        schedules=schedules,
        webhooks=runtime.webhooks,
        throttle=None if key_ok.open else throttle,
        bulk=bulk_actions(runtime),
    )

    def is_open(path: str) -> bool:
        # The console checks its own session cookie (same keys, same roles): see service.console.
        return (
            path in OPEN_PATHS
            or path == settings.receiver.path
            or path.startswith(DOCS_ASSETS + "/")
            or path == CONSOLE
            or path.startswith(CONSOLE + "/")
        )

    app.add_middleware(
        ControlGate,
        key_ok=key_ok,
        limit=settings.api.max_body_bytes,
        is_open=is_open,
        throttle=None if key_ok.open else throttle,
        own_body=lambda path: path == settings.receiver.path,
    )
    return app


def _offline_docs(app: FastAPI) -> None:
    """``/docs`` with Swagger UI's files served from the installed package: no request to another host."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return _unframed(
            get_swagger_ui_html(
                openapi_url="/openapi.json",
                title="durapay - API",
                swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
                oauth2_redirect_url="/docs/oauth2-redirect",
                swagger_ui_parameters={"validatorUrl": None},  # the online validator badge would call another host
            )
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def oauth2_redirect() -> HTMLResponse:
        return _unframed(get_swagger_ui_oauth2_redirect_html())


#: What every page the API serves besides the console's (whose own are stricter: ``console.web.HEADERS``)
#: is sent with: no other site may frame it (its "Authorize" form takes an API key: a framing page could
#: lure an operator into typing one), and no type is guessed.
FRAMING = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'", "X-Content-Type-Options": "nosniff"}


def _unframed(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(FRAMING)
    return page


def bulk_actions(runtime: Runtime) -> BulkActions:
    """The runtime's bulk actions (one built on its Celery app for a runtime assembled by hand)."""
    return runtime.bulk or BulkActions(runtime.engine, runtime.settings.bulk, send=CelerySender(runtime.celery).send_bulk)


def default_schedules(runtime: Runtime) -> Any:
    """The runtime's ``Schedules``, or None while the schedules module is not part of the build."""
    from durapay.workflows.schedules import Schedules

    return Schedules(runtime.engine)
