"""What every console page shares: templates, the security headers, the session, forms and CSRF.

Why these headers: the console shows payment data to people signed in with keys that can move money.
``Content-Security-Policy`` allows scripts, styles, images and requests from this origin only (and no
inline script), so a value shown on a page (an order description, a gateway message) can never run
as code, and no page can load anything from another host (the console works offline and behind a
firewall); ``frame-ancestors 'none'`` keeps it out of other sites' frames; no page is cached; no
address of a console page is sent to another site (``Referrer-Policy: same-origin``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from importlib.resources import files
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from durapay.gateway import GatewayTime, format_money
from durapay.service.console.session import COOKIE, PATH, Session, Sessions
from durapay.service.inbound import Refusal, decode_form
from durapay.service.views import rule_text
from durapay.workflows.engine import GateStatus, mask_text
from durapay.workflows.moments import moment_text
from durapay.workflows.pauses import Pause

log = logging.getLogger("durapay.console")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: under it a browser sends ``Origin: null`` even on the console's own POSTs, and
    # the Origin check (same_origin) could not tell them from another site's.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
READ_ONLY = "this key may look, not act: sign in with an operator key"
FORM_EXPIRED = "the form expired or did not come from this console; reload and try again"
#: A console form is a few fields: anything larger is refused before it is parsed.
MAX_FORM_BYTES = 16 * 1024


def when(value: Any, zone: str | None = None) -> str:
    """A moment as every surface writes it (``workflows.moments``), or an em dash:
    ``{{ flow.created|when }}``, ``{{ s.nextRun|when(s.timezone) }}``."""
    return moment_text(value, zone) or "\u2014"


def shown(value: Any) -> str:
    """A value as a person reads it: JSON for objects and lists, the text itself otherwise."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value)


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(files("durapay.service.console") / "templates")),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["gateway_when"] = lambda text: when(GatewayTime(str(text)))  # the gateway's own form, its zone
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["show"] = shown
    env.filters["rule"] = rule_text
    env.filters["money"] = format_money  # {{ minor|money(currency) }}: the one formatter of money for people
    return env


def gateway_status(request: Request) -> GateStatus | None:
    """The gateway's breaker (``workflows.engine.gate``) for the banner every page shows while it is not closed: the
    first terminal's whose breaker is not closed (``default`` first), else default's; None when it cannot be
    read (the page still renders: the banner is news, not the page's content)."""
    runtime = getattr(request.app.state, "runtime", None)
    try:
        if runtime is None:
            return None
        terminals = runtime.engine.terminals
        statuses: list[GateStatus] = [terminals.gate(name).status() for name in terminals.names]
        return next((status for status in statuses if status.state != "closed"), statuses[0])
    except Exception:
        log.warning("the gateway's breaker could not be read for the console's banner", exc_info=True)
        return None


def paused_kinds(request: Request) -> list[Pause]:
    """The flow kinds paused now (``workflows.pauses``), for the banner every page shows while any is;
    nothing when they cannot be read (the banner is news, not the page's content)."""
    runtime = getattr(request.app.state, "runtime", None)
    try:
        return sorted(runtime.engine.pauses.paused_recently().values(), key=lambda p: p.kind) if runtime is not None else []
    except Exception:
        log.warning("the pauses could not be read for the console's banner", exc_info=True)
        return []


class Console:
    """The shared parts of the console's routes: sessions, templates, the engine's runtime."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.templates = environment()

    def session(self, request: Request) -> Session | None:
        return self.sessions.read(request.cookies.get(COOKIE))

    def page(self, request: Request, template: str, session: Session | None, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(
            session=session,
            csrf=session.csrf if session else "",
            path=request.url.path,
            now=time.time(),
            gateway=gateway_status(request) if session else None,
            paused=paused_kinds(request) if session else [],
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        secured(response)
        return response

    def refuse(self, request: Request, session: Session | None, status: int, title: str, reason: str) -> HTMLResponse:
        """The console's error page. Its reason may quote what was typed: a card number in it is masked,
        as in the API's error answers (``service.errors.error_response``)."""
        return self.page(request, "error.html", session, status=status, title=title, reason=mask_text(reason))

    async def form(self, request: Request, session: Session | None) -> dict[str, str] | None:
        """The POSTed form (first value of each field) when it came from this console's origin and its
        CSRF token matches the session's, else None."""
        parsed = await read_form(request)
        return parsed if parsed is not None and self.sessions.csrf_ok(session, parsed.get("csrf", "")) else None

    async def operator_post(self, request: Request) -> tuple[Session, dict[str, str]] | Response:
        """An operator's POST, as every acting route takes it: (session, form), or the answer refusing it
        (the sign-in page without a session; 403 for a form not from this console, or a read-only key)."""
        session = self.session(request)
        if session is None:
            return to_login(request)
        form = await self.form(request, session)
        if form is None:
            return self.refuse(request, session, 403, "Refused", FORM_EXPIRED)
        if not session.operator:
            return self.refuse(request, session, 403, "Read-only", READ_ONLY)
        return session, form


def same_origin(request: Request) -> bool:
    """Whether a POST came from a page of this console: its ``Origin`` (sent by every browser on a
    POST), when present, names this host (``null``, sent from a sandboxed frame or across origins under
    a strict referrer policy, is refused). A second line behind ``SameSite=Strict`` and the CSRF token;
    a request with no ``Origin`` (curl, an old browser) relies on those two.

    Behind a TLS-terminating proxy the scheme the browser used is not the one we see: the host decides
    (the proxy must pass ``Host`` through, as docs/security.md says)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    scheme, _, rest = origin.partition("://")
    return scheme in ("http", "https") and bool(host) and rest == host


async def read_form(request: Request) -> dict[str, str] | None:
    """A console POST's form (first value of each field), or None when it is too large or came from
    another origin."""
    if not same_origin(request):
        return None
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return None
    try:
        return decode_form(body, request.headers.get("content-type"))  # the one input boundary (the gate asked it too)
    except Refusal:
        return None


def secured(response: Response) -> Response:
    for name, value in HEADERS.items():
        response.headers[name] = value
    return response


def to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return secured(RedirectResponse(f"{PATH}/login?next={quote(target, safe='')}", status_code=303))


def redirect(url: str) -> Response:
    return secured(RedirectResponse(url, status_code=303))


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if value and value.startswith(PATH) and not value.startswith("//") and "\\" not in value:
        return value
    return PATH


def query(params: Mapping[str, Any]) -> str:
    """A query string of the non-empty ``params``."""
    kept = [(name, str(value)) for name, value in params.items() if value not in (None, "")]
    return "&".join(f"{quote(name)}={quote(value, safe='')}" for name, value in kept)
