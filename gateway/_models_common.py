"""Objects shared by many bodies: Order, PaymentSession, Card, Operation, PaymentLink, errors.

Field names are the gateway's own (camelCase, one to one; docs/gateway.md). Lengths and
required flags are those the public material states; where sources conflict the longer limit is
accepted (e.g. ``orderId`` up to 27 characters). Every model keeps unknown fields.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from durapay.gateway._base import GatewayModel, LenientEnum, Unknown
from durapay.gateway._codes import (
    ActionType,
    CaptureType,
    Channel,
    ContractType,
    Exemptions,
    OperationResult,
    OperationType,
    PaymentLinkStatus,
    PaymentMethodType,
    RecurrenceAction,
)
from durapay.gateway._money import Amount, AmountOrZero, Currency
from durapay.gateway._time import GatewayTime

OrderId = Annotated[str, Field(min_length=1, max_length=27, pattern=r"^[A-Za-z0-9#*+\-.:;=?\[\]_{|}]+$")]
Url = Annotated[str, Field(max_length=2048, pattern=r"^https?://")]


class Address(GatewayModel):
    name: str | None = Field(default=None, max_length=50)
    street: str | None = Field(default=None, max_length=50)
    additionalInfo: str | None = Field(default=None, max_length=50)
    city: str | None = Field(default=None, max_length=50)
    postCode: str | None = Field(default=None, max_length=16)
    province: str | None = Field(default=None, max_length=3)
    country: str | None = Field(default=None, min_length=3, max_length=3)


class CustomerInfo(GatewayModel):
    cardHolderName: str | None = Field(default=None, max_length=255)
    cardHolderEmail: str | None = Field(default=None, max_length=255)
    billingAddress: Address | None = None
    shippingAddress: Address | None = None
    mobilePhoneCountryCode: str | None = Field(default=None, max_length=4)
    mobilePhone: str | None = Field(default=None, max_length=15)
    homePhone: str | None = Field(default=None, max_length=19)
    workPhone: str | None = Field(default=None, max_length=19)
    cardHolderAcctInfo: dict[str, object] | None = None
    merchantRiskIndicator: dict[str, object] | None = None


class SummaryItem(GatewayModel):
    label: str = Field(max_length=50)
    value: str


class TransactionSummary(GatewayModel):
    language: str
    summaryList: list[SummaryItem] = []


class Installment(GatewayModel):
    date: str
    amount: Amount


class Order(GatewayModel):
    """The order being paid: ``orderId`` unique in the merchant's domain; amount in minor units."""

    orderId: OrderId
    amount: Amount
    currency: Currency
    customerId: str | None = Field(default=None, max_length=27)
    description: str | None = Field(default=None, max_length=255)
    customField: str | None = Field(default=None, max_length=255)
    invoiceId: str | None = Field(default=None, max_length=30)
    customerInfo: CustomerInfo | None = None
    transactionSummary: list[TransactionSummary] | None = None
    termsAndConditionsIds: list[str] | None = None
    installments: list[Installment] | None = None


class VerificationOrder(Order):
    """The order of a card verification: "without any charge", so its amount may be 0."""

    amount: AmountOrZero


class Card(GatewayModel):
    """Card data for server-to-server flows (the merchant holds PCI DSS SAQ D)."""

    pan: str = Field(min_length=13, max_length=19, pattern=r"^[0-9]+$")
    expiryDate: str = Field(pattern=r"^(0[1-9]|1[0-2])[0-9]{2}$", description="mmyy")
    cvv: str | None = Field(default=None, min_length=3, max_length=4, pattern=r"^[0-9]+$")


class Recurrence(GatewayModel):
    action: Annotated[RecurrenceAction | Unknown | None, LenientEnum(RecurrenceAction)] = None
    contractId: str | None = Field(default=None, min_length=1, max_length=255)
    contractType: Annotated[ContractType | Unknown | None, LenientEnum(ContractType)] = None
    contractExpiryDate: str | None = None
    contractFrequency: str | None = Field(default=None, max_length=4)


class PaymentSession(GatewayModel):
    """How the customer pays on a gateway page (hosted page, pay-by-link, embedded form)."""

    actionType: Annotated[ActionType | Unknown, LenientEnum(ActionType)] = ActionType.PAY
    amount: Amount
    language: str = Field(default="ita", min_length=3, max_length=3)
    recurrence: Recurrence | None = None
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None
    exemptions: Annotated[Exemptions | Unknown | None, LenientEnum(Exemptions)] = None
    paymentService: str | None = None
    resultUrl: Url | None = None
    cancelUrl: Url | None = None
    notificationUrl: Url | None = None


class Warning_(GatewayModel):
    code: str | None = None
    description: str | None = None


class Operation(GatewayModel):
    """A movement on an order. ``operationResult`` says where it stands."""

    orderId: str | None = None
    operationId: str
    channel: Annotated[Channel | Unknown | None, LenientEnum(Channel)] = None
    operationType: Annotated[OperationType | Unknown | None, LenientEnum(OperationType)] = None
    operationResult: Annotated[OperationResult | Unknown | None, LenientEnum(OperationResult)] = None
    operationTime: GatewayTime | None = None
    paymentMethod: Annotated[PaymentMethodType | Unknown | None, LenientEnum(PaymentMethodType)] = None
    paymentCircuit: str | None = None
    paymentInstrumentInfo: str | None = None
    paymentEndToEndId: str | None = None
    cancelledOperationId: str | None = None
    operationAmount: Amount | None = None
    operationCurrency: Currency | None = None
    customerInfo: CustomerInfo | None = None
    warnings: list[Warning_] | None = None
    paymentLinkId: str | None = None
    additionalData: dict[str, object] | None = None
    terminalId: str | None = None


class OperationResponse(GatewayModel):
    """``{operation}``: the answer of payment calls (MOTO, MIT, card verification, 3-step payment...)."""

    operation: Operation


class PostOperationResponse(GatewayModel):
    """``{operationId, operationTime}``: refunds, captures, cancels; read the result by operationId."""

    operationId: str
    operationTime: GatewayTime | None = None


class PaymentLink(GatewayModel):
    linkId: str
    amount: Amount | None = None
    expirationDate: str | None = None
    link: str | None = None
    paidByOperationId: str | None = None
    status: Annotated[PaymentLinkStatus | Unknown | None, LenientEnum(PaymentLinkStatus)] = None


class ErrorItem(GatewayModel):
    code: str | None = None
    description: str | None = None


class ErrorBody(GatewayModel):
    """``{"errors": [{"code", "description"}]}`` (400 and 500 answers)."""

    errors: list[ErrorItem] = []


class EmptyResponse(GatewayModel):
    """An answer with no body (or a bare ``true``): success is the status code."""


class BinaryResponse(GatewayModel):
    """A file answer (PDF, PNG, CSV export): the bytes and their media type."""

    content: bytes
    mediaType: str


class ListQuery(GatewayModel):
    """The shared query of list endpoints: a time window of at most a month, newest first."""

    fromTime: str | None = None
    toTime: str | None = None
    maxRecords: int | None = Field(default=None, ge=1, le=500)
