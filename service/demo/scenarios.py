"""What the demo runs: every flow kind, as a merchant's backend would start them over the API.

Phases 1 and 2 (cards, customer pages) are in :mod:`service.demo.payments`; here, building on them:

3. **reservations**: set-up, a reservation paid by its link, a no-show and an incremental charge, and a
   delayed charge two days after check-out (the shared clock is moved forward).
4. **a crash**: a MOTO whose gateway call hangs after committing; the worker running it is killed
   (SIGKILL); another worker takes the step over after the lease, reads the gateway first, and the card
   is charged once.
5. **a schedule**: monthly, three charges, fast-forwarded over three months.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from durapay.service.demo.merchant import DemoError
from durapay.service.demo.payments import Payments
from durapay.service.demo.report import Row
from durapay.service.demo.runner import DAY, card, operation_id

#: The schedule looks at a started charge this long after starting it (workflows.schedules.policy).
SCHEDULE_CHECK_SECONDS = 31.0


class Scenarios(Payments):
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
            self.console.print(f"  killed {worker.name} (pid {worker.pid}) while it ran step {record.step}", highlight=False)
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
