"""Bodies and queries of the back-office operations: lookups, post-operations, contracts, rates.

Lists are newest first with no cursor: "for the next page set toTime equal to the lastOperationTime of
the last record" (docs/gateway.md, Times); windows of at most one month; ``maxRecords`` at most 500.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from durapay.gateway._base import GatewayModel, LenientEnum, Unknown
from durapay.gateway._codes import AmountType, ContractType, OperationType, OrderState, PaymentMethodType
from durapay.gateway._models_common import ListQuery, Operation, PaymentLink
from durapay.gateway._money import Amount, Currency
from durapay.gateway._time import GatewayTime


class OrderInfo(GatewayModel):
    """An order as the gateway reports it (lenient: no request-side limits are enforced on reads)."""

    orderId: str
    amount: Amount | None = None
    currency: str | None = None
    customerId: str | None = None
    description: str | None = None
    customField: str | None = None


class OrderDetails(GatewayModel):
    order: OrderInfo
    authorizedAmount: Amount | None = None
    capturedAmount: Amount | None = None
    lastOperationType: Annotated[OperationType | Unknown | None, LenientEnum(OperationType)] = None
    lastOperationTime: GatewayTime | None = None


class OrderListQuery(ListQuery):
    orderId: str | None = None
    amountType: Annotated[AmountType | Unknown | None, LenientEnum(AmountType)] = None
    minAmount: Amount | None = None
    maxAmount: Amount | None = None
    orderState: Annotated[OrderState | Unknown | None, LenientEnum(OrderState)] = None
    customField: str | None = None


class OrderListResponse(GatewayModel):
    orders: list[OrderDetails] = []


class OrderLookupResponse(GatewayModel):
    """``GET /orders/{orderId}``. Sources name the links ``paymentLinks`` or ``links``: both are read."""

    orderStatus: OrderDetails
    operations: list[Operation] = []
    paymentLinks: list[PaymentLink] = []
    links: list[PaymentLink] | None = None

    def all_links(self) -> list[PaymentLink]:
        return self.paymentLinks or self.links or []


class OperationListQuery(ListQuery):
    channel: str | None = None
    operationType: Annotated[OperationType | Unknown | None, LenientEnum(OperationType)] = None
    customField: str | None = None


class OperationListResponse(GatewayModel):
    operations: list[Operation] = []


class OperationAction(GatewayModel):
    """Not published beyond "allowed actions (e.g. Refund, Capture) and the acceptable range of values"."""

    actionType: str
    minAmount: Amount | None = None
    maxAmount: Amount | None = None
    currency: str | None = None


class OperationActionsResponse(GatewayModel):
    actions: list[OperationAction] = []


class PostOperationRequest(GatewayModel):
    """Refund and capture: omit amount and currency for the full amount."""

    amount: Amount | None = None
    currency: Currency | None = None
    description: str | None = Field(default=None, max_length=255)


class CancelOperationRequest(GatewayModel):
    description: str | None = Field(default=None, max_length=255)


class Contract(GatewayModel):
    contractId: str
    contractType: Annotated[ContractType | Unknown | None, LenientEnum(ContractType)] = None
    contractExpiryDate: str | None = None
    contractFrequency: str | None = None
    paymentMethod: str | None = None
    paymentCircuit: str | None = None
    paymentInstrumentInfo: str | None = None
    status: str | None = None


class CustomerContractsResponse(GatewayModel):
    customerId: str
    contracts: list[Contract] = []


class PaymentMethod(GatewayModel):
    """Sources name the type ``paymentMethodType`` or ``methodType``: both are read."""

    paymentMethodType: Annotated[PaymentMethodType | Unknown | None, LenientEnum(PaymentMethodType)] = None
    methodType: str | None = None
    circuit: str | None = None
    imageLink: str | None = None
    recurringSupported: bool | None = None
    oneClickSupported: bool | None = None


class PaymentMethodsResponse(GatewayModel):
    paymentMethods: list[PaymentMethod] = []


class ExchangeRatesQuery(GatewayModel):
    """Not published: filter by currency."""

    currency: str | None = None


class ExchangeRate(GatewayModel):
    currency: str
    exchangeRate: str
    merchantCurrency: str | None = None
    rateTime: str | None = None


class ExchangeRatesResponse(GatewayModel):
    """Not published: durapay's simulator answers ``{exchangeRates: [{currency, exchangeRate, ...}]}``."""

    exchangeRates: list[ExchangeRate] = []
