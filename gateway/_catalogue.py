"""The catalogue: every method and path of the gateway, declared once, one line each.

The Celery tasks (``durapay.gateway.<name>``), the simulator's routes, ``durapay endpoints`` and the
the endpoint table of docs/gateway.md are all derived from :data:`CATALOGUE`; nothing else lists operations.

Each entry says how to call the operation (method, path template, version marker, request and response
models) and what a failure of it means:

* ``idempotency_key``: the gateway takes an ``Idempotency-Key`` header here (docs/gateway.md);
  a resend with the same key replays the first answer.
* ``retry_safe``: resending the same request cannot make a second effect (reads, keyed operations that
  move no money, switches; a keyed money call is read back first, the gateway may have forgotten its key). When it is False, an ambiguous failure (timeout after sending, connection drop, 5xx) is
  resolved by reading the gateway first, as ``reconcile`` says, never by resending blindly.
* ``notifies``: the request carries a ``notificationUrl`` and the gateway notifies the outcome.
* ``moves_money``: a successful request makes an operation that moves money (a payment, a card
  verification, a refund, a capture or its cancel, a reservation charge). From the moment a flow may
  send it until a read of the gateway says what it did, the flow's money is *in flight*: no end but
  one the gateway confirms (docs/durability.md, "Money in flight").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

from durapay.gateway import _models_backoffice as bo
from durapay.gateway import _models_payments as pay
from durapay.gateway import _models_reservations as rg
from durapay.gateway._base import GatewayModel
from durapay.gateway._models_common import BinaryResponse, EmptyResponse, Operation, OperationResponse
from durapay.gateway._models_common import PostOperationResponse as PostOp

Resp = TypeVar("Resp", bound=GatewayModel)


class Version(StrEnum):
    """The version marker of a path: its prefix, or the earlier (deprecated) specification set."""

    UNVERSIONED = "unversioned"
    V1 = "v1"
    V2 = "v2"
    V3 = "v3"
    EARLIER = "earlier"


class Reconcile(StrEnum):
    """What to read to learn the outcome of a call whose answer was lost."""

    ORDER = "GET /orders/{orderId}"
    OPERATION = "GET /operations/{operationId}"
    BUILD_STATE = "GET /build/state"
    PAYBYLINK = "GET /orders/paybylink/{linkId}"
    RESERVATION = "GET /reservations/{reservationId}"
    LOOKUP = "GET the created resource by its merchant-chosen id"


class Area(StrEnum):
    PAYMENTS = "payments"
    BACK_OFFICE = "back office"
    RESERVATIONS = "reservation guarantee"
    RESERVATIONS_EARLIER = "reservation guarantee (earlier forms)"


_PARAM = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True, eq=False)
class GatewayOperation(Generic[Resp]):
    """One method+path of the gateway. ``name`` comes from the attribute it is assigned to."""

    method: Literal["GET", "POST"]
    path: str
    request: type[GatewayModel] | None
    response: type[Resp]
    summary: str
    area: Area
    version: Version = Version.UNVERSIONED
    idempotency_key: bool = False
    retry_safe: bool | None = None
    reconcile: Reconcile | None = None
    notifies: bool = False
    moves_money: bool = False
    #: Makes a customer's instrument payable again, or longer (a link's renewal, a modification of its
    #: expiry): no money moves and nothing new opens, yet a customer may pay where they could not.
    reopens: bool = False
    name: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.retry_safe is None:
            # A keyed call that moves money is read back before a resend, as a payment is: the public
            # material does not say how long the gateway keeps a key (docs/gateway.md), and durapay takes a
            # forgotten key as possible (tasks.runner): a blind resend could refund or charge twice.
            object.__setattr__(self, "retry_safe", self.method == "GET" or (self.idempotency_key and not self.moves_money))

    def __set_name__(self, owner: type, name: str) -> None:
        # Named once, by the Catalogue class body: reusing an operation as a default in another class
        # (``op: GatewayOperation = Catalogue.create_moto_order`` in a dataclass) must not rename it.
        if not self.name:
            object.__setattr__(self, "name", name)

    @property
    def declared_only(self) -> bool:
        """Sent only by a step that declares it (or another form of its act, :data:`FORM_OF`): it moves
        money, opens a page a customer pays on, or makes one payable again, and what the engine does
        around it (money in flight, the read-back, telling the flow that holds the link) is the declared
        operation's (``tasks.runner.StepContext.call``)."""
        return self.moves_money or self.notifies or self.reopens

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.path))

    @property
    def request_in(self) -> Literal["query", "body"] | None:
        if self.request is None:
            return None
        return "query" if self.method == "GET" else "body"

    @property
    def task_name(self) -> str:
        return f"durapay.gateway.{self.name}"

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (``durapay endpoints --json``, the README table)."""
        return {
            "operation": self.name,
            "method": self.method,
            "path": self.path,
            "version": self.version.value,
            "area": self.area.value,
            "summary": self.summary,
            "request": self.request.__name__ if self.request else None,
            "request_in": self.request_in,
            "response": self.response.__name__,
            "idempotency_key": self.idempotency_key,
            "retry_safe": self.retry_safe,
            "reconcile": self.reconcile.value if self.reconcile else None,
            "notifies": self.notifies,
            "moves_money": self.moves_money,
            "reopens": self.reopens,
            "task": self.task_name,
        }


def _op(
    method: Literal["GET", "POST"],
    path: str,
    request: type[GatewayModel] | None,
    response: type[Resp],
    summary: str,
    area: Area,
    **flags: Any,
) -> GatewayOperation[Resp]:
    return GatewayOperation(method, path, request, response, summary, area, **flags)


P, B, R, E = Area.PAYMENTS, Area.BACK_OFFICE, Area.RESERVATIONS, Area.RESERVATIONS_EARLIER
V1, V2, V3, EARLIER = Version.V1, Version.V2, Version.V3, Version.EARLIER
ORDER, OPER, BUILD, LINK = Reconcile.ORDER, Reconcile.OPERATION, Reconcile.BUILD_STATE, Reconcile.PAYBYLINK
RES, LOOKUP = Reconcile.RESERVATION, Reconcile.LOOKUP


class Catalogue:
    """Every operation of the gateway (83 methods and paths). Attribute name = operation name = task suffix."""

    # fmt: off

    # -- payments ---------------------------------------------------------------------------------
    create_hpp_order = _op("POST", "/orders/hpp", pay.HppOrderRequest, pay.HppOrderResponse, "create a hosted payment page order", P, reconcile=ORDER, notifies=True)
    create_paybylink_v3 = _op("POST", "/v3/orders/paybylink", pay.PayByLinkRequest, pay.PayByLinkResponse, "create a pay-by-link (current)", P, version=V3, reconcile=ORDER, notifies=True)
    create_paybylink_v2 = _op("POST", "/v2/orders/paybylink", pay.PayByLinkRequest, pay.PayByLinkResponse, "create a pay-by-link (earlier version)", P, version=V2, reconcile=ORDER, notifies=True)
    create_paybylink_v1 = _op("POST", "/v1/orders/paybylink", pay.PayByLinkRequest, pay.PayByLinkResponse, "create a pay-by-link (earliest version)", P, version=V1, reconcile=ORDER, notifies=True)
    create_paybylink = _op("POST", "/orders/paybylink", pay.PayByLinkRequest, pay.PayByLinkResponse, "create a pay-by-link (unversioned form, used by client libraries)", P, reconcile=ORDER, notifies=True)
    cancel_paybylink = _op("POST", "/paybylink/{linkId}/cancels", None, EmptyResponse, "cancel a pay-by-link", P, reconcile=LINK)
    list_paybylinks_v3 = _op("GET", "/v3/orders/paybylink", pay.PayByLinkListQuery, pay.PayByLinkListResponse, "list pay-by-links", P, version=V3)
    get_paybylink_v3 = _op("GET", "/v3/orders/paybylink/{Id}", None, pay.PayByLinkDetails, "look up one pay-by-link", P, version=V3)
    list_paybylinks = _op("GET", "/orders/paybylink", pay.PayByLinkListQuery, pay.PayByLinkListResponse, "list pay-by-links (earlier form)", P)
    get_paybylink = _op("GET", "/orders/paybylink/{linkId}", None, pay.PayByLinkDetails, "look up one pay-by-link (earlier form)", P)
    renew_paybylink = _op("POST", "/orders/paybylink/{linkId}/renewals", pay.PayByLinkRenewRequest, pay.PayByLinkResponse, "renew a pay-by-link", P, reconcile=LINK, reopens=True)
    modify_paybylink_v3 = _op("POST", "/v3/paybylink/{id}/modify", pay.PayByLinkModifyRequest, pay.PayByLinkResponse, "modify a pay-by-link", P, version=V3, retry_safe=True, reopens=True)
    export_paybylinks_v3 = _op("GET", "/v3/paybylink/exports/{format}", pay.PayByLinkExportQuery, BinaryResponse, "export pay-by-links; {format} is csv or json", P, version=V3)
    paybylink_qrcode_v3 = _op("POST", "/v3/paybylink/qrcode/{id}", pay.QrCodeRequest, BinaryResponse, "produce a QR code (PNG) for a pay-by-link", P, version=V3, retry_safe=True)
    svs_init_order = _op("POST", "/v2/svs/order/init", pay.SvsInitRequest, OperationResponse, "initiate an order (server-to-server flow)", P, version=V2, reconcile=ORDER)
    svs_pay_operation = _op("POST", "/v2/svs/operation/{operationId}/pay", pay.SvsPayRequest, OperationResponse, "pay an operation (server-to-server flow)", P, version=V2, reconcile=OPER, moves_money=True)
    three_steps_init = _op("POST", "/orders/3steps/init", pay.ThreeStepsInitRequest, pay.ThreeStepsInitResponse, "three-step payment, initiation", P, reconcile=ORDER)
    three_steps_validation = _op("POST", "/orders/3steps/validation", pay.ThreeStepsValidationRequest, pay.ThreeStepsValidationResponse, "three-step payment, validation", P, reconcile=OPER)
    three_steps_payment = _op("POST", "/orders/3steps/payment", pay.ThreeStepsPaymentRequest, OperationResponse, "three-step payment, payment", P, reconcile=OPER, moves_money=True)
    create_mit_order = _op("POST", "/orders/mit", pay.MitRequest, OperationResponse, "merchant-initiated (recurring) payment", P, idempotency_key=True, moves_money=True)
    card_verification = _op("POST", "/orders/card_verification", pay.CardVerificationRequest, OperationResponse, "card verification", P, reconcile=ORDER, moves_money=True)
    create_moto_order = _op("POST", "/orders/moto", pay.MotoRequest, OperationResponse, "mail-order/telephone-order payment", P, reconcile=ORDER, moves_money=True)
    wallet_pay = _op("POST", "/orders/walletpay", pay.WalletPayRequest, OperationResponse, "wallet payment", P, reconcile=ORDER, moves_money=True)
    create_build_order = _op("POST", "/orders/build", pay.BuildOrderRequest, pay.BuildOrderResponse, "create an order for the embedded payment form", P, reconcile=ORDER, notifies=True)
    build_finalize_payment = _op("POST", "/build/finalize_payment", pay.BuildSessionRequest, pay.BuildStateResponse, "finalize a build payment", P, reconcile=BUILD, moves_money=True)
    build_cancel = _op("POST", "/build/cancel", pay.BuildSessionRequest, pay.BuildStateResponse, "cancel a build payment", P, reconcile=BUILD)
    build_state = _op("GET", "/build/state", pay.BuildSessionQuery, pay.BuildStateResponse, "read state of a build payment", P)
    build_card_data = _op("GET", "/build/cardData", pay.BuildSessionQuery, pay.BuildCardDataResponse, "read card data of a build payment", P)
    build_integrity = _op("GET", "/build/integrity", pay.BuildSessionQuery, pay.BuildIntegrityResponse, "integrity check of a build payment", P)
    build_confirm_payment = _op("POST", "/build/confirm_payment", pay.BuildConfirmRequest, pay.BuildStateResponse, "confirm a build payment", P, reconcile=BUILD, moves_money=True)

    # -- back office ------------------------------------------------------------------------------
    list_orders = _op("GET", "/orders", bo.OrderListQuery, bo.OrderListResponse, "list orders", B)
    get_order = _op("GET", "/orders/{orderId}", None, bo.OrderLookupResponse, "look up an order", B)
    list_operations = _op("GET", "/operations", bo.OperationListQuery, bo.OperationListResponse, "list operations", B)
    get_operation = _op("GET", "/operations/{operationId}", None, Operation, "look up an operation", B)
    get_operation_actions = _op("GET", "/operations/{operationId}/actions", None, bo.OperationActionsResponse, "list actions of an operation", B)
    refund_operation = _op("POST", "/operations/{operationId}/refunds", bo.PostOperationRequest, PostOp, "refund an operation", B, idempotency_key=True, moves_money=True)
    capture_operation = _op("POST", "/operations/{operationId}/captures", bo.PostOperationRequest, PostOp, "capture an operation", B, idempotency_key=True, moves_money=True)
    cancel_operation = _op("POST", "/operations/{operationId}/cancels", bo.CancelOperationRequest, PostOp, "cancel a capture", B, reconcile=ORDER, moves_money=True)
    get_customer_contracts = _op("GET", "/contracts/customers/{customerId}", None, bo.CustomerContractsResponse, "look up contracts of a customer", B)
    deactivate_contract = _op("POST", "/contracts/{contractId}/deactivation", None, EmptyResponse, "deactivate a contract", B, retry_safe=True)
    list_payment_methods = _op("GET", "/payment_methods", None, bo.PaymentMethodsResponse, "list payment methods", B)
    get_exchange_rates = _op("GET", "/mccExchangeRates", bo.ExchangeRatesQuery, bo.ExchangeRatesResponse, "read exchange rates", B)

    # -- reservation guarantee (current paths) ------------------------------------------------
    create_structure = _op("POST", "/structures", rg.StructureRequest, EmptyResponse, "create a structure", R, reconcile=LOOKUP)
    list_structures = _op("GET", "/structures", None, rg.StructureListResponse, "list structures", R)
    get_structure = _op("GET", "/structures/{structureId}", None, rg.StructureResponse, "look up a structure", R)
    create_reservation = _op("POST", "/reservations", rg.ReservationRequest, rg.ReservationIdResponse, "create a reservation", R, reconcile=RES)
    list_reservations = _op("GET", "/reservations", rg.ReservationListQuery, rg.ReservationListResponse, "list reservations", R)
    get_reservation = _op("GET", "/reservations/{reservationId}", None, rg.ReservationLookupResponse, "look up a reservation", R)
    create_reservation_paybylink = _op("POST", "/reservations/{reservationId}/paybylink", rg.ReservationPayByLinkRequest, pay.PayByLinkResponse, "pay-by-link for a reservation", R, reconcile=RES, notifies=True)
    create_no_show = _op("POST", "/no_shows", rg.ChangeAmountRequest, OperationResponse, "no-show charge", R, idempotency_key=True, moves_money=True)
    create_incremental = _op("POST", "/incrementals", rg.ChangeAmountRequest, OperationResponse, "incremental charge", R, idempotency_key=True, moves_money=True)
    create_delay_charge = _op("POST", "/delay_charges", rg.ChangeAmountRequest, OperationResponse, "delayed charge", R, idempotency_key=True, moves_money=True)
    create_terms_and_conditions = _op("POST", "/terms_and_conditions", rg.TermsAndConditionsRequest, rg.TermsAndConditionsIdResponse, "create terms and conditions", R)
    list_terms_and_conditions = _op("GET", "/terms_and_conditions", None, rg.TermsAndConditionsListResponse, "list terms and conditions", R)
    get_terms_and_conditions = _op("GET", "/terms_and_conditions/{termsAndConditionsId}", None, rg.TermsAndConditions, "look up terms and conditions", R)
    cancel_terms_and_conditions = _op("POST", "/terms_and_conditions/{termsAndConditionsId}/cancels", None, EmptyResponse, "cancel terms and conditions", R, retry_safe=True)
    create_structure_condition = _op("POST", "/structure_conditions", rg.StructureConditionRequest, rg.StructureConditionIdResponse, "create a structure condition", R)
    list_structure_conditions = _op("GET", "/structure_conditions/structures/{structureid}", None, rg.ConditionListResponse, "list the conditions of a structure", R)
    get_structure_condition = _op("GET", "/structure_conditions/{structureConditionId}", None, rg.StructureCondition, "look up a structure condition", R)
    cancel_structure_condition = _op("POST", "/structure_conditions/{structureConditionId}/cancels", None, EmptyResponse, "cancel a structure condition", R, retry_safe=True)
    create_structure_custom_field = _op("POST", "/structures/custom_fields", rg.CustomFieldRequest, rg.CustomFieldIdResponse, "create a structure custom field", R)
    get_structure_custom_field = _op("GET", "/structures/custom_fields/{customFieldId}", None, rg.CustomField, "look up a structure custom field", R)
    create_agency_condition = _op("POST", "/agency_conditions", rg.AgencyConditionRequest, rg.AgencyConditionIdResponse, "create an agency condition", R)
    list_agency_conditions = _op("GET", "/agency_conditions/agencies/{agencyid}", None, rg.ConditionListResponse, "list the conditions of an agency", R)
    get_agency_condition = _op("GET", "/agency_conditions/{agencyConditionId}", None, rg.AgencyCondition, "look up an agency condition", R)
    cancel_agency_condition = _op("POST", "/agency_conditions/{agencyConditionid}/cancels", None, EmptyResponse, "cancel an agency condition", R, retry_safe=True)
    get_agency_condition_pdf = _op("GET", "/agency_conditions/{agencyConditionid}/pdf", None, BinaryResponse, "an agency condition as PDF", R)
    create_agency = _op("POST", "/agencies", rg.AgencyRequest, EmptyResponse, "create an agency", R, reconcile=LOOKUP)
    list_agencies = _op("GET", "/agencies", None, rg.AgencyListResponse, "list agencies", R)
    get_agency = _op("GET", "/agencies/{agencyId}", None, rg.AgencyResponse, "look up an agency", R)
    create_agency_custom_field = _op("POST", "/agencies/custom_fields", rg.CustomFieldRequest, rg.CustomFieldIdResponse, "create an agency custom field", R)
    get_agency_custom_field = _op("GET", "/agencies/custom_fields/{customFieldId}", None, rg.CustomField, "look up an agency custom field", R)
    validate_incremental = _op("POST", "/reservations/incremental_validation", rg.ReservationValidationRequest, EmptyResponse, "validate an incremental charge", R, retry_safe=True)
    validate_no_show = _op("POST", "/reservations/noshow_validation", rg.ReservationValidationRequest, EmptyResponse, "validate a no-show charge", R, retry_safe=True)
    validate_delay_charge = _op("POST", "/reservations/delaycharge_validation", rg.ReservationValidationRequest, EmptyResponse, "validate a delayed charge", R, retry_safe=True)
    set_reservation_service = _op("POST", "/reservations/services", rg.ServiceRequest, EmptyResponse, "switch a reservation service on or off", R, retry_safe=True)
    list_reservation_services = _op("GET", "/reservations/services", rg.ServiceQuery, rg.ServiceListResponse, "list reservation services", R)

    # -- reservation guarantee (earlier path forms) -------------------------------------------
    validate_no_show_earlier = _op("POST", "/noshow_validation", rg.ReservationValidationRequest, EmptyResponse, "validate a no-show charge (earlier form)", E, version=EARLIER, retry_safe=True)
    validate_delay_charge_earlier = _op("POST", "/delaycharge_validation", rg.ReservationValidationRequest, EmptyResponse, "validate a delayed charge (earlier form)", E, version=EARLIER, retry_safe=True)
    validate_incremental_earlier = _op("POST", "/incremental_validation", rg.ReservationValidationRequest, EmptyResponse, "validate an incremental charge (earlier form)", E, version=EARLIER, retry_safe=True)
    create_custom_field_earlier = _op("POST", "/custom_fields", rg.CustomFieldRequest, rg.CustomFieldIdResponse, "create a custom field (earlier form)", E, version=EARLIER)
    get_custom_field_earlier = _op("GET", "/custom_fields/{customFieldId}", None, rg.CustomField, "look up a custom field (earlier form)", E, version=EARLIER)
    create_reservation_mit_earlier = _op("POST", "/reservation/{reservationId}/mit", rg.ReservationMitRequest, EmptyResponse, "merchant-initiated charge on a reservation (earlier form)", E, version=EARLIER, idempotency_key=True, moves_money=True)
    # fmt: on


#: Every operation, in the order of the gateway's interface description.
CATALOGUE: tuple[GatewayOperation[Any], ...] = tuple(
    value for value in vars(Catalogue).values() if isinstance(value, GatewayOperation)
)
BY_NAME: dict[str, GatewayOperation[Any]] = {op.name: op for op in CATALOGUE}

#: Operations that are one act on another path (a version's form), each to the operation it is a form of:
#: the same money moved or the same page opened, read back the same way (``reconcile``). A money step
#: that declares one may send another of its act in its place (``tasks.runner.StepContext.call``); no
#: definition widens this table: whether two calls are one act is the gateway's, said once here.
FORM_OF: dict[GatewayOperation[Any], GatewayOperation[Any]] = {
    Catalogue.create_paybylink_v2: Catalogue.create_paybylink_v3,
    Catalogue.create_paybylink_v1: Catalogue.create_paybylink_v3,
    Catalogue.create_paybylink: Catalogue.create_paybylink_v3,
    Catalogue.build_confirm_payment: Catalogue.build_finalize_payment,  # version 2 of the form
}


def same_act(one: GatewayOperation[Any], other: GatewayOperation[Any]) -> bool:
    """Whether ``one`` and ``other`` are the same act (the same operation, or forms of one, :data:`FORM_OF`)."""
    return FORM_OF.get(one, one) is FORM_OF.get(other, other)


def operation(name: str) -> GatewayOperation[Any]:
    """The operation called ``name``; KeyError names the unknown operation."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no gateway operation named {name!r}") from None
