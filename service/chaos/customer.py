"""The simulated customer: pays the page, link or form a flow shows (or passes its 3DS challenge), once.

Not the simulator's ``auto_complete`` (which pays every page the gateway ever created): a page whose
creation answer was lost never reached anyone, and the engine may rightly leave it for a new order. A
customer pays what the flow shows (its ``customer_url``, once the flow waits for them), and pays once.
"""

from __future__ import annotations

from typing import Any

from durapay.workflows.engine import STOPPED, Engine, FlowRecord, FlowState

CUSTOMER_KINDS = frozenset({"hpp", "paybylink", "build", "reservation", "challenge"})


class Customer:
    def __init__(self, engine: Engine, admin: Any) -> None:
        self.engine = engine
        self.admin = admin
        self.pending: dict[str, str] = {}  # flow id -> kind
        self.paid = 0
        self.failures: list[str] = []
        #: The flows whose customer has paid (or tried to): a customer pays once per page.
        self.done: set[str] = set()

    def expect(self, flow_id: str, kind: str) -> None:
        if kind in CUSTOMER_KINDS:
            self.pending[flow_id] = kind

    def expect_again(self, flow_id: str, kind: str, *, new_order: bool) -> None:
        """After an operator's retry: a failed flow starts over on a new order (``new_order``), whose new page
        its customer pays; a flow that stopped for a person before its customer paid waits for them again."""
        if new_order:
            self.done.discard(flow_id)
        if kind in CUSTOMER_KINDS and flow_id not in self.done:
            self.pending[flow_id] = kind

    def pay_now(self, flow_id: str, kind: str, record: FlowRecord) -> bool:
        """The customer, whose page was still open, pays it now whatever the flow's state (``record`` is the
        flow as it showed the page). False if they had paid already or the page refused."""
        if flow_id in self.done:
            return False
        self.pending.pop(flow_id, None)
        self.done.add(flow_id)
        try:
            self._pay(kind, flow_id, record.order_id, record.outputs)
        except Exception as exc:  # noqa: BLE001 - the page refused (expired, already paid): noted
            self.failures.append(f"{kind} {flow_id} (after its cancel): {exc}")
            return False
        self.paid += 1
        return True

    def act(self) -> None:
        """Pay every flow now waiting for its customer (a failed try is tried again at the next call)."""
        for flow_id, kind in list(self.pending.items()):
            try:
                record = self.engine.get(flow_id)
            except Exception:  # noqa: BLE001, S112 - Redis away or the flow gone: the reconcile reports a lost flow
                continue
            if record.state in STOPPED:
                del self.pending[flow_id]
                continue
            if record.state is not FlowState.WAITING or not (record.customer_url or kind == "challenge"):
                continue
            try:
                self._pay(kind, flow_id, record.order_id, record.outputs)
            except Exception as exc:  # noqa: BLE001 - the page refused (expired, already paid): noted, not retried
                self.failures.append(f"{kind} {flow_id}: {exc}")
            del self.pending[flow_id]
            self.done.add(flow_id)
            self.paid += 1

    def _pay(self, kind: str, flow_id: str, order_id: str, outputs: dict[str, Any]) -> None:
        created = outputs.get("create") or {}
        if kind == "hpp":
            self.admin.complete_hpp(order_id)
        elif kind == "paybylink":
            self.admin.complete_link(created["paymentLink"]["linkId"])
        elif kind == "reservation":
            self.admin.complete_link(outputs["link"]["paymentLink"]["linkId"])
        elif kind == "challenge":  # the customer passes the 3DS challenge at the ACS; the merchant signals it
            init = outputs["init"]
            pares = self.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"])
            self.engine.signal(flow_id, "3ds_result", {"threeDSAuthResponse": pares})
        else:
            self.admin.fill_build_form(created["sessionId"])
