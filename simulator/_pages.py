"""The customer's side: hosted page, pay-by-link page, 3DS ACS, embedded form, as plain HTML forms.

A person can use them in a browser; tests and ``SimulatorAdmin`` post the same forms over HTTP. Every
answer that changes something carries ``X-Sim-*`` headers with the outcome (operation id and result,
PaRes, build state) so that programs need not parse HTML.

=========================================  ============================================================
``GET|POST /_sim/hpp/{orderId}``            pay (fields ``pan``, ``expiryDate``, ``cvv``) or ``action=cancel``;
                                            303 to ``resultUrl`` / ``cancelUrl`` when the order gave them
``GET|POST /_sim/link/{linkId}``            the same for a pay-by-link
``POST /_sim/acs``                          ACS form (``ThreeDsRequest``, ``ReturnUrl``, ``transactionId``):
                                            answers the challenge page
``POST /_sim/acs/challenge``                the challenge (``decision=approve|fail``): 303 to ``ReturnUrl``
                                            with ``PaRes`` and ``paymentId``
``GET|POST /_sim/build/{sessionId}``        the embedded form: enter the card (or pay the APM)
``GET|POST /_sim/build/{sessionId}/gdi``    the 3DS step of a build session (``decision=approve|fail``)
=========================================  ============================================================

A ``page_payment`` rule (``_pending``) makes the payment these pages run ``PENDING``: the answer carries
``X-Sim-Operation-Result: PENDING`` (a build page: ``X-Sim-Build-State: PAYMENT_COMPLETE``), the page shows
it, and a second payment on a hosted page or link is refused (409) until it settles.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from durapay.gateway import format_money
from durapay.simulator import _build, _direct, _links, _payments, _three_steps
from durapay.simulator._config import AUTO_COMPLETE_PAN
from durapay.simulator._protocol import Origin, SimError
from durapay.simulator._records import OperationRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

CARD_FORM = """
<form method="post">
  <label>Card number <input name="pan" value="{pan}" inputmode="numeric"></label>
  <label>Expiry (MMYY) <input name="expiryDate" value="1230"></label>
  <label>CVV <input name="cvv" value="123"></label>
  <button name="action" value="pay">Pay</button> {cancel}
</form>"""
CANCEL_BUTTON = '<button name="action" value="cancel">Cancel</button>'


def page(title: str, body: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    heading = html.escape(title)
    document = f"<!doctype html><html><head><title>{heading}</title></head><body><h1>{heading}</h1>{body}</body></html>"
    return HTMLResponse(document, status_code=status, headers=headers)


def problem(exc: SimError) -> HTMLResponse:
    return page("Not possible", f"<p>{html.escape(exc.description or str(exc.status))}</p>", status=exc.status)


async def form(request: Request) -> dict[str, str]:
    """The urlencoded form fields of a browser POST (the last value of a repeated field)."""
    return dict(parse_qsl((await request.body()).decode("utf-8", errors="replace"), keep_blank_values=True))


def with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = "&".join(filter(None, [parts.query, urlencode(params)]))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def card_fields(fields: dict[str, str]) -> tuple[str, str]:
    pan = fields.get("pan", "").replace(" ", "")
    expiry = fields.get("expiryDate", "") or "1230"
    if not ((pan.isascii() and pan.isdigit()) and 13 <= len(pan) <= 19):
        raise SimError(400, None, "the card number must be 13 to 19 digits")
    if not (len(expiry) == 4 and (expiry.isascii() and expiry.isdigit()) and 1 <= int(expiry[:2]) <= 12):
        raise SimError(400, None, "the expiry date must be MMYY")
    return pan, expiry


def outcome_answer(op: OperationRecord, redirect: str | None) -> Response:
    headers = {"X-Sim-Operation-Id": op.operation_id, "X-Sim-Operation-Result": op.result}
    if redirect:
        return RedirectResponse(redirect, status_code=303, headers=headers)
    body = f"<p>Order {html.escape(op.order_id)}: operation {op.operation_id} is <b>{op.result}</b>.</p>"
    return page("Payment outcome", body, headers=headers)


def in_progress(op: OperationRecord) -> str:
    """What a page shows while the customer's payment on it is PENDING."""
    return f"<p>Payment {op.operation_id} is <b>PENDING</b>: the result follows.</p>"


PageAction = Callable[[Origin, str, str, bool], OperationRecord]


def page_routes(sim: Simulator) -> list[BaseRoute]:
    lock = sim.state.lock

    async def act(request: Request, action: PageAction, name: str, redirects: tuple[str | None, str | None]) -> Response:
        fields = await form(request)
        cancel = fields.get("action") == "cancel"
        try:
            pan, expiry = ("", "") if cancel else card_fields(fields)
            with lock:
                op = action(Origin(name, request.url.path), pan, expiry, cancel)
                sim.state.dirty = True
        except SimError as exc:
            return problem(exc)
        return outcome_answer(op, redirects[1] if cancel else redirects[0])

    async def hpp_page(request: Request) -> Response:
        order_id = request.path_params["orderId"]
        with lock:
            sim.pending.settle_due()
            order = sim.state.orders.get(order_id)
            redirects = (order.result_url, order.cancel_url) if order else (None, None)
            is_open = bool(order and order.kind == "hpp" and order.page_open)
            held = _payments.page_payment_in_progress(sim, order) if order else None
        if request.method == "GET":
            if order is None or order.kind != "hpp":
                return problem(SimError(404, None, f"no hosted page for order {order_id}"))
            amount = format_money(order.session_amount or order.amount, order.currency)  # 25.00 EUR, as a customer reads it
            body = CARD_FORM.format(pan=AUTO_COMPLETE_PAN, cancel=CANCEL_BUTTON) if is_open else "<p>Completed.</p>"
            body = in_progress(held) if held else body
            return page(f"Pay order {order_id}", f"<p>{html.escape(amount)}</p>{body}")

        def action(origin: Origin, pan: str, expiry: str, cancel: bool) -> OperationRecord:
            return _direct.pay_hpp(sim, order_id, origin, pan=pan, expiry=expiry, cancel=cancel)

        return await act(request, action, "hpp_page", redirects)

    async def link_page(request: Request) -> Response:
        link_id = request.path_params["linkId"]
        with lock:
            link = sim.state.links.get(link_id)
            if link is not None:
                sim.pending.settle_due()
                _links.refresh(sim, link)
            order = sim.state.orders.get(link.order_id) if link else None
            redirects = (order.result_url, order.cancel_url) if order else (None, None)
            status = link.status if link else None
            held = _links.in_progress(sim, link) if link else None
        if request.method == "GET":
            if link is None:
                return problem(SimError(404, None, f"no link {link_id}"))
            body = CARD_FORM.format(pan=AUTO_COMPLETE_PAN, cancel=CANCEL_BUTTON) if status == "ACTIVE" else ""
            body = in_progress(held) if held else body
            shown = format_money(link.amount, order.currency if order else None)
            return page(f"Pay-by-link {link_id}", f"<p>Status: {status}; amount {html.escape(shown)}.</p>{body}")

        def action(origin: Origin, pan: str, expiry: str, cancel: bool) -> OperationRecord:
            return _links.pay_link(sim, link_id, origin, pan=pan, expiry=expiry, cancel=cancel)

        return await act(request, action, "link_page", redirects)

    async def acs(request: Request) -> Response:
        fields = await form(request)
        hidden = "".join(
            f'<input type="hidden" name="{name}" value="{html.escape(fields.get(name, ""))}">'
            for name in ("ThreeDsRequest", "ReturnUrl", "transactionId")
        )
        buttons = (
            '<button name="decision" value="approve">Authenticate</button> <button name="decision" value="fail">Fail</button>'
        )
        return page("3-D Secure challenge", f'<form method="post" action="/_sim/acs/challenge">{hidden}{buttons}</form>')

    async def acs_challenge(request: Request) -> Response:
        fields = await form(request)
        operation_id = fields.get("transactionId", "")
        try:
            with lock:
                pares = _three_steps.acs_authenticate(
                    sim, operation_id, fields.get("ThreeDsRequest", ""), approve=fields.get("decision") == "approve"
                )
                sim.state.dirty = True
        except SimError as exc:
            return problem(exc)
        headers = {"X-Sim-PaRes": pares}
        if fields.get("ReturnUrl"):
            return RedirectResponse(with_query(fields["ReturnUrl"], PaRes=pares, paymentId=operation_id), 303, headers=headers)
        return page("3-D Secure done", f"<p>PaRes: <code>{html.escape(pares)}</code></p>", headers=headers)

    async def build_page(request: Request) -> Response:
        session_id = request.path_params["sessionId"]
        try:
            if request.method == "POST":
                fields = await form(request)
                pan, expiry = card_fields({**fields, "pan": fields.get("pan") or AUTO_COMPLETE_PAN})
                with lock:
                    session = _build.fill_form(sim, session_id, Origin("build_form", request.url.path), pan=pan, expiry=expiry)
                    sim.state.dirty = True
                    state = session.state
            else:
                with lock:
                    state = _build.find_session(sim, session_id).state
        except SimError as exc:
            return problem(exc)
        body = CARD_FORM.format(pan=AUTO_COMPLETE_PAN, cancel="") if request.method == "GET" else ""
        return page(f"Payment form {session_id}", f"<p>State: {state}</p>{body}", headers={"X-Sim-Build-State": state})

    async def build_field(request: Request) -> Response:
        field_id = html.escape(request.query_params.get("id", ""))
        return HTMLResponse(f'<!doctype html><input name="{field_id}" placeholder="{field_id}">')

    async def build_gdi(request: Request) -> Response:
        session_id = request.path_params["sessionId"]
        if request.method == "GET":
            buttons = (
                '<button name="decision" value="approve">Authenticate</button> <button name="decision" value="fail">Fail</button>'
            )
            return page("3-D Secure (payment form)", f'<form method="post">{buttons}</form>')
        fields = await form(request)
        try:
            with lock:
                origin = Origin("build_gdi", request.url.path)
                session = _build.complete_gdi(sim, session_id, origin, approve=fields.get("decision", "approve") == "approve")
                sim.state.dirty = True
                state = session.state
        except SimError as exc:
            return problem(exc)
        return page("3-D Secure done", f"<p>State: {state}</p>", headers={"X-Sim-Build-State": state})

    async def image(request: Request) -> Response:
        name = html.escape(request.path_params["name"].upper())
        svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="40"><text x="4" y="26">{name}</text></svg>'
        return Response(svg, media_type="image/svg+xml")

    return [
        Route("/_sim/hpp/{orderId}", hpp_page, methods=["GET", "POST"]),
        Route("/_sim/link/{linkId}", link_page, methods=["GET", "POST"]),
        Route("/_sim/acs", acs, methods=["POST"]),
        Route("/_sim/acs/challenge", acs_challenge, methods=["POST"]),
        Route("/_sim/build/{sessionId}", build_page, methods=["GET", "POST"]),
        Route("/_sim/build/{sessionId}/field", build_field, methods=["GET"]),
        Route("/_sim/build/{sessionId}/gdi", build_gdi, methods=["GET", "POST"]),
        Route("/_sim/img/{name}.svg", image, methods=["GET"]),
    ]
