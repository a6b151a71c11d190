"""Pay-by-link: the four creation forms, cancel, renew, modify, look-ups, lists, exports, QR codes.

A link is a simulator page (``{root}/_sim/link/{linkId}``) on which the customer pays once. Its status
(``paymentLink.status``): ``ACTIVE`` until paid (``PAID``), refused or abandoned (``FAILED``), cancelled
by the merchant (``CANCELLED``) or past the end of its ``expirationDate`` by the simulator's clock
(``EXPIRED``). Expiry, a customer's abandon and a merchant's cancel each record an operation
(``EXPIRED`` / ``CANCELED``) on the link's order and notify, so a waiting flow always learns the end.
A renewal gives a failed, expired or unused link a new expiration date and opens it again.

A payment on the link answered ``PENDING`` (a ``page_payment`` rule, ``_pending``) leaves the link
``ACTIVE`` without ``paidByOperationId`` but in use until it settles: its page refuses a second payment or
an abandon (409), ``cancel`` and ``modify`` answer ``PS0045``, and the link does not expire, even past
its date. Settled approved, it is ``PAID``; declined, ``FAILED`` as after an immediate decline.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

import segno

from durapay.gateway import (
    OperationResult,
    PayByLinkExportQuery,
    PayByLinkListQuery,
    PayByLinkModifyRequest,
    PayByLinkRenewRequest,
    PayByLinkRequest,
    QrCodeRequest,
)
from durapay.simulator._config import AUTO_COMPLETE_PAN
from durapay.simulator._lists import Window, newest_first
from durapay.simulator._payments import (
    abandon_on_page,
    check_recurrence,
    check_session,
    claim_order,
    ensure_new_order,
    is_explicit,
    page_payment_in_progress,
    pay_on_page,
)
from durapay.simulator._protocol import Call, Handler, Origin, Reply, SimError, ok
from durapay.simulator._records import LinkRecord, OperationRecord, OrderRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

MAX_LINK_DAYS = 90
EXPIRY_ORIGIN = Origin("link_expiry", "/_sim/clock")


def _today(sim: Simulator) -> date:
    return sim.clock.now().date()


def check_expiration(sim: Simulator, value: str, field: str) -> date:
    """A link's expiration date: a real date, not past, at most 90 days ahead."""
    try:
        when = date.fromisoformat(value[:10])
    except ValueError:
        raise SimError.invalid(field, f"{value!r} is not a date (YYYY-MM-DD)") from None
    today = _today(sim)
    if when < today:
        raise SimError.invalid(field, "must not be in the past")
    if when > today + timedelta(days=MAX_LINK_DAYS):
        raise SimError.invalid(field, f"must be at most {MAX_LINK_DAYS} days after today")
    return when


def open_link(sim: Simulator, call: Call, order: OrderRecord, expiration: date) -> LinkRecord:
    """Create a link for ``order`` (the order is open for payment) and arrange its auto-completion."""
    state = sim.state
    link_id = state.new_id("L")
    token = state.new_token()
    order.security_tokens.append(token)
    order.page_open = True
    link = LinkRecord(
        link_id=link_id,
        order_id=order.order_id,
        amount=order.session_amount or order.amount,
        expiration_date=expiration.isoformat(),
        created_at=state.now_iso(),
        link=f"{call.root_url}/_sim/link/{link_id}",
        created_by=call.op.name,
        security_token=token,
        duration_days=max(1, (expiration - _today(sim)).days),
    )
    state.links[link_id] = link
    order.link_ids.append(link_id)
    sim.auto_complete(lambda: auto_complete_link(sim, link_id))
    return link


def answer(link: LinkRecord) -> dict[str, Any]:
    return {"paymentLink": link.wire(), "securityToken": link.security_token}


def create_paybylink(sim: Simulator, call: Call) -> Reply:
    body = call.body(PayByLinkRequest)
    ensure_new_order(sim, body.order)
    session = body.paymentSession
    check_session(body.order, session)
    check_recurrence(sim, session.recurrence, "paymentSession.recurrence")
    expiration = check_expiration(sim, body.expirationDate, "expirationDate")
    order = claim_order(
        sim,
        call,
        body.order,
        "paybylink",
        session=session.wire(),
        session_amount=session.amount,
        action_type=str(session.actionType),
        capture_explicit=is_explicit(session.captureType),
        recurrence=session.recurrence.wire() if session.recurrence else None,
        notification_url=session.notificationUrl,
        result_url=session.resultUrl,
        cancel_url=session.cancelUrl,
    )
    return ok(answer(open_link(sim, call, order, expiration)))


def find_link(sim: Simulator, link_id: str) -> LinkRecord:
    """The link, its PENDING payment settled and its expiry applied if the clock says so (404 if unknown)."""
    link = sim.state.links.get(link_id)
    if link is None:
        raise SimError.not_found()
    sim.pending.settle_due()
    refresh(sim, link)
    return link


def in_progress(sim: Simulator, link: LinkRecord) -> OperationRecord | None:
    """The payment on ``link`` still ``PENDING`` (the link is in use), if any."""
    return page_payment_in_progress(sim, sim.state.orders[link.order_id], link)


def refresh(sim: Simulator, link: LinkRecord) -> None:
    """Expire ``link`` if the clock is past the end of its expiration date and no payment on it is PENDING."""
    if link.status == "ACTIVE" and _today(sim) > date.fromisoformat(link.expiration_date) and in_progress(sim, link) is None:
        abandon_on_page(sim, sim.state.orders[link.order_id], EXPIRY_ORIGIN, result=OperationResult.EXPIRED.value, link=link)
        sim.state.dirty = True


def expire_due(sim: Simulator) -> None:
    for link in list(sim.state.links.values()):
        refresh(sim, link)


def _refuse_in_use(sim: Simulator, link: LinkRecord) -> None:
    """The merchant's cancel or modify of a link whose payment is PENDING: PS0045 (the link is used)."""
    held = in_progress(sim, link)
    if held is not None:
        raise SimError.rejected("PS0045", f"payment {held.operation_id} on link {link.link_id} is PENDING")


def pay_link(sim: Simulator, link_id: str, origin: Origin, *, pan: str, expiry: str, cancel: bool) -> OperationRecord:
    """The customer's action on the link page (also the auto-completion)."""
    link = find_link(sim, link_id)
    if link.status != "ACTIVE":
        raise SimError(409, None, f"link {link_id} is {link.status}")
    held = in_progress(sim, link)
    if held is not None:
        raise SimError(409, None, f"link {link_id} is in use: payment {held.operation_id} is PENDING")
    order = sim.state.orders[link.order_id]
    if cancel:
        return abandon_on_page(sim, order, origin, result=OperationResult.CANCELED.value, link=link)
    return pay_on_page(sim, order, origin, pan=pan, expiry=expiry, link=link)


def auto_complete_link(sim: Simulator, link_id: str) -> None:
    with sim.state.lock:
        link = sim.state.links.get(link_id)
        if link is not None and link.status == "ACTIVE" and in_progress(sim, link) is None:
            pay_link(
                sim, link_id, Origin("auto_complete", f"/_sim/link/{link_id}"), pan=AUTO_COMPLETE_PAN, expiry="1230", cancel=False
            )
            sim.state.dirty = True


def cancel_paybylink(sim: Simulator, call: Call) -> Reply:
    link = find_link(sim, call.params["linkId"])
    if link.status == "PAID":
        raise SimError.rejected("PS0045")
    if link.status != "ACTIVE":
        raise SimError.rejected("PS0044", f"link is {link.status}")
    _refuse_in_use(sim, link)
    link.status = "CANCELLED"
    abandon_on_page(sim, sim.state.orders[link.order_id], call.origin, result=OperationResult.CANCELED.value, link=link)
    return ok(True)


def _details(sim: Simulator, link: LinkRecord) -> dict[str, Any]:
    order = sim.state.orders[link.order_id]
    operations = [sim.state.operations[i] for i in order.operation_ids]
    return {
        "paymentLink": link.wire(),
        "orderId": link.order_id,
        "operations": [op.wire() for op in operations if op.payment_link_id == link.link_id],
    }


def get_paybylink(sim: Simulator, call: Call) -> Reply:
    link_id = call.params.get("linkId") or call.params["Id"]
    return ok(_details(sim, find_link(sim, link_id)))


def _matching(
    sim: Simulator, from_time: str | None, to_time: str | None, status: str | None, order_id: str | None
) -> list[LinkRecord]:
    window = Window.of(from_time, to_time)
    sim.pending.settle_due()
    expire_due(sim)
    return [
        link
        for link in sim.state.links.values()
        if window.holds(link.created_at)
        and (status is None or link.status == status.upper())
        and (order_id is None or link.order_id == order_id)
    ]


def list_paybylinks(sim: Simulator, call: Call) -> Reply:
    query = call.body(PayByLinkListQuery)
    links = _matching(sim, query.fromTime, query.toTime, query.status, query.orderId)
    return ok({"paymentLinks": [link.wire() for link in newest_first(links, lambda x: x.created_at, query.maxRecords)]})


def renew_paybylink(sim: Simulator, call: Call) -> Reply:
    link = find_link(sim, call.params["linkId"])
    if link.status in ("PAID", "CANCELLED"):
        raise SimError.rejected("PS0042", f"a {link.status} link cannot be renewed")
    request = call.body(PayByLinkRenewRequest)
    if request.expirationDate is not None:
        expiration = check_expiration(sim, request.expirationDate, "expirationDate")
    else:
        expiration = _today(sim) + timedelta(days=link.duration_days)
    link.expiration_date = expiration.isoformat()
    link.status = "ACTIVE"
    sim.state.orders[link.order_id].page_open = True
    sim.auto_complete(lambda: auto_complete_link(sim, link.link_id))
    return ok(answer(link))


def modify_paybylink(sim: Simulator, call: Call) -> Reply:
    link = find_link(sim, call.params["id"])
    if link.status == "PAID":
        raise SimError.rejected("PS0045")
    if link.status != "ACTIVE":
        raise SimError.rejected("PS0042", f"a {link.status} link cannot be modified")
    _refuse_in_use(sim, link)
    request = call.body(PayByLinkModifyRequest)
    order = sim.state.orders[link.order_id]
    if request.expirationDate is not None:
        link.expiration_date = check_expiration(sim, request.expirationDate, "expirationDate").isoformat()
    if request.amount is not None:
        if request.amount <= 0:
            raise SimError.invalid("amount", "must be at least 1")
        link.amount = order.session_amount = request.amount
        if request.amount > order.amount:
            order.amount = request.amount
            order.order["amount"] = str(request.amount)
    if request.description is not None:
        order.order["description"] = request.description
    return ok(answer(link))


EXPORT_COLUMNS = ("linkId", "orderId", "amount", "currency", "status", "expirationDate", "createdAt", "paidByOperationId", "link")


def export_paybylinks(sim: Simulator, call: Call) -> Reply:
    export_format = call.params["format"].lower()
    if export_format not in ("csv", "json"):
        raise SimError.invalid("format", "must be csv or json")
    query = call.body(PayByLinkExportQuery)
    links = newest_first(_matching(sim, query.fromTime, query.toTime, query.status, None), lambda x: x.created_at, 500)
    rows = [
        {
            **link.wire(),
            "orderId": link.order_id,
            "currency": sim.state.orders[link.order_id].currency,
            "createdAt": link.created_at,
        }
        for link in links
    ]
    if export_format == "json":
        return Reply(content=json.dumps({"paymentLinks": rows}).encode(), media_type="application/json")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=EXPORT_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return Reply(content=out.getvalue().encode(), media_type="text/csv")


def paybylink_qrcode(sim: Simulator, call: Call) -> Reply:
    link = find_link(sim, call.params["id"])
    request = call.body(QrCodeRequest)
    buffer = io.BytesIO()
    segno.make(link.link, error="m").save(buffer, kind="png", scale=request.size or 4, border=2)
    return Reply(content=buffer.getvalue(), media_type="image/png")


HANDLERS: dict[str, Handler] = {
    "create_paybylink_v3": create_paybylink,
    "create_paybylink_v2": create_paybylink,
    "create_paybylink_v1": create_paybylink,
    "create_paybylink": create_paybylink,
    "cancel_paybylink": cancel_paybylink,
    "list_paybylinks_v3": list_paybylinks,
    "get_paybylink_v3": get_paybylink,
    "list_paybylinks": list_paybylinks,
    "get_paybylink": get_paybylink,
    "renew_paybylink": renew_paybylink,
    "modify_paybylink_v3": modify_paybylink,
    "export_paybylinks_v3": export_paybylinks,
    "paybylink_qrcode_v3": paybylink_qrcode,
}
