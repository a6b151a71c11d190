"""Request and response bodies of the payment-creation operations.

Published shapes are typed field by field (docs/gateway.md). Where nothing is published
(pay-by-link v2/v3 differences, modify, renewals, ``/v2/svs``, wallet pay, build integrity) durapay
chooses a shape, documents it here and in docs/gateway.md, and its simulator speaks the same; unknown fields
are kept either way.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from durapay.gateway._base import GatewayModel, LenientEnum, Unknown
from durapay.gateway._codes import BuildState, CaptureType, Exemptions, ThreeDSEnrollmentStatus
from durapay.gateway._models_common import (
    Card,
    Operation,
    Order,
    PaymentLink,
    PaymentSession,
    Recurrence,
    Url,
    VerificationOrder,
)
from durapay.gateway._money import Amount

# -- hosted payment page ------------------------------------------------------------------------


class HppOrderRequest(GatewayModel):
    order: Order
    paymentSession: PaymentSession


class HppOrderResponse(GatewayModel):
    hostedPage: str
    securityToken: str


# -- pay-by-link ----------------------------------------------------------------------------------


class PayByLinkRequest(GatewayModel):
    """All four creation forms take this body (v1 is published; v2, v3 and unversioned assumed alike).

    ``expirationDate`` is "YYYY-MM-DD", at most 90 days after creation.
    """

    order: Order
    paymentSession: PaymentSession
    expirationDate: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")


class PayByLinkResponse(GatewayModel):
    paymentLink: PaymentLink
    securityToken: str | None = None


class PayByLinkListQuery(GatewayModel):
    """durapay's choice of filters: creation window, status, order id, at most 500 records."""

    fromTime: str | None = None
    toTime: str | None = None
    status: str | None = None
    orderId: str | None = None
    maxRecords: int | None = Field(default=None, ge=1, le=500)


class PayByLinkListResponse(GatewayModel):
    paymentLinks: list[PaymentLink] = []


class PayByLinkDetails(GatewayModel):
    """One link looked up by id: the link, its order id, the operations that paid or tried it."""

    paymentLink: PaymentLink
    orderId: str | None = None
    operations: list[Operation] = []


class PayByLinkRenewRequest(GatewayModel):
    """Body not published: an optional new ``expirationDate``; absent = request date + the timeout."""

    expirationDate: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")


class PayByLinkModifyRequest(GatewayModel):
    """Body not published: what may change on an unused link."""

    amount: Amount | None = None
    expirationDate: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    description: str | None = Field(default=None, max_length=255)


class PayByLinkExportQuery(GatewayModel):
    fromTime: str | None = None
    toTime: str | None = None
    status: str | None = None


class QrCodeRequest(GatewayModel):
    """Body not published: the PNG's module size in pixels."""

    size: int | None = Field(default=None, ge=1, le=40)


# -- server to server: three steps, init/pay ---------------------------------------------------


class ThreeStepsInitRequest(GatewayModel):
    order: Order
    card: Card
    recurrence: Recurrence | None = None
    exemptions: Annotated[Exemptions | Unknown | None, LenientEnum(Exemptions)] = None


class ThreeStepsInitResponse(GatewayModel):
    operation: Operation
    threeDSEnrollmentStatus: Annotated[ThreeDSEnrollmentStatus | Unknown | None, LenientEnum(ThreeDSEnrollmentStatus)] = None
    threeDSAuthRequest: str | None = None
    threeDSAuthUrl: str | None = None


class ThreeStepsValidationRequest(GatewayModel):
    operationId: str
    threeDSAuthResponse: str


class ThreeDSAuthResult(GatewayModel):
    authenticationValue: str | None = None
    cavvAlgorithm: str | None = None
    eci: str | None = None
    merchantAcquirerBin: str | None = None
    xid: str | None = None
    status: str | None = None
    vendorcode: str | None = None
    version: str | None = None


class ThreeStepsValidationResponse(GatewayModel):
    operation: Operation
    threeDSAuthResult: ThreeDSAuthResult | None = None


class ThreeDSAuthData(GatewayModel):
    authenticationValue: str | None = None
    eci: str | None = None
    xid: str | None = None
    threeDSAuthResponse: str | None = None


class ThreeStepsPaymentRequest(GatewayModel):
    operationId: str
    order: Order
    card: Card
    recurrence: Recurrence | None = None
    exemptions: Annotated[Exemptions | Unknown | None, LenientEnum(Exemptions)] = None
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None
    threeDSAuthData: ThreeDSAuthData | None = None


class SvsInitRequest(GatewayModel):
    """``/v2/svs/order/init`` (not published): the order and card; answers a PENDING operation."""

    order: Order
    card: Card
    recurrence: Recurrence | None = None
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None


class SvsPayRequest(GatewayModel):
    """``/v2/svs/operation/{operationId}/pay`` (not published): confirms the initiated operation."""

    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None
    cvv: str | None = Field(default=None, min_length=3, max_length=4)


# -- direct payments ------------------------------------------------------------------------------


class MitRequest(GatewayModel):
    order: Order
    contractId: str = Field(min_length=1, max_length=255)
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None


class CardVerificationRequest(GatewayModel):
    order: VerificationOrder
    card: Card


class MotoRequest(GatewayModel):
    order: Order
    card: Card
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None


class WalletPayRequest(GatewayModel):
    """Generic wallet payment (public code shows ``googlePayPaymentData``; the name here is neutral)."""

    order: Order
    paymentSession: PaymentSession | None = None
    walletPaymentData: dict[str, object]
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None


# -- embedded form (build) ---------------------------------------------------------------------


class BuildOrderRequest(GatewayModel):
    merchantUrl: Url
    order: Order
    paymentSession: PaymentSession
    version: str | None = Field(default=None, pattern=r"^[123]$")


class BuildField(GatewayModel):
    type: str | None = None
    id: str | None = None
    src: str | None = None
    propertyClass: str | None = Field(default=None, alias="class")


class BuildOrderResponse(GatewayModel):
    sessionId: str
    securityToken: str | None = None
    fields: list[BuildField] = []
    state: Annotated[BuildState | Unknown | None, LenientEnum(BuildState)] = None
    url: str | None = None


class BuildSessionRequest(GatewayModel):
    """Body of finalize_payment and cancel."""

    sessionId: str


class BuildConfirmRequest(GatewayModel):
    sessionId: str
    amount: Amount | None = None


class BuildSessionQuery(GatewayModel):
    """Query of state, cardData and integrity."""

    sessionId: str


class BuildFieldSet(GatewayModel):
    sessionId: str | None = None
    fields: list[BuildField] = []


class BuildStateResponse(GatewayModel):
    state: Annotated[BuildState | Unknown | None, LenientEnum(BuildState)] = None
    url: str | None = None
    operation: Operation | None = None
    fieldSet: BuildFieldSet | None = None


class BuildCardDataResponse(GatewayModel):
    bin: str | None = None
    lastFourDigits: str | None = None
    expiringDate: str | None = None
    circuit: str | None = None


class BuildIntegrityResponse(GatewayModel):
    """Not published: durapay's simulator answers ``{sessionId, integrityCheck: "OK"|"KO", state}``."""

    sessionId: str | None = None
    integrityCheck: str | None = None
    state: Annotated[BuildState | Unknown | None, LenientEnum(BuildState)] = None
