"""The flow kinds the whole-flow model starts, and which money at the gateway is each flow's.

``flow_model.FlowWorld.start`` asks here for a kind's input. What a flow acts on is made outside any flow,
before any fault, with the gateway client (orders ``k...``, which no flow names): a payment for a refund, an
authorization for a capture, an authorization and its capture for a cancel of that capture, a reservation
paid through its link for a no-show or delayed charge. Each flow gets its own, so that every operation at the
gateway has exactly one owner (:func:`owner_of`):

* a payment (no parent operation) on an order the flow made (its order id, or one derived from it);
* a refund, capture or cancel whose parent is the flow's own payment, of the flow's own type;
* a reservation charge on the flow's own reservation order, of the flow's own type.

Merchant order ids come in two lengths: short ones, and ids at the gateway's limit (18 characters) that
share their first 16 with another flow's, so that derived order ids (``<orderId>-2``) would collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from durapay.gateway import Catalogue, GatewayClient
from durapay.simulator import SimulatorAdmin

APPROVE = "4349940199004549"  # approving VISA, frictionless
CHALLENGE = "5186151650005008"  # approving MC, 3DS challenge
DECLINE = "4349940199997007"  # declining VISA

#: Kinds the model starts ("long": a hosted page whose order id is at the limit and shares 16 characters).
KINDS = [
    "moto",
    "three_steps",
    "hpp",
    "mit",
    "refund",
    "capture",
    "cancel_capture",
    "no_show",
    "delay_charge",
    "paybylink",
    "build",
    "long",
]
#: Kinds whose money only the flow's own calls make (no customer page): no such flow may be failed or
#: cancelled, ever, while its money is at the gateway.
OWN_CALLS = frozenset({"moto", "three_steps", "mit", "refund", "capture", "cancel_capture", "no_show", "delay_charge"})
#: Operation types that are a flow's money, per kind (payments: any type without a parent operation).
POST_TYPES = {
    "refund": frozenset({"REFUND", "VOID"}),
    "capture": frozenset({"CAPTURE"}),
    "cancel_capture": frozenset({"CANCEL"}),
    "no_show": frozenset({"NOSHOW"}),
    "delay_charge": frozenset({"DELAY_CHARGE"}),
}
PAYMENT_TYPES = frozenset({"AUTHORIZATION", "CAPTURE", "CARD_VERIFICATION"})
#: Results of an operation that moved money (a payment, a refund, a capture, a cancel of a capture: EXECUTED);
#: a payment CANCELED is a customer who gave up, no money.
MOVED = frozenset({"AUTHORIZED", "EXECUTED", "REFUNDED", "VOIDED"})


def card(pan: str) -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def session() -> dict[str, Any]:
    return {"actionType": "PAY", "amount": "1500", "language": "eng", "resultUrl": "https://shop.example/r"}


@dataclass
class ModelFlow:
    """A flow the model started: its kind, its base order id, and what of the gateway's money is its own."""

    flow_id: str
    kind: str
    base: str
    pool: str = ""  # the payment a refund, capture or cancel acts on (post-operations)
    charge_order: str = ""  # the reservation's gateway order (charges)
    orders: set[str] = field(default_factory=set)  # every gateway order id the flow was seen to make
    scheduled: bool = False  # a schedule's charge (the model did not start it)
    expired: bool = False
    charges_at_expiry: int = 0
    #: The pages the customer was given, by gateway order id: (kind, what the customer opens: the order
    #: id of a hosted page, a link id, a form's session id); kept when the flow's record expires.
    pages: dict[str, tuple[str, str]] = field(default_factory=dict)

    def owns(self, op: dict[str, Any]) -> bool:
        """Whether gateway operation ``op`` is this flow's money (see the module docstring)."""
        types = POST_TYPES.get(self.kind)
        if self.pool:
            return op.get("parentOperationId") == self.pool and op["operationType"] in (types or ())
        if self.charge_order:
            return op["orderId"] == self.charge_order and op["operationType"] in (types or ())
        if op.get("parentOperationId") or op["operationType"] not in PAYMENT_TYPES:
            return False
        return op["orderId"] == self.base or op["orderId"] in self.orders


def owner_of(flows: list[ModelFlow], op: dict[str, Any]) -> ModelFlow | None:
    found = [flow for flow in flows if flow.owns(op)]
    assert len(found) <= 1, f"operation {op['operationId']} owned by {[flow.flow_id for flow in found]}"
    return found[0] if found else None


#: How many flows of one kind an example may start (the model starts at most four flows).
STOCK = 4


@dataclass
class Inputs:
    """Builds each kind's input. What a kind acts on is made outside any flow when the example begins,
    before any fault is set (a fault aimed at a MOTO payment must hit a flow's, not the set-up's): a stock
    per kind, taken as flows start."""

    client: GatewayClient
    admin: SimulatorAdmin
    example: int
    now: datetime
    contract: str
    made: int = 0
    stock: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stock = {
            "refund": [self.pool(explicit=False, captured=False) for _ in range(STOCK)],
            "capture": [self.pool(explicit=True, captured=False) for _ in range(STOCK)],
            "cancel_capture": [self.pool(explicit=True, captured=True) for _ in range(STOCK)],
            "no_show": [self.paid_reservation() for _ in range(STOCK)],
            "delay_charge": [self.paid_reservation() for _ in range(STOCK)],
        }

    def start(self, kind: str, variant: str, base: str) -> tuple[str, dict[str, Any], ModelFlow]:
        """(engine kind, input, the model's flow without its id)."""
        order = {"orderId": base, "amount": "1500", "currency": "EUR"}
        pan = {"decline": DECLINE, "challenge": CHALLENGE}.get(variant, APPROVE)
        flow = ModelFlow("", kind, base)
        if kind == "moto":
            return kind, {"order": order, "card": card(DECLINE if variant == "decline" else APPROVE)}, flow
        if kind == "three_steps":
            return kind, {"order": order, "card": card(pan), "challengeTimeoutSeconds": 300}, flow
        if kind == "mit":
            return kind, {"order": order, "contractId": self.contract}, flow
        if kind in {"hpp", "long"}:
            if kind == "long":
                order["orderId"] = flow.base = f"L{self.example:x}".ljust(16, "o") + base[-2:].rjust(2, "0")
            return "hpp", {"order": order, "paymentSession": session(), "waitSeconds": 600}, flow
        if kind == "paybylink":
            # A link for 80 days (the "approve" draws: a link's payment does not depend on them), longer than
            # the retention, so that a flow must be kept as long as its link can be paid; or for a day.
            day = (self.now + timedelta(days=80 if variant == "approve" else 1)).strftime("%Y-%m-%d")
            return kind, {"order": order, "paymentSession": session(), "expirationDate": day}, flow
        if kind == "build":
            data = {"merchantUrl": "https://shop.example", "order": order, "paymentSession": session(), "formSeconds": 600}
            return kind, data, flow
        if kind in {"refund", "capture", "cancel_capture"}:
            pool, target = self.stock[kind].pop()
            flow.pool = pool
            return kind, {"operationId": target}, flow
        original = self.stock[kind].pop()
        flow.charge_order = str(original["orderId"])
        data = {"reservationId": original["reservationId"], "originalOperationId": original["operationId"]}
        data |= {"amount": 500, "currency": "EUR"}
        if kind == "delay_charge":
            data["runAt"] = (self.now + timedelta(hours=1)).isoformat()
        return kind, data, flow

    def _order(self) -> dict[str, Any]:
        self.made += 1
        return {"orderId": f"k{self.example}s{self.made}", "amount": "1500", "currency": "EUR"}

    def pool(self, *, explicit: bool, captured: bool) -> tuple[str, str]:
        """(the payment, what the flow acts on): a sale (for a refund), an authorization (capture), or an
        authorization and its capture (cancel of that capture)."""
        body: dict[str, Any] = {"order": self._order(), "card": card(APPROVE)}
        if explicit:
            body["captureType"] = "EXPLICIT"
        payment = self.client.call(Catalogue.create_moto_order, request=body).operation.operationId
        if not captured:
            return payment, payment
        capture = self.client.call(Catalogue.capture_operation, payment, request={}, idempotency_key=f"k{payment}")
        return payment, capture.operationId

    def paid_reservation(self) -> dict[str, Any]:
        """A reservation paid through its link: its id, its order and its original operation."""
        self.made += 1
        reservation_id = f"k{self.example}r{self.made}"
        reservation = {"reservationId": reservation_id, "amount": "1500", "currency": "EUR"}
        self.client.call(Catalogue.create_reservation, request={"reservation": reservation})
        link = self.client.call(Catalogue.create_reservation_paybylink, reservation_id, request={})
        paid = self.admin.complete_link(str(link.paymentLink.linkId), pan=APPROVE)
        original = self.client.call(Catalogue.get_operation, paid["operationId"])
        return {"reservationId": reservation_id, "operationId": paid["operationId"], "orderId": original.orderId}


def now_of(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)
