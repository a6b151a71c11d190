"""Back-office handlers: order and operation look-ups and lists, post-operations, contracts, methods, rates.

The post-operation rules live in ``_ledger``; this module maps them onto the catalogue's operations.
Reads settle first the PENDING operations that are due (``_pending``), as they expire links first.
List filters are the published ones (docs/gateway.md). Exchange rates are a fixed table against EUR
(deterministic, so tests can assert them); payment methods a fixed list of the terminal's defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durapay.gateway import (
    AmountType,
    CancelOperationRequest,
    ExchangeRatesQuery,
    OperationListQuery,
    OrderListQuery,
    OrderState,
    PostOperationRequest,
)
from durapay.simulator import _ledger
from durapay.simulator._direct import refresh_page
from durapay.simulator._links import refresh as refresh_link
from durapay.simulator._lists import Window, newest_first
from durapay.simulator._protocol import Call, Handler, Reply, SimError, ok
from durapay.simulator._records import OrderRecord

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

#: Units of each currency per 1 EUR (fixed: the simulator's rates never move).
EXCHANGE_RATES = {
    "USD": "1.0850",
    "GBP": "0.8550",
    "CHF": "0.9600",
    "JPY": "162.50",
    "PLN": "4.3200",
    "SEK": "11.2000",
    "NOK": "11.6000",
    "DKK": "7.4600",
    "CZK": "25.100",
    "HUF": "395.00",
    "RON": "4.9700",
    "BGN": "1.9558",
    "AUD": "1.6500",
    "CAD": "1.4800",
    "CNY": "7.8500",
}

PAYMENT_METHODS = (
    ("CARD", "VISA", True, True),
    ("CARD", "MC", True, True),
    ("CARD", "MAESTRO", True, True),
    ("CARD", "AMEX", True, True),
    ("APM", "GOOGLE_PAY", False, False),
    ("APM", "APPLE_PAY", False, False),
    ("APM", "PAYPAL", True, False),
    ("APM", "BANCOMAT_PAY", False, False),
    ("APM", "MYBANK", False, False),
)


def _order(sim: Simulator, order_id: str) -> OrderRecord:
    order = sim.state.orders.get(order_id)
    if order is None:
        raise SimError.not_found()
    sim.pending.settle_due()
    for link_id in order.link_ids:
        refresh_link(sim, sim.state.links[link_id])
    refresh_page(sim, order)
    return order


def get_order(sim: Simulator, call: Call) -> Reply:
    order = _order(sim, call.params["orderId"])
    return ok(
        {
            "orderStatus": _ledger.order_details(sim.state, order),
            "operations": [sim.state.operations[i].wire() for i in order.operation_ids],
            "paymentLinks": [sim.state.links[i].wire() for i in order.link_ids],
        }
    )


def _amount_filter(query: OrderListQuery) -> tuple[str | None, int | None, int | None]:
    if query.amountType is None:
        if query.minAmount is not None or query.maxAmount is not None:
            raise SimError.invalid("amountType", "required with minAmount or maxAmount")
        return None, None, None
    if query.minAmount is None and query.maxAmount is None:
        raise SimError.invalid("maxAmount", "required with amountType")
    return str(query.amountType), query.minAmount, query.maxAmount


def list_orders(sim: Simulator, call: Call) -> Reply:
    query = call.body(OrderListQuery)
    window = Window.of(query.fromTime, query.toTime)
    amount_type, low, high = _amount_filter(query)
    sim.pending.settle_due()
    found = []
    for order in sim.state.orders.values():
        details = _ledger.order_details(sim.state, order)
        moment = details["lastOperationTime"] or order.created_at
        amounts = {
            AmountType.ORDER_AMOUNT.value: order.amount,
            AmountType.AUTHORIZED_AMOUNT.value: int(details["authorizedAmount"]),
            AmountType.CAPTURED_AMOUNT.value: int(details["capturedAmount"]),
        }
        captured, authorized = amounts["CAPTURED_AMOUNT"], amounts["AUTHORIZED_AMOUNT"]
        state = OrderState.CAPTURED.value if captured else (OrderState.TO_CAPTURE.value if authorized else None)
        amount = amounts.get(amount_type or "", 0)
        if (
            not window.holds(moment)
            or (sim.config.terminal_keys and sim.state.terminal_of_order(order.order_id) != call.terminal)
            or (query.orderId is not None and order.order_id != query.orderId)
            or (query.customField is not None and order.order.get("customField") != query.customField)
            or (query.orderState is not None and state != str(query.orderState))
            or (amount_type is not None and ((low is not None and amount < low) or (high is not None and amount > high)))
        ):
            continue
        found.append((moment, details))
    ordered = newest_first(found, lambda item: item[0], query.maxRecords)
    return ok({"orders": [details for _, details in ordered]})


def list_operations(sim: Simulator, call: Call) -> Reply:
    query = call.body(OperationListQuery)
    window = Window.of(query.fromTime, query.toTime)
    channel = query.channel or (query.model_extra or {}).get("channelType")
    sim.pending.settle_due()
    terminals = bool(sim.config.terminal_keys)
    found = [
        op
        for op in sim.state.operations.values()
        if window.holds(op.time)
        and (not terminals or sim.state.terminal_of_order(op.order_id) == call.terminal)  # a terminal lists its own
        and (channel is None or op.channel == channel)
        and (query.operationType is None or op.operation_type == str(query.operationType))
        and (query.customField is None or sim.state.orders[op.order_id].order.get("customField") == query.customField)
    ]
    return ok({"operations": [op.wire() for op in newest_first(found, lambda op: op.time, query.maxRecords)]})


def get_operation(sim: Simulator, call: Call) -> Reply:
    op = sim.state.operations.get(call.params["operationId"])
    if op is None:
        raise SimError.not_found()
    sim.pending.settle_due()
    return ok(op.wire())


def get_operation_actions(sim: Simulator, call: Call) -> Reply:
    op = sim.state.operations.get(call.params["operationId"])
    if op is None:
        raise SimError.not_found()
    sim.pending.settle_due()
    return ok({"actions": _ledger.allowed_actions(sim, op)})


def _post_answer(operation_id: str, operation_time: str) -> Reply:
    return ok({"operationId": operation_id, "operationTime": operation_time})


def refund_operation(sim: Simulator, call: Call) -> Reply:
    op = _ledger.refund(sim, call.origin, call.params["operationId"], call.body(PostOperationRequest))
    return _post_answer(op.operation_id, op.time)


def capture_operation(sim: Simulator, call: Call) -> Reply:
    op = _ledger.capture(sim, call.origin, call.params["operationId"], call.body(PostOperationRequest))
    return _post_answer(op.operation_id, op.time)


def cancel_operation(sim: Simulator, call: Call) -> Reply:
    call.body(CancelOperationRequest)
    op = _ledger.cancel(sim, call.origin, call.params["operationId"])
    return _post_answer(op.operation_id, op.time)


def get_customer_contracts(sim: Simulator, call: Call) -> Reply:
    customer_id = call.params["customerId"]
    contracts = [c for c in sim.state.contracts.values() if c.customer_id == customer_id and not c.internal]
    if not contracts:
        raise SimError.not_found()
    answer: list[dict[str, Any]] = []
    for contract in contracts:
        creating = sim.state.operations.get(contract.created_by_operation_id)
        answer.append(contract.wire(creating.circuit if creating and creating.circuit else "VISA"))
    return ok({"customerId": customer_id, "contracts": answer})


def deactivate_contract(sim: Simulator, call: Call) -> Reply:
    contract = sim.state.contracts.get(call.params["contractId"])
    if contract is None or contract.internal:
        raise SimError.rejected("PS0017", f"no contract {call.params['contractId']}")
    contract.status = "DEACTIVATED"
    return ok()


def list_payment_methods(sim: Simulator, call: Call) -> Reply:
    methods = [
        {
            "paymentMethodType": kind,
            "methodType": kind,  # the name other sources give the same field
            "circuit": name,
            "imageLink": f"{call.root_url}/_sim/img/{name.lower()}.svg",
            "recurringSupported": recurring,
            "oneClickSupported": one_click,
        }
        for kind, name, recurring, one_click in PAYMENT_METHODS
    ]
    return ok({"paymentMethods": methods})


def get_exchange_rates(sim: Simulator, call: Call) -> Reply:
    query = call.body(ExchangeRatesQuery)
    wanted = query.currency.upper() if query.currency else None
    if wanted is not None and wanted not in EXCHANGE_RATES:
        raise SimError.rejected("PS0009", f"no rate for {wanted}")
    rate_time = sim.clock.now().strftime("%Y-%m-%dT00:00:00.000Z")
    rates = [
        {"currency": code, "exchangeRate": rate, "merchantCurrency": "EUR", "rateTime": rate_time}
        for code, rate in EXCHANGE_RATES.items()
        if wanted is None or code == wanted
    ]
    return ok({"exchangeRates": rates})


HANDLERS: dict[str, Handler] = {
    "list_orders": list_orders,
    "get_order": get_order,
    "list_operations": list_operations,
    "get_operation": get_operation,
    "get_operation_actions": get_operation_actions,
    "refund_operation": refund_operation,
    "capture_operation": capture_operation,
    "cancel_operation": cancel_operation,
    "get_customer_contracts": get_customer_contracts,
    "deactivate_contract": deactivate_contract,
    "list_payment_methods": list_payment_methods,
    "get_exchange_rates": get_exchange_rates,
}
