"""What the demo runs: every flow kind, as a merchant's backend would start them over the API.

Phases, each building on the last:

1. **cards**: MOTO (sale, then a partial refund; an authorization, then its capture and the capture's
   cancel), card verification, wallet, SVS, 3-step frictionless creating a contract, a MIT on it, its
   deactivation, and a 3DS challenge answered through the simulator's ACS page.
2. **customer pages**: hosted page and pay-by-link paid by the (simulated) customer and resumed by
   the gateway's notification; an embedded form read back at its deadline; then, with the pages no
   longer completing by themselves, a link renewed and cancelled and a form cancelled.
3. **reservations**: set-up, a reservation paid by its link, a no-show and an incremental charge, and a
   delayed charge two days after check-out (the shared clock is moved forward).
4. **a crash**: a MOTO whose gateway call hangs after committing; the worker running it is killed
   (SIGKILL); another worker takes the step over after the lease, reads the gateway first, and the card
   is charged once.
5. **a schedule**: monthly, three charges, fast-forwarded over three months.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console

from service.demo.merchant import DemoError, Merchant
from service.demo.report import Row, print_row
from service.demo.stack import AUTO_COMPLETE_MS, DemoStack

APPROVE = "4349940199004549"  # published approving VISA, frictionless
CHALLENGE = "5186151650005008"  # published approving MC, 3DS challenge
DAY = 86400.0
#: The schedule looks at a started charge this long after starting it (workflows.schedules.policy).
SCHEDULE_CHECK_SECONDS = 31.0

Check = Callable[[dict[str, Any]], str]


def card(pan: str = APPROVE) -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def session(amount: int) -> dict[str, Any]:
    return {"actionType": "PAY", "amount": str(amount), "language": "eng", "resultUrl": "https://shop.example/done"}


def operation_id(view: dict[str, Any] | None) -> str | None:
    if not view or view["state"] != "succeeded":
        return None
    value = ((view.get("outcome") or {}).get("operation") or {}).get("operationId")
    return str(value) if value else None


class Scenarios:
    def __init__(self, stack: DemoStack, merchant: Merchant, console: Console, run_id: str) -> None:
        self.stack = stack
        self.merchant = merchant
        self.console = console
        self.run_id = run_id
        self.rows: list[Row] = []
        self._ids = itertools.count(1)

    @property
    def admin(self) -> Any:
        assert self.stack.simulator is not None
        return self.stack.simulator.admin

    def order(self, amount: int = 1500) -> dict[str, Any]:
        return {"orderId": f"{self.run_id}-{next(self._ids):02d}", "amount": str(amount), "currency": "EUR"}

    # -- running one flow -------------------------------------------------------------------------------

    def flow(
        self,
        name: str,
        kind: str,
        body: dict[str, Any],
        *,
        expect: str = "succeeded",
        note: str = "",
        during: Callable[[dict[str, Any]], None] | None = None,
        check: Check | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any] | None:
        """Start ``kind``, let ``during`` act while it runs, wait for its end; add and print its row."""
        began = time.monotonic()
        flow_id = "-"
        try:
            with self.console.status(f"{name} ({kind})"):
                started = self.merchant.start(kind, body)
                flow_id = started["id"]
                if during is not None:
                    during(started)
                final = self.merchant.wait(flow_id, timeout=timeout)
                problem = check(final) if check is not None and final["state"] == expect else ""
        except DemoError as exc:
            self.add(Row(name, kind, flow_id, [], "error", expect, time.monotonic() - began, problem=str(exc)))
            return None
        steps = list(final.get("steps_done") or [])
        self.add(Row(name, kind, flow_id, steps, final["state"], expect, time.monotonic() - began, note, problem))
        return final

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print_row(self.console, row)

    def skip(self, name: str, kind: str, why: str) -> None:
        self.add(Row(name, kind, "-", [], "skipped", "succeeded", 0.0, problem=why))

    def phase(self, title: str) -> None:
        self.console.print(f"\n[bold]{title}[/bold]")

    # -- 1. cards -----------------------------------------------------------------------------------------

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

    def _by_notification(self, final: dict[str, Any]) -> str:
        if any(entry.get("by") == "notification" for entry in self.merchant.history(final["id"])):
            return ""
        return "not resumed by a notification"

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
        self.flow("cancel the unpaid link", "paybylink_cancel", {"linkId": link_id})
        # The gateway notifies the cancellation: the waiting flow learns its link will never be paid.
        began = time.monotonic()
        try:
            final = self.merchant.wait(started["id"], timeout=15)
            problem = self._by_notification(final)
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
                "ended by the cancellation's notification",
                problem,
            )
        )

    def _form_cancelled(self) -> None:
        body = {"merchantUrl": "https://shop.example", "order": self.order(), "paymentSession": session(1500)}
        started = self.merchant.start("build", body)
        try:
            waiting = self.merchant.wait(started["id"], lambda v: v["state"] == "waiting", what="show its form")
        except DemoError as exc:
            self.add(Row("embedded form left unfilled", "build", started["id"], [], "error", "cancelled", 0.0, problem=str(exc)))
            return
        self._cancel_row("embedded form left unfilled", started, "the merchant gave up on it")
        self.flow("cancel the form's payment", "build_cancel", {"sessionId": waiting["outputs"]["create"]["sessionId"]})

    def _cancel_row(self, name: str, started: dict[str, Any], reason: str) -> None:
        began = time.monotonic()
        try:
            final = self.merchant.cancel(started["id"], reason)
        except DemoError as exc:
            self.add(Row(name, started["kind"], started["id"], [], "error", "cancelled", 0.0, problem=str(exc)))
            return
        steps = list(final.get("steps_done") or [])
        self.add(
            Row(
                name,
                started["kind"],
                started["id"],
                steps,
                final["state"],
                "cancelled",
                time.monotonic() - began,
                "cancelled over the API",
            )
        )

    # -- 3. reservations -------------------------------------------------------------------------------------

    def reservations(self) -> None:
        self.phase("3. Reservations: set-up, paid reservation, no-show, incremental, delayed charge")
        structure = f"{self.run_id}-hotel"
        text = "UGF5bWVudCBkdWUgYXQgY2hlY2staW4u"  # base64 of the terms' text
        setup_body: dict[str, Any] = {
            "service": {"serviceName": "DISPUTELESS", "terminalId": "T-1", "enabled": "Y"},
            "termsAndConditions": [{"name": f"{self.run_id}-terms", "termsAndConditions": [{"language": "eng", "text": text}]}],
            "structures": [
                {"structureId": structure, "structureName": "Hotel Aurora", "status": "ACTIVE", "checkInFromTime": "14:00"}
            ],
        }
        setup = self.flow("reservation set-up (structure, terms)", "reservation_setup", setup_body)
        if not setup or setup["state"] != "succeeded":
            for kind in ("reservation", "no_show", "incremental", "delay_charge"):
                self.skip(f"{kind} (no set-up)", kind, "the set-up did not succeed")
            return
        outcome = setup["outcome"]
        reservation_id = f"{self.run_id}-res"
        reservation = {
            "reservationId": reservation_id,
            "amount": "20000",
            "currency": "EUR",
            "deposit": "5000",
            "reservationType": "PREPAID_REFUNDABLE",
            "structureId": outcome["structureIds"][0],
            "termsAndConditionsIds": outcome["termsAndConditionsIds"],
            "customerName": "Ada",
            "customerSurname": "Lovelace",
        }
        paid = self.flow("reservation paid by its link", "reservation", {"reservation": reservation}, check=self._by_notification)
        original = operation_id(paid)
        if original is None:
            for kind in ("no_show", "incremental", "delay_charge"):
                self.skip(f"{kind} (no paid reservation)", kind, "the reservation was not paid")
            return
        charge = {"reservationId": reservation_id, "currency": "EUR", "originalOperationId": original}
        self.flow("no-show charge", "no_show", {**charge, "amount": 5000, "description": "no-show"})
        self.flow("incremental charge (room service)", "incremental", {**charge, "amount": 3000, "description": "room service"})
        self._delayed_charge(reservation_id, original)

    def _delayed_charge(self, reservation_id: str, original: str) -> None:
        clock = self.stack.clock
        assert clock is not None
        run_at = datetime.fromtimestamp(clock.now() + 2 * DAY, UTC).isoformat()
        body = {
            "reservationId": reservation_id,
            "originalOperationId": original,
            "amount": 1200,
            "currency": "EUR",
            "description": "minibar, charged after check-out",
            "runAt": run_at,
        }

        def fast_forward(started: dict[str, Any]) -> None:
            self.merchant.wait(started["id"], lambda v: v["state"] == "sleeping", what="start sleeping until runAt")
            self.advance(2 * DAY + 5)

        self.flow(
            "delayed charge 2 days after check-out",
            "delay_charge",
            body,
            during=fast_forward,
            note="durable timer; clock moved 2 days forward",
        )

    def advance(self, seconds: float) -> None:
        """Move the engine's shared clock and the simulator's clock forward together."""
        assert self.stack.clock is not None
        self.stack.clock.advance(seconds)
        self.admin.advance_clock(seconds)
        time.sleep(0.2)  # every process re-reads the shared offset within 50 ms

    # -- 4. a worker killed mid-step -----------------------------------------------------------------------

    def crash(self) -> None:
        self.phase("4. A worker killed mid-step (SIGKILL); the flow survives and charges once")
        order = self.order(4200)
        self.admin.set_faults(mode="hang", operation="create_moto_order", count=1, seconds=5, commit=True)
        killed: list[str] = []

        def kill_the_worker(started: dict[str, Any]) -> None:
            assert self.stack.runtime is not None
            engine = self.stack.runtime.engine
            deadline = time.monotonic() + 20
            while True:
                record = engine.get(started["id"])
                if record.state.value == "running" and record.lease_owner:
                    break
                if time.monotonic() > deadline:
                    raise DemoError("the payment step never started")
                time.sleep(0.05)
            worker = self.stack.kill_worker_of(record.lease_owner)
            if worker is None:
                raise DemoError(f"no demo worker named {record.lease_owner}")
            killed.append(worker.name)
            self.console.print(
                f"  killed {worker.name} (pid {worker.process.pid}) while it ran step {record.step}", highlight=False
            )
            self.stack.add_worker()

        def charged_once(final: dict[str, Any]) -> str:
            charges = [op for op in self.admin.operations(order_id=order["orderId"]) if op.get("operationType") != "REFUND"]
            if len(charges) != 1:
                return f"{len(charges)} gateway operations for the order, expected 1"
            if not any(
                entry.get("what", "").startswith("claimed pay after the lease ran out")
                for entry in self.merchant.history(final["id"])
            ):
                return "the step was not taken over after the lease"
            return ""

        try:
            self.flow(
                "MOTO surviving a killed worker",
                "moto",
                {"order": order, "card": card()},
                during=kill_the_worker,
                check=charged_once,
                timeout=60,
                note="taken over after the lease, reconciled, charged once",
            )
        finally:
            self.admin.clear_faults()

    # -- 5. a schedule over three months ---------------------------------------------------------------------

    def schedule(self, contract: str | None) -> None:
        self.phase("5. A monthly schedule, fast-forwarded over three months")
        if contract is None:
            self.skip("monthly schedule", "schedule", "no scheduled contract was created")
            return
        assert self.stack.clock is not None
        began = time.monotonic()
        start = datetime.fromtimestamp(self.stack.clock.now() + 120, UTC).replace(microsecond=0, tzinfo=None)
        body = {
            "contractId": contract,
            "amount": 2900,
            "currency": "EUR",
            "description": "Streaming, monthly",
            "rule": {"every": "month", "day": start.day},
            "timezone": "UTC",
            "start": start.isoformat(),
            "count": 3,
        }
        try:
            created = self.merchant.create_schedule(body, key=f"{self.run_id}-monthly")
            for number in range(1, 4):
                self._one_charge(created["id"], number)
            final = self.merchant.wait_schedule(created["id"], lambda s: s["state"] == "completed", timeout=20, what="complete")
        except DemoError as exc:
            self.add(
                Row(
                    "monthly schedule (3 charges)",
                    "schedule",
                    "-",
                    [],
                    "error",
                    "completed",
                    time.monotonic() - began,
                    problem=str(exc),
                )
            )
            return
        counts = final["counts"]
        note = f"{counts['charged']} charged, {counts['declined']} declined"
        self.add(
            Row(
                "monthly schedule (3 charges)",
                "schedule",
                final["id"],
                [],
                final["state"],
                "completed",
                time.monotonic() - began,
                note,
            )
        )

    def _one_charge(self, schedule_id: str, number: int) -> None:
        assert self.stack.clock is not None
        began = time.monotonic()
        current = self.merchant.schedule(schedule_id)
        next_run = datetime.fromisoformat(current["nextRun"].replace("Z", "+00:00")).timestamp()
        self.advance(max(0.0, next_run - self.stack.clock.now()) + 1)
        with self.console.status(f"schedule charge {number}/3 on {current['nextRun'][:10]}"):
            fired = self.merchant.wait_schedule(
                schedule_id, lambda s: any(a["started"] for a in s["open"]), timeout=20, what="fire"
            )
            flow_id = next(a["flow"] for a in fired["open"] if a["started"])
            final = self.merchant.wait(flow_id, timeout=30)
            self.advance(SCHEDULE_CHECK_SECONDS)
            self.merchant.wait_schedule(
                schedule_id,
                lambda s: s["counts"]["charged"] >= number or s["state"] != "active",
                timeout=20,
                what=f"record charge {number}",
            )
        steps = list(final.get("steps_done") or [])
        self.add(
            Row(
                f"schedule charge {number}/3 ({current['nextRun'][:10]})",
                "mit",
                flow_id,
                steps,
                final["state"],
                "succeeded",
                time.monotonic() - began,
                "fired by the scheduler",
            )
        )
