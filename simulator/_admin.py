"""A small synchronous client for ``/_sim/`` and the customer pages, for tests and the demo.

Everything goes over HTTP, exactly as a browser or an operator would: ``complete_hpp`` posts the
hosted page's form, ``acs_challenge`` posts the ACS form and reads the ``PaRes`` from the redirect.
Filters take the gateway's names or snake_case (``order_id=`` or ``orderId=``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from durapay.simulator._clock import iso, parse_iso
from durapay.simulator._config import AUTO_COMPLETE_PAN

_SNAKE = re.compile(r"_([a-z])")


class SimulatorAdminError(RuntimeError):
    """The simulator refused an admin or page request; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _camel(name: str) -> str:
    return _SNAKE.sub(lambda match: match.group(1).upper(), name)


def _text(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("error", body)) if isinstance(body, dict) else str(body)
    except ValueError:
        found = re.search(r"<p>(.*?)</p>", response.text, re.S)
        return re.sub(r"<[^>]+>", "", found.group(1)) if found else response.text[:200]


class SimulatorAdmin:
    def __init__(self, root_url: str, *, timeout: float = 10.0) -> None:
        self.root_url = root_url.rstrip("/")
        self._http = httpx.Client(base_url=self.root_url, timeout=timeout, follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SimulatorAdmin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise SimulatorAdminError(f"{method} {path}: HTTP {response.status_code}: {_text(response)}", response.status_code)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- simulator control ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/_sim/health")
        return result

    def serving(self, operation: str) -> int:
        """How many requests to ``operation`` the simulator is serving now: arrived, not yet answered (a
        latency or hang fault holds them), so a test can act between a call's arrival and its effect."""
        return int(self.health()["serving"].get(operation, 0))

    def reset(self) -> None:
        self._json("POST", "/_sim/reset")

    def set_faults(self, **settings: Any) -> dict[str, Any]:
        """Add a rule (``mode=...``), rules (``rules=[...]``), or set ``latency_ms``/``latency_jitter_ms``/``seed``."""
        result: dict[str, Any] = self._json("POST", "/_sim/faults", json=settings)
        return result

    def faults(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/_sim/faults")
        return result

    def clear_faults(self) -> None:
        self._json("DELETE", "/_sim/faults")

    def release_late(self) -> list[int]:
        """Let the requests held by ``late`` rules act now; their statuses, oldest first."""
        released: list[int] = self._json("POST", "/_sim/faults/release")["released"]
        return released

    def now(self) -> datetime:
        return parse_iso(self._json("GET", "/_sim/clock")["now"])

    def advance_clock(self, seconds: float) -> datetime:
        """Move the simulator's clock; expiries due by then happen before this returns."""
        return parse_iso(self._json("POST", "/_sim/clock", json={"advance_seconds": seconds})["now"])

    def set_clock(self, moment: datetime | str) -> datetime:
        text = iso(moment) if isinstance(moment, datetime) else moment
        return parse_iso(self._json("POST", "/_sim/clock", json={"now": text})["now"])

    def set_auto_complete(self, milliseconds: int | None) -> None:
        self._json("POST", "/_sim/settings", json={"auto_complete_ms": milliseconds})

    def script_outcomes(
        self, outcomes: Sequence[str], *, contract_id: str | None = None, pan: str | None = None
    ) -> dict[str, Any]:
        """Queue outcomes ("116", "000", "DENIED_BY_RISK"...) for a contract's or a card's next payments."""
        body: dict[str, Any] = {"outcomes": list(outcomes)}
        if contract_id is not None:
            body["contractId"] = contract_id
        if pan is not None:
            body["pan"] = pan
        result: dict[str, Any] = self._json("POST", "/_sim/scripts", json=body)
        return result

    def pend(self, operation: str, count: int = 1, final: str = "000", settle_after: float | None = None) -> dict[str, Any]:
        """The next ``count`` requests to ``operation`` (a money operation) answer PENDING; each settles with
        the outcome token ``final`` at :meth:`settle_pending`, or by itself ``settle_after`` seconds of the
        simulator's clock after it was made. Returns the rules and the operations held.

        ``operation="page_payment"`` holds the next payments customers make on a page instead (hosted page,
        link, a build's APM page or version 2 3DS step, also when auto-completed): ``complete_hpp`` and
        ``complete_link`` then answer ``operationResult: PENDING``, ``fill_build_form`` ``PAYMENT_COMPLETE``."""
        body = {"operation": operation, "count": count, "final": final, "settle_after": settle_after}
        result: dict[str, Any] = self._json("POST", "/_sim/pending", json=body)
        return result

    def pending(self) -> dict[str, Any]:
        """``{"rules": [...], "operations": [...]}``: the ``pend`` rules and the operations still PENDING."""
        result: dict[str, Any] = self._json("GET", "/_sim/pending")
        return result

    def settle_pending(self, operation_id: str | None = None) -> list[str]:
        """Settle one PENDING operation (or every one) now with its ``final`` outcome; the ids settled."""
        body = {} if operation_id is None else {"operationId": operation_id}
        settled: list[str] = self._json("POST", "/_sim/pending/settle", json=body)["settled"]
        return settled

    def clear_scripts(self) -> None:
        self._json("DELETE", "/_sim/scripts")

    def snapshot(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/_sim/state")
        return result

    # -- inspection ---------------------------------------------------------------------------------

    def operations(self, **filters: str) -> list[dict[str, Any]]:
        """Recorded operations, oldest first: ``operations(order_id="o1")``, ``operations(idempotencyKey="k")``."""
        params = {_camel(name): value for name, value in filters.items()}
        result: list[dict[str, Any]] = self._json("GET", "/_sim/operations", params=params)["operations"]
        return result

    def notifications(self, **filters: str) -> list[dict[str, Any]]:
        """The notification delivery log (``order_id=``, ``state=`` pending|delivered|failed|dropped)."""
        params = {_camel(name): value for name, value in filters.items()}
        result: list[dict[str, Any]] = self._json("GET", "/_sim/notifications", params=params)["notifications"]
        return result

    def wait_for_notifications(
        self, predicate: Callable[[list[dict[str, Any]]], bool], *, timeout: float = 10.0, **filters: str
    ) -> list[dict[str, Any]]:
        """Poll the delivery log until ``predicate(log)`` holds; TimeoutError (with the log) otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.notifications(**filters)
            if predicate(found):
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"notifications did not reach the expected state in {timeout}s: {found}")
            time.sleep(0.02)

    # -- the customer's side ----------------------------------------------------------------------------

    def _pay_page(self, path: str, pan: str, expiry: str, cvv: str, cancel: bool) -> dict[str, str]:
        form = {"action": "cancel"} if cancel else {"action": "pay", "pan": pan, "expiryDate": expiry, "cvv": cvv}
        response = self._request("POST", path, data=form)
        return {
            "operationId": response.headers["X-Sim-Operation-Id"],
            "operationResult": response.headers["X-Sim-Operation-Result"],
        }

    def complete_hpp(
        self, order_id: str, *, pan: str = AUTO_COMPLETE_PAN, expiry: str = "1230", cvv: str = "123", cancel: bool = False
    ) -> dict[str, str]:
        """Pay (or cancel) the hosted page of ``order_id``; returns ``{operationId, operationResult}``."""
        return self._pay_page(f"/_sim/hpp/{quote(order_id, safe='')}", pan, expiry, cvv, cancel)

    def complete_link(
        self, link_id: str, *, pan: str = AUTO_COMPLETE_PAN, expiry: str = "1230", cvv: str = "123", cancel: bool = False
    ) -> dict[str, str]:
        """Pay (or abandon) a pay-by-link; returns ``{operationId, operationResult}``."""
        return self._pay_page(f"/_sim/link/{quote(link_id, safe='')}", pan, expiry, cvv, cancel)

    def acs_challenge(
        self,
        operation_id: str,
        three_ds_auth_request: str,
        approve: bool = True,
        *,
        return_url: str = "https://merchant.example/3ds-return",
    ) -> str:
        """Go through the ACS as a browser would (form, challenge, redirect); returns the PaRes."""
        fields = {"ThreeDsRequest": three_ds_auth_request, "ReturnUrl": return_url, "transactionId": operation_id}
        self._request("POST", "/_sim/acs", data=fields)
        response = self._request("POST", "/_sim/acs/challenge", data={**fields, "decision": "approve" if approve else "fail"})
        query = parse_qs(urlsplit(response.headers["location"]).query)
        if query.get("paymentId") != [operation_id]:
            raise SimulatorAdminError(f"ACS returned to the wrong payment: {query.get('paymentId')}", response.status_code)
        return query["PaRes"][0]

    def fill_build_form(
        self,
        session_id: str,
        *,
        pan: str = AUTO_COMPLETE_PAN,
        expiry: str = "1230",
        cvv: str = "123",
        complete_gdi: bool = True,
    ) -> str:
        """Enter the card in a build session's form; with ``complete_gdi`` also pass a version 3 challenge.

        Returns the session's state afterwards.
        """
        path = f"/_sim/build/{quote(session_id, safe='')}"
        state = self._request("POST", path, data={"pan": pan, "expiryDate": expiry, "cvv": cvv}).headers["X-Sim-Build-State"]
        if complete_gdi and state == "GDI_VERIFICATION":
            state = self.complete_build_gdi(session_id)
        return state

    def complete_build_gdi(self, session_id: str, approve: bool = True) -> str:
        """Finish the 3DS (GDI) step of a build session; returns its state afterwards."""
        path = f"/_sim/build/{quote(session_id, safe='')}/gdi"
        response = self._request("POST", path, data={"decision": "approve" if approve else "fail"})
        return response.headers["X-Sim-Build-State"]
