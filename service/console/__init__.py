"""The web console at ``/console``: server-rendered pages over the engine, in the API's own process.

Why server-rendered: no build step, nothing to install in a browser, nothing fetched from another host
(it must work offline and behind a firewall). One small script (``static/console.js``: live updates by
polling a small JSON endpoint, and the timeline's hover text) and one stylesheet ship in the package.

Pieces: ``session`` (sign-in cookie, CSRF), ``web`` (templates, security headers), ``flow_pages``
(home, list, flow, actions), ``follow_pages`` (a succeeded payment's refund or capture, a new flow),
``schedule_pages``, ``ops_pages`` (flow kinds: pause and resume; bulk retry and cancel), ``kind_pages``
(a kind's example input), ``webhook_pages``, ``timeline`` (the SVG), ``overview`` (home figures),
``flow_facts`` (outcome and actions in words). The console's paths are open in the API's key gate
(``service.guard``): the console checks its own session instead, with the same keys and roles.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from durapay.config.settings import BulkSettings
from durapay.service.auth import Keyring
from durapay.service.console.flow_pages import flow_router
from durapay.service.console.follow_pages import follow_router
from durapay.service.console.kind_pages import kind_router
from durapay.service.console.ops_pages import ops_router
from durapay.service.console.reconcile_pages import reconcile_router
from durapay.service.console.session import COOKIE, LOGIN_COOKIE, LOGIN_SECONDS, NAME_LIMIT, PATH, Sessions, clean_name
from durapay.service.console.version_pages import version_router
from durapay.service.console.web import Console, read_form, redirect, safe_next, secured
from durapay.service.throttle import Throttle
from durapay.workflows.bulk import BulkActions
from durapay.workflows.engine import Engine
from durapay.workflows.listing import FlowListing

STATIC = f"{PATH}/static"


def install_console(
    app: FastAPI,
    engine: Engine,
    keyring: Keyring,
    *,
    hours: float,
    schedules: Any = None,
    webhooks: Any = None,
    throttle: Throttle | None = None,
    bulk: BulkActions | None = None,
) -> None:
    """Add the console's routes and files to ``app``; its sessions live in the engine's Redis."""
    console = Console(Sessions(keyring, hours, engine.redis, engine.keys.prefix))
    listing = FlowListing(engine.store, engine.registry)
    app.mount(STATIC, StaticFiles(directory=str(files("durapay.service.console") / "static")), name="console-static")
    app.include_router(_sign_in_router(console, throttle))
    app.include_router(flow_router(console, engine, listing))
    app.include_router(follow_router(console, engine))
    app.include_router(kind_router(console, engine))
    app.include_router(reconcile_router(console, engine))
    app.include_router(ops_router(console, engine, bulk or BulkActions(engine, BulkSettings())))
    app.include_router(version_router(console, engine, schedules))
    if schedules is not None:
        from durapay.service.console.schedule_pages import schedule_router

        app.include_router(schedule_router(console, schedules))
    if webhooks is not None:
        from durapay.service.console.webhook_pages import webhook_router

        app.include_router(webhook_router(console, webhooks))


def _sign_in_router(console: Console, throttle: Throttle | None) -> APIRouter:
    router = APIRouter(prefix=PATH, include_in_schema=False)
    sessions = console.sessions

    def login_page(request: Request, status: int = 200, problem: str = "") -> Response:
        nonce, token = sessions.login_form()
        response = console.page(
            request,
            "login.html",
            None,
            status=status,
            title="Sign in",
            login_csrf=token,
            next=safe_next(request.query_params.get("next")),
            problem=problem,
        )
        response.set_cookie(LOGIN_COOKIE, nonce, max_age=LOGIN_SECONDS, httponly=True, samesite="strict", path=PATH)
        return response

    @router.get("/login")
    def login(request: Request) -> Response:
        return login_page(request)

    @router.post("/login")
    async def sign_in(request: Request) -> Response:
        form = await read_form(request) or {}
        if not sessions.login_ok(request.cookies.get(LOGIN_COOKIE, ""), form.get("csrf", "")):
            return login_page(request, 403, "The sign-in form expired; try again.")
        # The API's limit on guessing (service.throttle), before the key is compared: one form per attempt
        # bounds nothing by itself, a fresh form is one GET away.
        address, key = request.client.host if request.client else "", form.get("key", "")
        if throttle is not None:
            wait = await anyio.to_thread.run_sync(throttle.blocked, address, key)
            if wait is not None:
                refused = login_page(request, 429, f"Too many failed sign-ins; try again in {wait} seconds.")
                refused.headers["Retry-After"] = str(wait)
                return refused
        if sessions.keyring.role_of(key) is None:
            if throttle is not None:
                await anyio.to_thread.run_sync(throttle.failed, address, key)
            return login_page(request, 401, "That key is not valid here.")
        # Whose actions these will be: the console records them under this name (Session.by), not "console".
        name = clean_name(form.get("name", ""))
        made = sessions.sign_in(key, name=name) if name is not None else None
        if made is None:
            wanted = f"up to {NAME_LIMIT} letters, digits, spaces or . _ @ ' -"
            return login_page(request, 422, f"Give your name ({wanted}): what you do here is recorded under it.")
        _, cookie = made
        response = redirect(safe_next(form.get("next")))
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=int(sessions.seconds),
            httponly=True,
            samesite="strict",
            path=PATH,
            secure=request.url.scheme == "https",
        )
        response.delete_cookie(LOGIN_COOKIE, path=PATH)
        return response

    @router.post("/logout")
    async def sign_out(request: Request) -> Response:
        session = console.session(request)
        if session is not None and await console.form(request, session) is None:
            return console.refuse(request, session, 403, "Refused", "the form expired; reload and try again")
        sessions.sign_out(request.cookies.get(COOKIE))
        response = redirect(f"{PATH}/login")
        response.delete_cookie(COOKIE, path=PATH)
        return secured(response)

    return router
