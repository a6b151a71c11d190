"""The flows ``durapay chaos`` runs: every payment kind the simulator completes by itself, with follow-ups.

Each planned flow is a :class:`Planned` (kind, input, when to start it, optional follow-up). Card
payments (MOTO sale and authorization, card verification, wallet, SVS, 3-step), hosted pages paid by
the simulated customer (hosted page, pay-by-link, embedded form) and MIT payments on a contract made by
a 3-step payment; a sale may be partly refunded, an authorization captured. One 3-step payment creates
a scheduled contract that a schedule charges every minute (:mod:`service.chaos.run` creates it).

A start is acknowledged when ``Engine.start`` returns; until then it is retried under the same
idempotency key, so a start that reached Redis before an outage is not made twice.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from durapay.workflows.engine import Engine, NotDurable

APPROVE = "4349940199004549"  # published approving VISA, frictionless
CHALLENGE = "5186151650005008"  # published approving MC, 3DS challenge
#: (scenario, weight): how often each appears in the mix.
MIX: tuple[tuple[str, int], ...] = (
    ("moto_sale", 4),
    ("moto_auth", 3),
    ("card_verification", 1),
    ("wallet", 1),
    ("svs", 2),
    ("three_steps", 2),
    ("challenge", 1),
    ("reservation", 2),
    ("contract_mit", 2),
    ("hpp", 2),
    ("paybylink", 2),
    ("build", 1),
)
#: Operations the mix calls: where the fault campaign aims.
OPERATIONS = (
    "create_moto_order",
    "card_verification",
    "wallet_pay",
    "svs_init_order",
    "svs_pay_operation",
    "three_steps_init",
    "three_steps_payment",
    "create_mit_order",
    "create_hpp_order",
    "create_paybylink_v3",
    "create_build_order",
    "refund_operation",
    "capture_operation",
    "create_reservation",
    "create_reservation_paybylink",
    "create_no_show",
    "create_incremental",
    "create_delay_charge",
    "get_order",
)
#: The reservation charges a paid reservation is followed by (one, drawn from the seed).
RESERVATION_CHARGES = ("no_show", "incremental", "delay_charge")


def card(pan: str = APPROVE) -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def session(amount: int) -> dict[str, Any]:
    return {"actionType": "PAY", "amount": str(amount), "language": "eng", "resultUrl": "https://shop.example/done"}


@dataclass
class Planned:
    """One flow to start: ``follow`` names the follow-up started once it succeeds (refund, capture, mit)."""

    number: int
    kind: str
    body: dict[str, Any]
    at: float
    follow: str = ""
    parent: Planned | None = None
    flow_id: str = ""
    acked_at: float | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"chaos-{self.number}"

    @property
    def order_id(self) -> str:
        """The gateway order the flow pays on (a reservation's, for a reservation and its charges)."""
        if self.kind == "reservation":
            return str(self.body["reservation"]["reservationId"])
        if self.kind in RESERVATION_CHARGES:
            return str(self.body["reservationId"])
        return str((self.body.get("order") or {}).get("orderId") or "")

    @property
    def challenge(self) -> bool:
        """A 3-step payment whose card asks for a 3DS challenge: the customer answers it at the ACS."""
        return self.kind == "three_steps" and self.body.get("card", {}).get("pan") == CHALLENGE

    @property
    def parent_operation(self) -> str:
        return str(self.body.get("operationId") or "")


class Workload:
    """Plans the flows from the seed, starts them on time, and starts follow-ups of the ones that succeed."""

    def __init__(self, engine: Engine, rng: random.Random, tag: str, flows: int, window: float) -> None:
        self.engine = engine
        self.rng = rng
        self.tag = tag
        self.limit = flows
        self.planned: list[Planned] = []
        self.started: list[Planned] = []
        self.waiting_parents: list[Planned] = []
        self.scheduled_contract = f"{tag}-sched"
        #: The reservation set-up's outcome (structure and terms ids) once it succeeded; False if it failed.
        self.hotel: dict[str, Any] | bool | None = None
        self._plan(window)

    # -- the plan ---------------------------------------------------------------------------------------

    def _order(self, number: int, amount: int) -> dict[str, Any]:
        return {"orderId": f"{self.tag}-{number}", "amount": str(amount), "currency": "EUR"}

    def _plan(self, window: float) -> None:
        names = [name for name, _ in MIX]
        weights = [weight for _, weight in MIX]
        # The scheduled contract comes first: the schedule needs it.
        contract = {"action": "CONTRACT_CREATION", "contractId": self.scheduled_contract, "contractType": "MIT_SCHEDULED"}
        first = {"order": {**self._order(0, 100), "customerId": f"{self.tag}-c"}, "card": card(), "recurrence": contract}
        self.planned.append(Planned(0, "three_steps", first, 0.0, follow="schedule"))
        self.planned.append(Planned(1, "reservation_setup", self._setup(), 0.0, follow="hotel"))
        budget = self.limit - 2
        number = 2
        times = sorted(self.rng.uniform(0.0, window) for _ in range(budget))
        for at in times:
            if budget <= 0:
                break
            name = self.rng.choices(names, weights)[0]
            planned = self._scenario(name, number, at)
            budget -= 1 + (1 if planned.follow else 0)
            if budget < 0:  # no room for its follow-up
                planned.follow = ""
            self.planned.append(planned)
            number += 1

    def _setup(self) -> dict[str, Any]:
        text = "UGF5bWVudCBkdWUgYXQgY2hlY2staW4u"  # base64 of the terms' text
        return {
            "service": {"serviceName": "DISPUTELESS", "terminalId": "T-1", "enabled": "Y"},
            "termsAndConditions": [{"name": f"{self.tag}-terms", "termsAndConditions": [{"language": "eng", "text": text}]}],
            "structures": [{"structureId": f"{self.tag}-hotel", "structureName": "Hotel Chaos", "status": "ACTIVE"}],
        }

    def reservation_ready(self, planned: Planned) -> bool | None:
        """For a reservation: fill in the set-up's ids (True), wait for the set-up (None), or drop it (False)."""
        if planned.kind != "reservation":
            return True
        if self.hotel is None:
            return None
        if self.hotel is False or not isinstance(self.hotel, dict):
            return False
        planned.body["reservation"]["structureId"] = self.hotel["structureIds"][0]
        planned.body["reservation"]["termsAndConditionsIds"] = self.hotel["termsAndConditionsIds"]
        return True

    def _scenario(self, name: str, number: int, at: float) -> Planned:
        amount = 1000 + self.rng.randrange(0, 5000, 10)
        order = self._order(number, amount)
        if name == "moto_sale":
            follow = "refund" if self.rng.random() < 0.6 else ""
            return Planned(number, "moto", {"order": order, "card": card()}, at, follow)
        if name == "moto_auth":
            return Planned(number, "moto", {"order": order, "card": card(), "captureType": "EXPLICIT"}, at, "capture")
        if name == "card_verification":
            return Planned(number, "card_verification", {"order": self._order(number, 0), "card": card()}, at)
        if name == "wallet":
            return Planned(number, "wallet", {"order": order, "walletPaymentData": {"pan": APPROVE}}, at)
        if name in ("svs", "three_steps"):
            return Planned(number, name, {"order": order, "card": card()}, at)
        if name == "challenge":
            return Planned(number, "three_steps", {"order": order, "card": card(CHALLENGE)}, at)
        if name == "reservation":
            reservation = {
                "reservationId": f"{self.tag}-r{number}",
                "amount": str(amount * 4),
                "currency": "EUR",
                "deposit": str(amount),
                "reservationType": "PREPAID_REFUNDABLE",
                "customerName": "Ada",
                "customerSurname": "Lovelace",
            }
            return Planned(number, "reservation", {"reservation": reservation}, at, "reservation_charge")
        if name == "contract_mit":
            recurrence = {"action": "CONTRACT_CREATION", "contractId": f"{self.tag}-k{number}", "contractType": "MIT_UNSCHEDULED"}
            body: dict[str, Any] = {"order": {**order, "customerId": f"{self.tag}-c"}, "card": card(), "recurrence": recurrence}
            return Planned(number, "three_steps", body, at, "mit")
        if name == "hpp":
            return Planned(number, "hpp", {"order": order, "paymentSession": session(amount), "waitSeconds": 40}, at)
        if name == "paybylink":
            expires = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
            body = {"order": order, "paymentSession": session(amount), "expirationDate": expires}
            return Planned(number, "paybylink", body, at)
        body = {"merchantUrl": "https://shop.example", "order": order, "paymentSession": session(amount), "formSeconds": 8}
        return Planned(number, "build", body, at)

    def follow_up(self, parent: Planned, outcome: dict[str, Any]) -> Planned | None:
        """The follow-up of a parent that succeeded (``outcome`` is its outcome)."""
        operation = str(((outcome.get("operation") or {}).get("operationId")) or "")
        number = 10_000 + parent.number
        amount = int((parent.body.get("order") or {}).get("amount") or 0)
        if parent.follow == "refund" and operation:
            body: dict[str, Any] = {"operationId": operation, "amount": amount // 2, "currency": "EUR"}
            return Planned(number, "refund", body, 0.0, parent=parent)
        if parent.follow == "capture" and operation:
            body = {"operationId": operation, "amount": amount, "currency": "EUR"}
            return Planned(number, "capture", body, 0.0, parent=parent)
        if parent.follow == "reservation_charge" and operation:
            kind = self.rng.choice(RESERVATION_CHARGES)
            reservation = parent.body["reservation"]["reservationId"]
            body = {"reservationId": reservation, "originalOperationId": operation, "amount": 700, "currency": "EUR"}
            body["description"] = f"chaos {kind}"
            if kind == "delay_charge":
                body["runAt"] = (datetime.now(UTC) + timedelta(seconds=self.rng.uniform(5, 30))).isoformat()
            return Planned(number, kind, body, 0.0, parent=parent)
        if parent.follow == "mit":
            contract = parent.body["recurrence"]["contractId"]
            return Planned(number, "mit", {"order": self._order(number, 990), "contractId": contract}, 0.0, parent=parent)
        return None

    # -- starting ---------------------------------------------------------------------------------------

    def start(self, planned: Planned, patience: float = 90.0) -> bool:
        """Start ``planned`` until Redis acknowledges it (retrying under its key through an outage)."""
        deadline = time.monotonic() + patience
        while True:
            try:
                record = self.engine.start(planned.kind, planned.body, key=planned.key)
            except (redis.RedisError, NotDurable, OSError) as exc:
                planned.errors.append(type(exc).__name__)
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
                continue
            planned.flow_id = record.id
            planned.acked_at = time.time()
            self.started.append(planned)
            if planned.follow:
                self.waiting_parents.append(planned)
            return True

    def due(self, elapsed: float) -> list[Planned]:
        """The planned flows whose start time has come, in order (removed from the plan)."""
        ready = [p for p in self.planned if p.at <= elapsed]
        self.planned = [p for p in self.planned if p.at > elapsed]
        return ready
