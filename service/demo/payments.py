"""The demo's first two phases: card payments and the customer's pages.

1. **cards**: MOTO (sale, then a partial refund; an authorization, then its capture and the capture's
   cancel), card verification, wallet, SVS, 3-step frictionless creating a contract, a MIT on it, its
   deactivation, and a 3DS challenge answered through the simulator's ACS page.
2. **customer pages**: hosted page and pay-by-link paid by the (simulated) customer and resumed by
   the gateway's notification; an embedded form read back at its deadline; then, with the pages no
   longer completing by themselves, a link renewed and cancelled (the waiting flow learns it from the
   gateway's notification) and a form cancelled.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from durapay.service.demo.merchant import DemoError
from durapay.service.demo.report import Row
from durapay.service.demo.runner import APPROVE, CHALLENGE, Runner, card, operation_id, session
from durapay.service.demo.stack import AUTO_COMPLETE_MS


class Payments(Runner):
    def cards(self) -> str | None:
        """Returns the contract id the schedule will charge."""
        self.phase("1. Card payments, refunds, captures, contracts, 3DS")
        sale = self.flow("MOTO sale", "moto", {"order": self.order(3000), "card": card()})
        sold = operation_id(sale)
        if sold:
            self.flow("partial refund of the sale", "refund", {"operationId": sold, "amount": 1000, "currency": "EUR"})
        else:
            self.skip("partial refund of the sale", "refund", "the sale did not succeed")
        auth = self.flow("MOTO authorization", "moto", {"order": self.order(2000), "card": card(), "captureType": "EXPLICIT"})
        authorized = operation_id(auth)
        capture = None
        if authorized:
            capture = self.flow(
                "capture of the authorization", "capture", {"operationId": authorized, "amount": 2000, "currency": "EUR"}
            )
        else:
            self.skip("capture of the authorization", "capture", "the authorization did not succeed")
        captured = operation_id(capture)
        if captured:
            self.flow("cancel of the capture (same day)", "cancel_capture", {"operationId": captured})
        else:
            self.skip("cancel of the capture (same day)", "cancel_capture", "the capture did not succeed")
        self.flow("card verification", "card_verification", {"order": self.order(0), "card": card()})
        self.flow("wallet payment", "wallet", {"order": self.order(), "walletPaymentData": {"pan": APPROVE}})
        self.flow("SVS: init, then pay", "svs", {"order": self.order(), "card": card()})

        contract = f"{self.run_id}-ct1"
        recurrence = {"action": "CONTRACT_CREATION", "contractId": contract, "contractType": "MIT_UNSCHEDULED"}
        order = {**self.order(100), "customerId": f"{self.run_id}-cust"}
        first = self.flow(
            "3-step payment creating a contract", "three_steps", {"order": order, "card": card(), "recurrence": recurrence}
        )
        if first and first["state"] == "succeeded":
            self.flow("MIT payment on the contract", "mit", {"order": self.order(990), "contractId": contract})
            self.flow("deactivate the contract", "deactivate_contract", {"contractId": contract})
        else:
            self.skip("MIT payment on the contract", "mit", "the contract was not created")
            self.skip("deactivate the contract", "deactivate_contract", "the contract was not created")

        self.flow(
            "3DS challenge answered at the ACS",
            "three_steps",
            {"order": self.order(2500), "card": card(CHALLENGE)},
            during=self._answer_challenge,
            note="PaRes from the simulator's ACS page, sent as signal 3ds_result",
        )
        scheduled = f"{self.run_id}-ct2"
        recurrence = {"action": "CONTRACT_CREATION", "contractId": scheduled, "contractType": "MIT_SCHEDULED"}
        order = {**self.order(100), "customerId": f"{self.run_id}-cust"}
        made = self.flow(
            "3-step payment creating a scheduled contract",
            "three_steps",
            {"order": order, "card": card(), "recurrence": recurrence},
        )
        return scheduled if made and made["state"] == "succeeded" else None

    def _answer_challenge(self, started: dict[str, Any]) -> None:
        waiting = self.merchant.wait(
            started["id"], lambda v: v["state"] == "waiting" or v["state"] in {"failed", "succeeded"}, what="reach the challenge"
        )
        if waiting["state"] != "waiting":
            return
        init = waiting["outputs"]["init"]
        pares = self.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"])
        self.merchant.signal(started["id"], "3ds_result", {"threeDSAuthResponse": pares})

    # -- 2. customer pages ---------------------------------------------------------------------------------

    def pages(self) -> None:
        self.phase("2. Hosted page, pay-by-link, embedded form (the customer is simulated)")
        assert self.stack.clock is not None
        expires = (datetime.fromtimestamp(self.stack.clock.now(), UTC) + timedelta(days=3)).date().isoformat()
        self.flow(
            "hosted payment page",
            "hpp",
            {"order": self.order(), "paymentSession": session(1500)},
            check=self._by_notification,
            note="resumed by the gateway's notification",
        )
        self.flow(
            "pay-by-link",
            "paybylink",
            {"order": self.order(), "paymentSession": session(1500), "expirationDate": expires},
            check=self._by_notification,
            note="resumed by the gateway's notification",
        )
        form = {"merchantUrl": "https://shop.example", "order": self.order(), "paymentSession": session(1500), "formSeconds": 3}
        self.flow("embedded form", "build", form, note="form filled by the customer; read back at the deadline")

        self.admin.set_auto_complete(None)  # from here the customer never pays: links and forms stay open
        try:
            self._link_renewed_and_cancelled(expires)
            self._form_cancelled()
        finally:
            self.admin.set_auto_complete(AUTO_COMPLETE_MS)

    def _link_renewed_and_cancelled(self, expires: str) -> None:
        body = {"order": self.order(), "paymentSession": session(1500), "expirationDate": expires}
        started = self.merchant.start("paybylink", body)
        try:
            waiting = self.merchant.wait(started["id"], lambda v: v["state"] == "waiting", what="wait for the customer")
        except DemoError as exc:
            self.add(
                Row(
                    "pay-by-link whose link was cancelled",
                    "paybylink",
                    started["id"],
                    [],
                    "error",
                    "failed",
                    0.0,
                    problem=str(exc),
                )
            )
            return
        link_id = waiting["outputs"]["create"]["paymentLink"]["linkId"]
        self.flow("renew the unpaid link", "paybylink_renew", {"linkId": link_id})
        later = (datetime.now(UTC) + timedelta(days=5)).date().isoformat()
        self.flow("modify the unpaid link", "paybylink_modify", {"linkId": link_id, "expirationDate": later})
        self.flow("cancel the unpaid link", "paybylink_cancel", {"linkId": link_id})
        # The gateway notifies the cancellation: the waiting flow learns its link will never be paid (from
        # the notification, or from the read the renewal's link_changed made it do meanwhile).
        began = time.monotonic()
        try:
            final = self.merchant.wait(started["id"], timeout=15)
            ended = (final.get("error") or {}).get("type")
            problem = "" if ended in {"LinkCancelled", "Cancelled"} else f"ended {ended}, not by the link's cancel"
        except DemoError as exc:
            final, problem = {"state": "error", "steps_done": []}, str(exc)
        self.add(
            Row(
                "pay-by-link whose link was cancelled",
                "paybylink",
                started["id"],
                list(final.get("steps_done") or []),
                final["state"],
                "failed",
                time.monotonic() - began,
                "ended by the link's cancel at the gateway",
                problem,
            )
        )

    def _form_cancelled(self) -> None:
        body = {"merchantUrl": "https://shop.example", "order": self.order(), "paymentSession": session(1500)}
        started = self.merchant.start("build", body)
        try:
            self.merchant.wait(started["id"], lambda v: v["state"] == "waiting", what="show its form")
        except DemoError as exc:
            self.add(Row("embedded form left unfilled", "build", started["id"], [], "error", "cancelled", 0.0, problem=str(exc)))
            return
        self._cancel_row("embedded form left unfilled", started, "the merchant gave up on it")
        # The merchant may also cancel a form's session by itself (build_cancel): its flow learns it from the
        # gateway's notification and ends failed (Cancelled).
        other = self.merchant.start("build", {**body, "order": self.order()})
        try:
            shown = self.merchant.wait(other["id"], lambda v: v["state"] == "waiting", what="show its form")
        except DemoError as exc:
            self.add(
                Row("cancel the form's payment", "build_cancel", other["id"], [], "error", "succeeded", 0.0, problem=str(exc))
            )
            return
        self.flow("cancel the form's payment", "build_cancel", {"sessionId": shown["outputs"]["create"]["sessionId"]})
