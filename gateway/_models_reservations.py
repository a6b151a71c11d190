"""Bodies of the reservation-guarantee area: structures, agencies, reservations, conditions, charges.

Shapes follow the earlier (deprecated) specification set as public code carries it (docs/gateway.md,
Reservations). Agencies and the current-path variants are not published: agencies mirror structures, and the
current paths take the same bodies as their earlier forms.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from durapay.gateway._base import GatewayModel, LenientEnum, Unknown
from durapay.gateway._codes import ActiveStatus, CaptureType, CollectionType, ReservationType
from durapay.gateway._models_common import CustomerInfo, Operation, PaymentLink, TransactionSummary
from durapay.gateway._money import Amount, Currency
from durapay.gateway._time import GatewayTime

HhMm = Annotated[str, Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]


def _one_or_many(value: Any) -> Any:
    """A list answer's wrapper holds an array, or (as published for the terminal's one structure) an object."""
    return [value] if isinstance(value, dict) else value


Date = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}")]


class Translation(GatewayModel):
    language: str
    label: str


class CustomFieldRef(GatewayModel):
    customFieldId: str | None = None
    customFieldTitle: str | None = None
    customFieldTranslations: list[Translation] = []


class Structure(GatewayModel):
    structureId: str = Field(min_length=1, max_length=36)
    terminalId: str | None = None
    status: Annotated[ActiveStatus | Unknown | None, LenientEnum(ActiveStatus)] = None
    structureCreationDate: str | None = None
    structureName: str | None = Field(default=None, max_length=255)
    structureEmail: str | None = None
    mobilePhoneCountryCode: str | None = None
    mobilePhone: str | None = None
    checkInFromTime: HhMm | None = None
    checkInToTime: HhMm | None = None
    checkOutFromTime: HhMm | None = None
    checkOutToTime: HhMm | None = None
    tecGuaranteedPenaltyId: str | None = None
    tecGuaranteedNoShowId: str | None = None
    tecRefundableId: str | None = None
    tecNotRefundableId: str | None = None
    customField: list[CustomFieldRef] | None = None


class StructureRequest(GatewayModel):
    structure: Structure


class StructureResponse(GatewayModel):
    structure: Structure


class StructureListResponse(GatewayModel):
    """``{structure: {...}}`` as published (the same wrapper as one structure), or ``{structure: [...]}``:
    both read as a list (docs/gateway.md)."""

    structure: Annotated[list[Structure], BeforeValidator(_one_or_many)] = []


class Agency(GatewayModel):
    """Not published: modelled on Structure."""

    agencyId: str = Field(min_length=1, max_length=36)
    terminalId: str | None = None
    status: Annotated[ActiveStatus | Unknown | None, LenientEnum(ActiveStatus)] = None
    agencyCreationDate: str | None = None
    agencyName: str | None = Field(default=None, max_length=255)
    agencyEmail: str | None = None
    mobilePhoneCountryCode: str | None = None
    mobilePhone: str | None = None
    customField: list[CustomFieldRef] | None = None


class AgencyRequest(GatewayModel):
    agency: Agency


class AgencyResponse(GatewayModel):
    agency: Agency


class AgencyListResponse(GatewayModel):
    agency: Annotated[list[Agency], BeforeValidator(_one_or_many)] = []


class ReservationInstallment(GatewayModel):
    date: str
    amount: Amount
    type: str | None = None


class CancellationCondition(GatewayModel):
    dataTypeValue: str | None = None
    value: str | None = None


class CancelationDetailsInfo(GatewayModel):
    dataType: str | None = None
    cancellationCondition: list[CancellationCondition] = []


class Reservation(GatewayModel):
    reservationId: str = Field(min_length=1, max_length=27)
    amount: Amount
    currency: Currency
    status: Annotated[ActiveStatus | Unknown | None, LenientEnum(ActiveStatus)] = None
    creationDate: str | None = None
    deposit: Amount | None = None
    description: str | None = Field(default=None, max_length=255)
    reservationType: Annotated[ReservationType | Unknown | None, LenientEnum(ReservationType)] = None
    structureId: str | None = None
    agencyId: str | None = None
    termsAndConditionsIds: list[str] | None = None
    checkInDate: str | None = None
    checkInFromTime: str | None = None
    checkInToTime: str | None = None
    checkOutDate: str | None = None
    checkOutFromTime: str | None = None
    checkOutToTime: str | None = None
    reservationPeriod: str | None = None
    customerNumber: str | None = None
    customerName: str | None = None
    customerSurname: str | None = None
    linkExpirationDate: str | None = None
    collectionType: Annotated[CollectionType | Unknown | None, LenientEnum(CollectionType)] = None
    customerId: str | None = None
    customField: str | None = None
    customerTaxCode: str | None = Field(default=None, max_length=21)
    customerInfo: CustomerInfo | None = None
    installments: list[ReservationInstallment] | None = None
    transactionSummary: list[TransactionSummary] | None = None
    CancelationDetails: CancelationDetailsInfo | None = None


class ReservationRequest(GatewayModel):
    reservation: Reservation


class ReservationIdResponse(GatewayModel):
    reservationId: str


class ReservationListQuery(GatewayModel):
    reservationId: str | None = None
    dateType: str | None = None
    fromTime: str | None = None
    toTime: str | None = None
    maxRecords: int | None = Field(default=None, ge=1, le=500)
    customField: str | None = None
    reservationType: str | None = None
    structureName: str | None = None
    customerNameReservation: str | None = None
    customerSurnameReservation: str | None = None


class ReservationListResponse(GatewayModel):
    reservation: list[Reservation] = []


class ReservationStatus(GatewayModel):
    reservation: Reservation
    authorizedAmount: Amount | None = None
    capturedAmount: Amount | None = None
    lastOperationType: str | None = None
    lastOperationTime: GatewayTime | None = None


class ReservationLookupResponse(GatewayModel):
    reservationStatus: ReservationStatus
    operations: list[Operation] = []
    paymentLinks: list[PaymentLink] = []


class ReservationPayByLinkRequest(GatewayModel):
    linkExpirationDate: Date | None = None
    captureType: Annotated[CaptureType | Unknown | None, LenientEnum(CaptureType)] = None
    notificationUrl: str | None = Field(default=None, max_length=2048, pattern=r"^https?://")


class ChangeAmountRequest(GatewayModel):
    """No-show, incremental and delayed charges, against the reservation's original operation."""

    originalOperationId: str
    amount: Amount
    currency: Currency
    description: str | None = Field(default=None, max_length=255)


class ReservationValidationRequest(GatewayModel):
    """The three validations (current and earlier paths) before a charge."""

    reservationId: str
    amount: Amount
    currency: Currency


class ReservationMitRequest(GatewayModel):
    """``POST /reservation/{reservationId}/mit`` (earlier form)."""

    amount: Amount
    currency: Currency | None = None


class TermsText(GatewayModel):
    language: str
    checkMarkLabel: str | None = None
    linkLabel: str | None = None
    text: str | None = None


class TermsAndConditionsRequest(GatewayModel):
    name: str
    termsAndConditions: list[TermsText] = []


class TermsAndConditionsIdResponse(GatewayModel):
    termsAndConditionsId: str


class TermsAndConditions(GatewayModel):
    termsAndConditionsId: str
    name: str | None = None
    tecCreationDate: str | None = None
    termsAndConditions: list[TermsText] = []
    status: str | None = None


class TermsAndConditionsListResponse(GatewayModel):
    termsAndConditions: list[TermsAndConditions] = []


class ConditionText(GatewayModel):
    language: str
    checkMarkLabelStructureCondition: str | None = None
    linkLabelStructureCondition: str | None = None
    textStructureCondition: str | None = None
    checkMarkLabelCancellationCondition: str | None = None
    linkLabelCancellationCondition: str | None = None
    textCancellationCondition: str | None = None


class StructureConditionRequest(GatewayModel):
    structureId: str
    reservationType: Annotated[ReservationType | Unknown | None, LenientEnum(ReservationType)] = None
    name: str
    termsAndConditions: list[ConditionText] = []


class StructureConditionIdResponse(GatewayModel):
    structureConditionId: str


class ConditionSummary(GatewayModel):
    structureConditionId: str | None = None
    agencyConditionId: str | None = None
    name: str | None = None
    tecCreationDate: str | None = None
    language: str | None = None
    status: str | None = None


class ConditionListResponse(GatewayModel):
    """A list of conditions; the gateway answers a bare array, read here as ``{"conditions": [...]}``."""

    conditions: list[ConditionSummary] = []

    @model_validator(mode="before")
    @classmethod
    def _wrap_bare_array(cls, data: Any) -> Any:
        return {"conditions": data} if isinstance(data, list) else data


class StructureCondition(GatewayModel):
    structureConditionId: str
    structureId: str | None = None
    name: str | None = None
    reservationType: str | None = None
    tecCreationDate: str | None = None
    termsAndConditions: list[ConditionText] = []
    status: str | None = None


class AgencyConditionRequest(GatewayModel):
    agencyId: str
    reservationType: Annotated[ReservationType | Unknown | None, LenientEnum(ReservationType)] = None
    name: str
    termsAndConditions: list[ConditionText] = []


class AgencyConditionIdResponse(GatewayModel):
    agencyConditionId: str


class AgencyCondition(GatewayModel):
    agencyConditionId: str
    agencyId: str | None = None
    name: str | None = None
    reservationType: str | None = None
    tecCreationDate: str | None = None
    termsAndConditions: list[ConditionText] = []
    status: str | None = None


class CustomFieldRequest(GatewayModel):
    """Custom fields of structures (current and earlier paths) and of agencies (``agencyId``)."""

    structureId: str | None = None
    agencyId: str | None = None
    customFieldOrd: int | None = None
    customFieldTitle: str = Field(max_length=50)
    customFieldEnabled: bool | None = None
    customFieldTranslations: list[Translation] = []


class CustomFieldIdResponse(GatewayModel):
    customFieldId: str


class CustomField(GatewayModel):
    customFieldId: str
    structureId: str | None = None
    agencyId: str | None = None
    customFieldOrd: int | None = None
    customFieldTitle: str | None = None
    customFieldEnabled: bool | None = None
    customFieldTranslations: list[Translation] = []


class ServiceRequest(GatewayModel):
    """Switch a service (``DISPUTELESS``) on or off for a terminal: ``enabled`` is "Y" or "N"."""

    serviceName: str
    terminalId: str | None = None
    enabled: str = Field(pattern=r"^[YN]$")
    serviceTecId: str | None = None


class ServiceQuery(GatewayModel):
    serviceName: str | None = None
    terminalId: str | None = None


class Service(GatewayModel):
    serviceName: str
    terminalId: str | None = None
    enabled: str | None = None
    serviceTecId: str | None = None


class ServiceListResponse(GatewayModel):
    services: list[Service] = []
