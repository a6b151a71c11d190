"""What a reconciliation finds and what it reads besides the window: the four categories, a finding
(one line of a report: its category, its sentence, its flow and the gateway's operation), who holds
what (``Owners``, from the engine's lookups) and the reads a finding may need (``Lookups``: one
operation, one order, the flows with a post-operation in flight, flows by id). The judging itself is
``judge``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from durapay.workflows.engine import STOPPED, FlowRecord
from durapay.workflows.reconciliation import money
from durapay.workflows.reconciliation.window import GetCall

MONEY_WITHOUT_FLOW = "money_without_flow"
FLOW_WITHOUT_MONEY = "flow_without_money"
MONEY_NOT_SHOWN = "money_not_shown"
IN_FLIGHT = "in_flight"
#: The categories in the report's order; all but the last are mismatches.
CATEGORIES = (MONEY_WITHOUT_FLOW, FLOW_WITHOUT_MONEY, MONEY_NOT_SHOWN, IN_FLIGHT)
#: Each category in words (a flow's history, the CLI).
TITLES = {
    MONEY_WITHOUT_FLOW: "money without a flow",
    FLOW_WITHOUT_MONEY: "a flow without its money",
    MONEY_NOT_SHOWN: "money the flow does not show",
    IN_FLIGHT: "in flight (not errors)",
}
MISMATCHES = CATEGORIES[:3]

#: The operation fields a finding repeats (no card data).
OPERATION_FIELDS = (
    "operationId",
    "orderId",
    "operationType",
    "operationResult",
    "operationAmount",
    "operationCurrency",
    "operationTime",
    "channel",
)


def brief(op: Mapping[str, Any]) -> dict[str, Any]:
    return {name: op.get(name) for name in OPERATION_FIELDS if op.get(name) is not None}


@dataclass(frozen=True)
class Finding:
    """One line of a report: its category, one sentence, and the flow and the operation it is about."""

    category: str
    what: str
    flow: str | None = None
    kind: str | None = None
    state: str | None = None
    #: The gateway's operation (``brief``), or None when the gateway has none to show.
    operation: dict[str, Any] | None = None
    #: The operation id the flow names (``flow_without_money``).
    named: str | None = None

    @property
    def key(self) -> str:
        """The same mismatch found again has the same key (one event, one mark). A flow without its money
        is its flow and the operation it names, whatever the gateway holds instead (or in its place)."""
        operation = "" if self.category == FLOW_WITHOUT_MONEY else (self.operation or {}).get("operationId") or ""
        return f"{self.category}:{self.flow or ''}:{operation}:{self.named or ''}"

    @property
    def order_id(self) -> str:
        return str((self.operation or {}).get("orderId") or "")

    def wire(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Finding:
        operation = data.get("operation")
        return cls(
            category=str(data["category"]),
            what=str(data.get("what") or ""),
            flow=data.get("flow"),
            kind=data.get("kind"),
            state=data.get("state"),
            operation=dict(operation) if isinstance(operation, Mapping) else None,
            named=data.get("named"),
        )


#: Orders read by id (``Lookups.read_orders``) kept at once, at most.
MAX_ORDERS_READ = 1_000
#: The operations of one order as the gateway lists them (``GET /orders/{orderId}``), as JSON.
OrderCall = Callable[[str], list[dict[str, Any]]]
#: The flows of durapay that may have made a post-operation and not read it back (money in flight, a
#: call of ``money.POST_CALLS``), by the operation id their input acts on and by the orders they hold.
Makers = Callable[[], Mapping[str, list[FlowRecord]]]


@dataclass
class Owners:
    """Who holds what, as the engine's lookups say: flows by operation id and by order id, and the records."""

    by_operation: dict[str, str] = field(default_factory=dict)
    by_order: dict[str, str] = field(default_factory=dict)
    records: dict[str, FlowRecord] = field(default_factory=dict)


@dataclass
class Lookups:
    """What the judge may read besides the window: one operation by id, one order's operations, and the
    flows with a post-operation in flight (each read at most once, only when a finding needs it)."""

    operation: GetCall
    order: OrderCall
    makers: Makers
    #: The records of flows by id (those still kept).
    flows: Callable[[list[str]], list[FlowRecord]]
    #: The orders read so far, by id.
    read_orders: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _makers: Mapping[str, list[FlowRecord]] | None = None

    def order_operations(self, order_id: str) -> list[dict[str, Any]]:
        if len(self.read_orders) >= MAX_ORDERS_READ:
            self.read_orders.clear()  # bounded: an order is read again if a later page needs it
        if order_id not in self.read_orders:
            self.read_orders[order_id] = self.order(order_id) if order_id else []
        return self.read_orders[order_id]

    def maker(self, op: Mapping[str, Any], acted_on: Iterable[str]) -> FlowRecord | None:
        """A flow of durapay whose post-operation in flight may be ``op``: it acts on one of ``acted_on``
        (operation ids of ``op``'s order) or holds ``op``'s order, and its call makes ``op``'s type."""
        if self._makers is None:
            self._makers = self.makers()
        keys = [*acted_on, str(op.get("orderId") or "")]
        for key in keys:
            for record in self._makers.get(key, []):
                if money.says_in_flight(record, op) or record.state not in STOPPED:
                    return record
        return None
