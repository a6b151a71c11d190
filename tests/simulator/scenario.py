"""Builds the prerequisites of a gateway call through the real client: paid orders, links, sessions, reservations.

Each method makes fresh objects with unique ids, so a test can ask for what it needs in any order.
"""

from __future__ import annotations

import base64
import itertools
from datetime import timedelta
from typing import Any

from durapay.gateway import Catalogue, GatewayClient
from durapay.simulator import SimulatorServer
from tests.simulator.support import APPROVE, card, order, session


class Scenario:
    def __init__(self, client: GatewayClient, sim: SimulatorServer) -> None:
        self.client = client
        self.sim = sim
        self._ids = itertools.count(1)
        self.last_order_id = ""

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def today_plus(self, days: int) -> str:
        return (self.sim.admin.now() + timedelta(days=days)).date().isoformat()

    # -- payments -----------------------------------------------------------------------------------

    def moto(self, *, explicit: bool = False, amount: int = 1500, pan: str = APPROVE) -> str:
        """A paid MOTO order; returns its operation id (CAPTURE/EXECUTED, or AUTHORIZATION/AUTHORIZED)."""
        self.last_order_id = self.new_id("moto")
        request: dict[str, Any] = {"order": order(self.last_order_id, amount), "card": card(pan)}
        if explicit:
            request["captureType"] = "EXPLICIT"
        return self.client.call(Catalogue.create_moto_order, request=request).operation.operationId

    def contract(self, customer_id: str = "cust-1") -> str:
        """A contract created by a first payment (3 steps, frictionless) with CONTRACT_CREATION."""
        contract_id = self.new_id("ctr")
        order_id = self.new_id("first")
        recurrence = {"action": "CONTRACT_CREATION", "contractId": contract_id, "contractType": "MIT_UNSCHEDULED"}
        init = self.client.call(
            Catalogue.three_steps_init,
            request={"order": order(order_id, customerId=customer_id), "card": card(), "recurrence": recurrence},
        )
        self.client.call(
            Catalogue.three_steps_payment,
            request={"operationId": init.operation.operationId, "order": order(order_id, customerId=customer_id), "card": card()},
        )
        return contract_id

    def link(self, *, notification_url: str | None = None, days: int = 10) -> str:
        extra: dict[str, Any] = {"notificationUrl": notification_url} if notification_url else {}
        request = {
            "order": order(self.new_id("pbl")),
            "paymentSession": session(**extra),
            "expirationDate": self.today_plus(days),
        }
        return self.client.call(Catalogue.create_paybylink_v3, request=request).paymentLink.linkId

    def build(self, version: str = "3", *, filled: bool = False, pan: str = APPROVE) -> str:
        request = {
            "merchantUrl": "https://shop.example",
            "order": order(self.new_id("bld")),
            "paymentSession": session(paymentService="CARDS"),
            "version": version,
        }
        session_id = self.client.call(Catalogue.create_build_order, request=request).sessionId
        if filled:
            self.sim.admin.fill_build_form(session_id, pan=pan)
        return session_id

    # -- reservation area ---------------------------------------------------------------------------

    def structure(self) -> str:
        structure_id = self.new_id("str")
        body = {"structure": {"structureId": structure_id, "structureName": f"Hotel {structure_id}", "status": "ACTIVE"}}
        self.client.call(Catalogue.create_structure, request=body)
        return structure_id

    def agency(self) -> str:
        agency_id = self.new_id("agy")
        self.client.call(Catalogue.create_agency, request={"agency": {"agencyId": agency_id, "agencyName": "Travel"}})
        return agency_id

    def condition_texts(self) -> list[dict[str, str]]:
        text = base64.b64encode(b"<p>No refunds after check-in.</p>").decode()
        return [{"language": "eng", "textStructureCondition": text, "textCancellationCondition": text}]

    def reservation(self, *, paid: bool = True, reservation_type: str = "PREPAID_REFUNDABLE", amount: int = 20000) -> str:
        reservation_id = self.new_id("res")
        body = {
            "reservation": {
                "reservationId": reservation_id,
                "amount": str(amount),
                "currency": "EUR",
                "deposit": "5000",
                "reservationType": reservation_type,
                "structureId": self.structure(),
                "checkInDate": self.today_plus(3),
                "checkOutDate": self.today_plus(5),
                "customerName": "Ada",
                "customerSurname": "Lovelace",
            }
        }
        self.client.call(Catalogue.create_reservation, request=body)
        if paid:
            link = self.client.call(Catalogue.create_reservation_paybylink, reservation_id, request={})
            self.sim.admin.complete_link(link.paymentLink.linkId)
        return reservation_id

    def original_operation(self, reservation_id: str) -> str:
        answer = self.client.call(Catalogue.get_reservation, reservation_id)
        return next(op.operationId for op in answer.operations if op.operationResult in ("EXECUTED", "AUTHORIZED"))
