"""The gateway's closed sets of values, its error codes and ISO 8583 response codes.

Values come from the gateway's public documentation and public client code (docs/gateway.md). Fields
typed with these enums are parsed leniently (see ``_base.LenientEnum``): a value missing here arrives as
``Unknown``, never as a member.

Where the ISO response code of a declined operation sits in a response is not published; durapay and
its simulator put it in ``operation.additionalData.responseCode`` (:data:`RESPONSE_CODE_FIELD`).
"""

from __future__ import annotations

from enum import StrEnum


class OperationType(StrEnum):
    AUTHORIZATION = "AUTHORIZATION"
    CAPTURE = "CAPTURE"
    VOID = "VOID"
    REFUND = "REFUND"
    CANCEL = "CANCEL"
    CARD_VERIFICATION = "CARD_VERIFICATION"
    NOSHOW = "NOSHOW"
    INCREMENTAL = "INCREMENTAL"
    DELAY_CHARGE = "DELAY_CHARGE"


class OperationResult(StrEnum):
    AUTHORIZED = "AUTHORIZED"
    EXECUTED = "EXECUTED"
    DECLINED = "DECLINED"
    DENIED_BY_RISK = "DENIED_BY_RISK"
    THREEDS_VALIDATED = "THREEDS_VALIDATED"
    THREEDS_FAILED = "THREEDS_FAILED"
    THREEDS_FAILED_ALT = "3DS_FAILED"  # seen in real traffic and the Build OpenAPI example
    PENDING = "PENDING"
    CANCELED = "CANCELED"
    CANCELLED = "CANCELLED"  # spelling seen in the official plugin
    VOIDED = "VOIDED"
    REFUNDED = "REFUNDED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"


#: Results after which nothing more will happen to the operation.
FINAL_RESULTS = frozenset(OperationResult) - {OperationResult.PENDING, OperationResult.THREEDS_VALIDATED}
#: Results that mean the money moved (or is held) as asked.
SUCCESS_RESULTS = frozenset({OperationResult.AUTHORIZED, OperationResult.EXECUTED})
#: Results that mean the payment did not happen.
FAILURE_RESULTS = frozenset(
    {
        OperationResult.DECLINED,
        OperationResult.DENIED_BY_RISK,
        OperationResult.THREEDS_FAILED,
        OperationResult.THREEDS_FAILED_ALT,
        OperationResult.CANCELED,
        OperationResult.CANCELLED,
        OperationResult.FAILED,
        OperationResult.EXPIRED,
    }
)


class Channel(StrEnum):
    ECOMMERCE = "ECOMMERCE"
    POS = "POS"
    BACKOFFICE = "BACKOFFICE"


class PaymentMethodType(StrEnum):
    CARD = "CARD"
    APM = "APM"


class ActionType(StrEnum):
    PAY = "PAY"
    VERIFY = "VERIFY"
    PREAUTH = "PREAUTH"


class CaptureType(StrEnum):
    IMPLICIT = "IMPLICIT"
    EXPLICIT = "EXPLICIT"


class Exemptions(StrEnum):
    NO_PREFERENCE = "NO_PREFERENCE"
    CHALLENGE_REQUESTED = "CHALLENGE_REQUESTED"


class RecurrenceAction(StrEnum):
    NO_RECURRING = "NO_RECURRING"
    SUBSEQUENT_PAYMENT = "SUBSEQUENT_PAYMENT"
    CONTRACT_CREATION = "CONTRACT_CREATION"
    CARD_SUBSTITUTION = "CARD_SUBSTITUTION"


class ContractType(StrEnum):
    MIT_UNSCHEDULED = "MIT_UNSCHEDULED"
    MIT_SCHEDULED = "MIT_SCHEDULED"
    CIT = "CIT"


class ThreeDSEnrollmentStatus(StrEnum):
    ENROLLED = "ENROLLED"
    NOT_ENROLLED = "NOT_ENROLLED"  # not published (the test environment answers ENROLLED + "notneeded"); still read


#: ``threeDSAuthRequest`` value that means no challenge is needed (seen in the sandbox).
THREEDS_NOT_NEEDED = "notneeded"


class BuildState(StrEnum):
    PAYMENT_METHOD_SELECTION = "PAYMENT_METHOD_SELECTION"
    CARD_DATA_COLLECTION = "CARD_DATA_COLLECTION"
    READY_FOR_PAYMENT = "READY_FOR_PAYMENT"
    REDIRECTED_TO_EXTERNAL_DOMAIN = "REDIRECTED_TO_EXTERNAL_DOMAIN"
    PAYMENT_COMPLETE = "PAYMENT_COMPLETE"
    GDI_VERIFICATION = "GDI_VERIFICATION"


class OrderState(StrEnum):
    TO_CAPTURE = "TO_CAPTURE"
    CAPTURED = "CAPTURED"


class AmountType(StrEnum):
    ORDER_AMOUNT = "ORDER_AMOUNT"
    AUTHORIZED_AMOUNT = "AUTHORIZED_AMOUNT"
    CAPTURED_AMOUNT = "CAPTURED_AMOUNT"


class PaymentService(StrEnum):
    APPLEPAY = "APPLEPAY"
    BANCOMATPAY = "BANCOMATPAY"
    BANCONTACT = "BANCONTACT"
    CARDS = "CARDS"
    GIROPAY = "GIROPAY"
    GOOGLEPAY = "GOOGLEPAY"
    IDEAL = "IDEAL"
    MYBANK = "MYBANK"
    PAYPAL = "PAYPAL"
    PAYPAL_BNPL = "PAYPAL_BNPL"


class ReservationType(StrEnum):
    GUARANTEED_NOSHOW = "GUARANTEED_NOSHOW"
    GUARANTEED_PENALTY = "GUARANTEED_PENALTY"
    PREPAID_REFUNDABLE = "PREPAID_REFUNDABLE"
    PREPAID_NOT_REFUNDABLE = "PREPAID_NOT_REFUNDABLE"
    BUNDLE = "BUNDLE"
    GUARANTEED = "GUARANTEED"


class CollectionType(StrEnum):
    INSTANT = "INSTANT"
    DELAYED = "DELAYED"
    INSTALLMENT = "INSTALLMENT"


class ActiveStatus(StrEnum):
    """Status of structures, agencies and reservations (reservations use CANCELED)."""

    ACTIVE = "ACTIVE"
    NOT_ACTIVE = "NOT_ACTIVE"
    CANCELED = "CANCELED"


class PaymentLinkStatus(StrEnum):
    """Not published; durapay's simulator reports these in ``paymentLink.status``."""

    ACTIVE = "ACTIVE"
    PAID = "PAID"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"


#: Error codes of the gateway's published reference list.
ERROR_CODES: dict[str, str] = {
    "PS0000": "Generic API error",
    "PS0001": "Cancel Operation not allowed for PAYPAL APM",
    "PS0002": "Can cancel the operation only in the same day it's performed",
    "PS0004": "Error during card-verification",
    "PS0005": "The sum of installments is greater than the order amount",
    "PS0006": "Installment date invalid or in the past",
    "PS0007": "The PaymentSession amount is greater than the order amount",
    "PS0008": "Invalid date (ISO 8601)",
    "PS0009": "Invalid currency",
    "PS0010": "Invalid date",
    "PS0011": "Invalid time (HH:mm)",
    "PS0012": "Time from/to incorrect",
    "PS0013": "Date from/to incorrect",
    "PS0017": "Invalid contractid",
    "PS0018": "Error occured during retrieve contract by customer",
    "PS0022": "An already voided operation can't be captured",
    "PS0023": "An already executed operation can't be captured",
    "PS0024": "An already refunded operation can't be captured",
    "PS0025": "The idempotency key is wrong or missing in the request.",
    "PS0026": "Invalid parameter",
    "PS0027": "Operation already refunded",
    "PS0028": "Operation already voided",
    "PS0029": "The refundable amount must be equal or lower than the captured amount",
    "PS0032": "PayPal void error",
    "PS0033": "PayPal refund error",
    "PS0034": "PayPal capture error",
    "PS0035": "JSON processing error",
    "PS0036": "Order amount must be numeric",
    "PS0040": "TenantId, MerchantId and TerminalId not found in JWT or Header Parameter",
    "PS0041": "Embedded javascript is forbidden",
    "PS0042": "Error during paybylink validation",
    "PS0043": "Error occurred during MIT invocation",
    "PS0044": "Error while the link is being deleted",
    "PS0045": "PaymentLink cannot be deleted because it has already been used",
    "PS0051": "Error during payment_method invocation. Terminal not found",
    "PS0052": "Invalid terminal id",
    "GW0001": "Invalid merchant URL",
}

#: Where durapay and its simulator carry the ISO 8583 response code of an operation.
RESPONSE_CODE_FIELD = "responseCode"

#: ISO 8583 response codes, as the gateway publishes them.
RESPONSE_CODES: dict[str, str] = {
    "000": "Approved",
    "100": "Do not honour",
    "101": "Expired card",
    "102": "Suspected fraud",
    "104": "Restricted card",
    "106": "PIN tries exceeded",
    "109": "Invalid merchant",
    "110": "Invalid amount",
    "111": "Invalid card number",
    "115": "Function not supported",
    "116": "Not sufficient funds",
    "117": "Incorrect PIN",
    "118": "No card record",
    "119": "Transaction not permitted to cardholder",
    "120": "Transaction not permitted to terminal",
    "121": "Exceeds amount limit",
    "122": "Transaction not permitted",
    "123": "Exceeds frequency limit",
    "124": "Violation of law",
    "125": "Card not effective",
    "126": "Invalid PIN block",
    "129": "Suspected counterfeit",
    "200": "Do not honour",
    "202": "Suspected fraud",
    "204": "Invalid card",
    "208": "Lost card",
    "209": "Stolen card",
    "210": "Counterfeit card",
    "413": "Excess reattempts",
    "888": "Pending",
    "902": "Invalid transaction",
    "903": "Re-enter transaction",
    "904": "Format error",
    "906": "Cutover in progress",
    "907": "Issuer inoperative",
    "908": "Routing not found",
    "909": "System malfunction",
    "911": "Issuer timed out",
    "913": "Duplicate transmission",
    "999": "Agreement error",
}

#: Declines that may pass later: the issuer cannot approve *now* (do not honour, funds, limits, the issuer or
#: the network unavailable). They map to the ISO 8583:1987 codes of Visa's decline categories 2 ("issuer
#: cannot approve at this time": 51 insufficient funds, 61 and 65 limits, 75 PIN tries, 19 re-enter, 91
#: issuer inoperative, 96 system malfunction) and 4 (generic: 05 do not honour), which Visa lets a merchant
#: reattempt, at most 15 times in 30 days, and to Mastercard's Merchant Advice Code 02 ("try again later").
#: docs/gateway.md, "Dunning caps", names the sources.
SOFT_DECLINE_CODES = frozenset({"100", "106", "116", "117", "121", "123", "903", "906", "907", "908", "909", "911", "913"})
#: Every other decline a later attempt with the same card data cannot cure: lost, stolen, counterfeit,
#: invalid, expired or restricted cards, fraud, refusals of the merchant, the transaction or the law, and
#: "excess reattempts" (Visa's category 1, "the issuer will never approve": 04, 07, 12, 14, 15, 41, 43, 46,
#: 57, 62, 93; category 3, "data quality", such as 54 expired card or 14 invalid account, needs new card
#: data, which a retry of a stored contract does not bring; Mastercard's Merchant Advice Codes 03 "do not
#: try again" and 21 "payment cancellation"). A recurring schedule stops on these (dunning does not retry).
HARD_DECLINE_CODES = frozenset(RESPONSE_CODES) - SOFT_DECLINE_CODES - {"000", "888"}


def decline_kind(response_code: str | None) -> str | None:
    """``"hard"``, ``"soft"`` or ``None`` (approved, pending or no code) for an ISO response code.

    A code this table does not know counts as hard: nothing says a later attempt may pass, and retrying
    a decline the issuer meant for good is what the card networks fine (Visa's category 1). A decline
    without any code is ``None``: whoever retries declines decides, and durapay's schedules do not retry
    it either (a card reported stolen may be declined without one).
    """
    if response_code is None or response_code in {"000", "888"}:
        return None
    return "soft" if response_code in SOFT_DECLINE_CODES else "hard"
