"""Card data: the one rule for what durapay may show, send, log and keep of it.

A flow that pays with a card (MOTO, three steps, init/pay, card verification) must keep the card in its
record until its last gateway call, so that a crash never loses the payment. Once the flow ends the
record keeps only what a support desk may see: the first six and last four digits. The CVV and expiry
date are dropped, as are wallet payment tokens. (PCI DSS forbids keeping the CVV after authorization;
Redis holding flows in flight should be protected as cardholder data: TLS, ACLs, no public access.)

Card numbers also turn up where no field is named for them: a ``description`` of "card 4349 9401 9900
4549", a ``customField``, a ``passThrough`` value, a cancel reason. So the rule is not about names:
any run of 13 to 19 digits (single spaces or dashes between them allowed) that passes the Luhn check
is a card number, masked to its first six and last four digits, wherever it is: in text, in a
number, in a key. :func:`mask` applies it (with the secrets named by their keys shown as ``***``) to
everything durapay shows or sends (API answers, console pages, history, events and webhooks, the CLI);
:func:`mask_text` to every log line (:func:`install_log_masking`) and, where it is written, to free text:
an operator's reason or name, a description, a filter, an error's message (the writers call it: the
pauses, bulk actions, webhook endpoints, schedules' operators, the flow store's history and errors), and
to every error answer (``service.errors.error_response``); :func:`scrub` to what a flow keeps once it
ended. The exception is identifiers (:func:`identifier`: the gateway's operation ids are 18-digit
numbers, one in ten of them Luhn-valid by chance, and order ids may be numbers too): the values under
their keys are kept whole, so that a flow stays findable by them and a finished flow's outcome still
names its operations. Text built from them keeps them whole too: the masking is told which values are
identifiers (``keep``, :func:`identifiers`: a flow's operation ids as its record lists them, from the
gateway's answers, ``FlowRecord.identifiers``; a log argument marked :class:`Identifier`), so that
"operation 800000000000000003 ended DECLINED" is shown whole wherever it is written or shown, and a
card number beside it is masked still (a stretch is kept only when it is exactly one of them).

An identifier kept whole must then never be a card number, so a merchant's identifiers are refused at
the door when they look like one (:func:`refuse_card_identifier`, :func:`refuse_card_identifiers`): an
order id, customer id, contract id, start or schedule key, any value the merchant gives under an
identifier's key, passThrough's included. "Looks like" is narrower than the mask's rule, so that ordinary
numeric ids are taken: the Luhn-valid stretch must also begin with a card scheme's prefix, 3 to 6 or
Mastercard's 2221-2720 (:data:`SCHEME_DIGITS`, :data:`SERIES_2`); a millisecond timestamp
(1732660000000, 13 digits from 1) or an order number that begins with a date (20261126000123) never is
one, and of random ids only those from such a prefix that pass the check (one in ten) are. The ids the gateway assigns
(:data:`GATEWAY_IDS`: operation, link and session ids...) are not the merchant's to choose and are
taken as they are; ids durapay derives (flow ids, schedule ids, ``-2`` order ids, its own keys) never
pass through the door. Every entry asks this one rule: the engine's start (the Python API, the CLI and
the API), the schedules' input and key, the API's ``Idempotency-Key``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

REDACTED = "redacted"
HIDDEN = "***"

#: Keys whose values are secrets: shown as ``***`` (the expiry date and wallet data too: with a PAN
#: they are what a fraudster needs).
SECRET_KEYS = frozenset(
    {"cvv", "cvv2", "cvc", "expirydate", "walletpaymentdata", "securitytoken", "threedsauthresponse", "pares", "password"}
)
#: Keys holding a card number: first six and last four digits kept, whatever the check digit says.
PAN_KEYS = frozenset({"pan", "cardnumber"})
#: Keys whose values are identifiers, never card data, besides every key named like one: ``id``, or
#: ending in ``Id``/``Ids``/``_id``/``_ids`` (``orderId``, ``operationIds``, ``paymentEndToEndId``...).
#: A merchant's start key (``Idempotency-Key``) is one: a numeric key shown masked could not be found again.
IDENTIFIER_KEYS = frozenset({"id", "ids", "ops", "orders", "flow", "flows", "start_key", "idempotencyKey"})


def identifier(key: Any) -> bool:
    """Whether a value under ``key`` is an identifier (kept whole: see the module's docstring)."""
    name = str(key)
    return name in IDENTIFIER_KEYS or name.endswith(("Id", "Ids", "ID", "_id", "_ids"))


def _kept(key: Any, value: Any) -> bool:
    """An identifier's value: a string or number, or a list of them, under an identifier's key."""
    scalars = value if isinstance(value, list) else [value]
    return identifier(key) and all(isinstance(item, str | int) or item is None for item in scalars)


#: Secrets a finished flow still keeps as they are (a late notification of its order is checked
#: against its token): random text, never card data, so never altered by :func:`scrub`.
KEPT_SECRETS = frozenset({"securitytoken"})
#: A run of digits, single spaces or dashes allowed between them (the candidates are its groups).
_RUN = re.compile(r"\d+(?:[ -]\d+)*")
#: Digits of a card number.
SHORTEST, LONGEST = 13, 19
#: A run longer than this (in characters) is not searched group by group but has all its digits
#: hidden: bounded work on a megabyte of digits, and no card number in it is let through.
LONGEST_RUN = 400


def luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def mask_pan(pan: str) -> str:
    """First six and last four digits (what PCI DSS allows to show); anything too short to be a card
    number is hidden whole."""
    digits = pan.strip()
    if len(digits) < SHORTEST:
        return HIDDEN
    return digits[:6] + "*" * (len(digits) - 10) + digits[-4:]


def _stretches(run: str) -> Iterator[list[int]]:
    """The positions in ``run`` (digit groups, single spaces or dashes between them) of the digits of
    each Luhn-valid stretch of whole groups with 13 to 19 digits: the card numbers the run may hold.
    At most 19 groups are joined from each: linear in the run's length."""
    groups = [(match.start(), match.end()) for match in re.finditer(r"\d+", run)]
    for first in range(len(groups)):
        digits = ""
        for last in range(first, len(groups)):
            digits += run[groups[last][0] : groups[last][1]]
            if len(digits) > LONGEST:
                break
            if len(digits) >= SHORTEST and luhn(digits):
                yield [p for start, end in groups[first : last + 1] for p in range(start, end)]


def _mask_run(run: str, keep: frozenset[str] = frozenset()) -> str:
    """A run of digit groups with every Luhn-valid stretch of whole groups (13-19 digits) masked to its
    first six and last four digits, but a stretch that is exactly one of the identifiers ``keep`` (their
    digits); separators kept."""
    hidden: set[int] = set()  # positions in ``run`` of digits to hide
    for places in _stretches(run):
        if keep and "".join(run[place] for place in places) in keep:
            continue
        hidden.update(places[6:-4])
    if not hidden:
        return run
    return "".join("*" if index in hidden else char for index, char in enumerate(run))


class Identifier(str):
    """A value known to be an identifier (a gateway operation id), never card data: marked so that the
    text built from it keeps it whole where it is written (a log line's argument: :func:`install_log_masking`).
    ``str`` in every other respect."""

    __slots__ = ()


def identifiers(values: Iterable[Any]) -> frozenset[str]:
    """The digits of each run of ``values`` (identifiers: gateway operation ids, as a flow records them)
    that :func:`mask_text` must leave whole: a ``keep`` set."""
    found: set[str] = set()
    for value in values:
        if isinstance(value, str | int) and not isinstance(value, bool):
            for match in _RUN.finditer(str(value)[:200]):
                found.add(re.sub(r"\D", "", match.group(0)))
    return frozenset(digits for digits in found if SHORTEST <= len(digits) <= LONGEST)


#: Keys whose values are the gateway's operation ids (:func:`operation_ids_in`).
OPERATION_KEYS = frozenset(
    {"operationId", "operationIds", "originalOperationId", "cancelledOperationId", "paidByOperationId", "parentOperationId"}
)


def operation_ids_in(value: Any, limit: int = 100) -> list[Any]:
    """The values under :data:`OPERATION_KEYS` anywhere in ``value`` (at most ``limit``): the operation
    ids of something durapay built from the gateway's answers (an event, an outcome, an error), never of
    a merchant's input."""
    found: list[Any] = []
    pending = [value]
    while pending and len(found) < limit:
        item = pending.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if key in OPERATION_KEYS:
                    found.extend(inner if isinstance(inner, list) else [inner])
                elif isinstance(inner, dict | list):
                    pending.append(inner)
        elif isinstance(item, list):
            pending.extend(item)
    return found[:limit]


def mask_text(text: str, keep: frozenset[str] = frozenset()) -> str:
    """``text`` with every card number in it masked (see the module's docstring). ``keep``: identifiers
    the text is built from (:func:`identifiers`), left whole where they appear as a run of their own;
    never anything else: a card number next to one is masked still."""
    if len(text) < SHORTEST or not any(char.isdigit() for char in text):
        return text

    def masked(match: re.Match[str]) -> str:
        run = match.group(0)
        if len(run) < SHORTEST:
            return run
        if len(run) > LONGEST_RUN:
            return re.sub(r"\d", "*", run)
        return _mask_run(run, keep)

    return _RUN.sub(masked, text)


#: The first digits of the card schemes' numbers: Amex, Diners and JCB (3), Visa (4), Mastercard (5),
#: Discover, UnionPay and Maestro (6); and Mastercard's 2-series, whose numbers begin 2221 to 2720
#: (:data:`SERIES_2`). An identifier's Luhn-valid stretch from any other prefix (a millisecond timestamp's
#: 1, an order number that begins with a date from 2000 to 2220) is not taken for a card number.
SCHEME_DIGITS = frozenset("3456")
SERIES_2 = range(2221, 2721)
#: Why a merchant's identifier is refused (the refusal names the field).
CARD_IDENTIFIER = "looks like a card number; card data must not be used as an identifier"
#: Identifier keys whose values the gateway assigns (a merchant copies them from its answers: an
#: operation to refund or capture, a link, a 3DS challenge's ``paymentId``): not merchant fields. One in
#: ten of the 18-digit operation ids passes the Luhn check; refusing one would refuse a real refund.
GATEWAY_IDS = frozenset(
    {
        "operationId",
        "originalOperationId",
        "cancelledOperationId",
        "paidByOperationId",
        "parentOperationId",
        "paymentId",
        "paymentEndToEndId",
        "linkId",
        "paymentLinkId",
        "sessionId",
        "terminalId",
        "termsAndConditionsId",
        "termsAndConditionsIds",
        "structureConditionId",
        "agencyConditionId",
        "customFieldId",
        "serviceTecId",
        "tecGuaranteedPenaltyId",
        "tecGuaranteedNoShowId",
        "tecRefundableId",
        "tecNotRefundableId",
        "eventId",
        "correlationId",
    }
)
#: Keys under which every field is the merchant's own whatever its name: no gateway id is exempt there.
OPEN_KEYS = frozenset({"passThrough"})


class CardIdentifier(ValueError):
    """A merchant's identifier that looks like a card number: ``field`` names it, ``reason`` says why
    (with the number masked, never whole). ``str()`` is the reason: where a validator's location names
    the field (an API header), the message is the reason alone."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def card_like(text: str) -> str | None:
    """The first stretch of ``text`` that looks like a card number as an identifier's rule reads it (a
    Luhn-valid run of 13-19 digits, spaces or dashes between them allowed, from a digit of
    :data:`SCHEME_DIGITS`), masked to first six and last four; None when there is none."""
    if len(text) < SHORTEST:
        return None
    for match in _RUN.finditer(text):
        run = match.group(0)
        for places in _stretches(run):
            digits = "".join(run[place] for place in places)
            if digits[0] in SCHEME_DIGITS or int(digits[:4]) in SERIES_2:
                return mask_pan(digits)
    return None


def refuse_card_identifier(field: str, value: Any) -> None:
    """Raise :class:`CardIdentifier` when ``value`` (a merchant's identifier: text or a number) looks like
    a card number (:func:`card_like`)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return
    found = card_like(str(value))
    if found is not None:
        raise CardIdentifier(field, f"{CARD_IDENTIFIER} (it holds {found}, which passes the Luhn check)")


def merchant_identifier(value: Any) -> Any:
    """:func:`refuse_card_identifier` as a pydantic validator (``AfterValidator``) of a field or header
    that is one identifier: its location names the field."""
    refuse_card_identifier("", value)
    return value


def refuse_card_identifiers(data: Any, path: str = "", *, exempt: frozenset[str] = GATEWAY_IDS) -> None:
    """Raise :class:`CardIdentifier` (naming the field by its dotted path) for the first identifier of a
    merchant's input ``data`` (the JSON form) that looks like a card number: every value under a key
    :func:`identifier` names, at any depth, but the gateway's (``exempt``, none under passThrough)."""
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if identifier(key) and str(key) not in exempt:
                if isinstance(value, list):
                    for index, item in enumerate(value):
                        refuse_card_identifier(f"{where}.{index}", item)
                else:
                    refuse_card_identifier(where, value)
            refuse_card_identifiers(value, where, exempt=frozenset() if key in OPEN_KEYS else exempt)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            refuse_card_identifiers(item, f"{path}.{index}", exempt=exempt)


def mask(value: Any, keep: frozenset[str] = frozenset()) -> Any:
    """A copy of ``value`` fit to show: secrets (``SECRET_KEYS``) as ``***``, card fields and card
    numbers anywhere masked to first six and last four, identifiers kept, at any depth. ``keep``: the
    identifiers its text is built from (:func:`identifiers`: a flow's gateway operation ids), whole in
    its text too."""
    if isinstance(value, dict):
        shown: dict[Any, Any] = {}
        for key, item in value.items():
            lowered = str(key).lower()
            name = mask_text(key) if isinstance(key, str) else key
            if lowered in SECRET_KEYS and item:
                shown[name] = HIDDEN
            elif lowered in PAN_KEYS and isinstance(item, str):
                shown[name] = mask_pan(item)
            elif _kept(key, item):
                shown[name] = item
            else:
                shown[name] = mask(item, keep)
        return shown
    if isinstance(value, list | tuple):
        return [mask(item, keep) for item in value]
    if isinstance(value, str):
        return mask_text(value, keep)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** (SHORTEST - 1):
        text = str(value)
        masked = mask_text(text, keep)
        return value if masked == text else masked
    return value


def scrub(data: Any, keep: frozenset[str] = frozenset()) -> Any:
    """A copy of a flow's input (or outputs, outcome, error) fit to keep once the flow ended: ``card``
    reduced to its masked ``pan``, ``walletPaymentData`` removed, and card numbers anywhere masked
    (identifiers and ``KEPT_SECRETS`` kept as they are, and ``keep`` in its text), at any depth."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "card" and isinstance(value, dict):
                out[key] = {"pan": mask_pan(str(value.get("pan", "")))} if value.get("pan") else {}
            elif key == "walletPaymentData":
                out[key] = REDACTED
            elif _kept(key, value) or str(key).lower() in KEPT_SECRETS:
                out[key] = value
            else:
                out[mask_text(key)] = scrub(value, keep)
        return out
    if isinstance(data, list):
        return [scrub(item, keep) for item in data]
    return mask(data, keep)


def holds_card(data: Any) -> bool:
    """Whether ``data`` (a flow's input) carries card data a step sends and :func:`scrub` erases: a
    ``card`` with a ``pan``, or ``walletPaymentData`` (at any depth)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "card" and isinstance(value, dict) and value.get("pan"):
                return True
            if key == "walletPaymentData" and value and value != REDACTED:
                return True
            if isinstance(value, dict | list) and holds_card(value):
                return True
    if isinstance(data, list):
        return any(holds_card(item) for item in data)
    return False


def erased(data: Any) -> bool:
    """Whether ``data`` (a flow's input) lost to :func:`scrub` what a new attempt needs: a ``card`` reduced
    to its masked ``pan``, or ``walletPaymentData`` removed. A failed flow whose input is erased cannot be
    started again (``workflows.engine.operator_actions``: retry is then neither offered nor accepted)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "card" and isinstance(value, dict) and set(value) <= {"pan"}:
                return True
            if key == "walletPaymentData" and value == REDACTED:
                return True
            if isinstance(value, dict | list) and erased(value):
                return True
    if isinstance(data, list):
        return any(erased(item) for item in data)
    return False


def _marked(args: Any) -> list[Identifier]:
    """The arguments of a log record marked as identifiers (:class:`Identifier`)."""
    values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else ()
    return [value for value in values if isinstance(value, Identifier)]


def install_log_masking() -> None:
    """Mask card numbers in every log record this process makes, whatever logger or handler (the
    message with its arguments, and an exception's text: a validation error may quote an input).

    A record factory and not a handler's filter: filters belong to handlers that Celery, uvicorn and a
    deployment's own logging configuration set up and replace; the factory sees every record, and
    only records that will be handled (their level is checked before one is made). Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "masks_card_numbers", False):
        return

    def masking(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's to report, not ours
            return record
        record.msg, record.args = mask_text(message, identifiers(_marked(record.args))), None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
        return record

    masking.masks_card_numbers = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(masking)
