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
:func:`mask_text` to every log line (``config.logging``); :func:`scrub` to what a flow keeps once it
ended. The exception is identifiers (:func:`identifier`: the gateway's operation ids are 18-digit
numbers, one in ten of them Luhn-valid by chance, and order ids may be numbers too): the values under
their keys are kept whole, so that a flow stays findable by them and a finished flow's outcome still
names its operations. (An operation id quoted in free text, a history entry's words, may be masked.)
"""

from __future__ import annotations

import logging
import re
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


def _mask_run(run: str) -> str:
    """A run of digit groups with every Luhn-valid stretch of whole groups (13-19 digits) masked to its
    first six and last four digits; separators kept."""
    groups = [(match.start(), match.end()) for match in re.finditer(r"\d+", run)]
    hidden: set[int] = set()  # positions in ``run`` of digits to hide
    for first in range(len(groups)):
        digits = ""
        for last in range(first, len(groups)):
            digits += run[groups[last][0] : groups[last][1]]
            if len(digits) > LONGEST:
                break
            if len(digits) >= SHORTEST and luhn(digits):
                places = [p for start, end in groups[first : last + 1] for p in range(start, end)]
                hidden.update(places[6:-4])
    if not hidden:
        return run
    return "".join("*" if index in hidden else char for index, char in enumerate(run))


def mask_text(text: str) -> str:
    """``text`` with every card number in it masked (see the module's docstring)."""
    if len(text) < SHORTEST or not any(char.isdigit() for char in text):
        return text

    def masked(match: re.Match[str]) -> str:
        run = match.group(0)
        if len(run) < SHORTEST:
            return run
        if len(run) > LONGEST_RUN:
            return re.sub(r"\d", "*", run)
        return _mask_run(run)

    return _RUN.sub(masked, text)


def mask(value: Any) -> Any:
    """A copy of ``value`` fit to show: secrets (``SECRET_KEYS``) as ``***``, card fields and card
    numbers anywhere masked to first six and last four, identifiers kept, at any depth."""
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
                shown[name] = mask(item)
        return shown
    if isinstance(value, list | tuple):
        return [mask(item) for item in value]
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** (SHORTEST - 1):
        text = str(value)
        masked = mask_text(text)
        return value if masked == text else masked
    return value


def scrub(data: Any) -> Any:
    """A copy of a flow's input (or outputs, outcome, error) fit to keep once the flow ended: ``card``
    reduced to its masked ``pan``, ``walletPaymentData`` removed, and card numbers anywhere masked
    (identifiers and ``KEPT_SECRETS`` kept as they are), at any depth."""
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
                out[mask_text(key)] = scrub(value)
        return out
    if isinstance(data, list):
        return [scrub(item) for item in data]
    return mask(data)


def erased(data: Any) -> bool:
    """Whether ``data`` (a flow's input) lost to :func:`scrub` what a new attempt needs: a ``card`` reduced
    to its masked ``pan``, or ``walletPaymentData`` removed. A failed flow whose input is erased cannot be
    started again (``workflows.operator_actions``: retry is then neither offered nor accepted)."""
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
        record.msg, record.args = mask_text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
        return record

    masking.masks_card_numbers = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(masking)
