"""Test cards: what each card number does, and scripted outcomes that override it.

The published test cards behave as published; every other number behaves by
its last digit, so a test can pick any outcome with any valid-looking number. Expiry dates are never
checked (the published cards' dates are past by now). A script (``POST /_sim/scripts``) queues
outcomes for a contract or a card number; each payment attempt takes the next one before the card
rule applies, which is how dunning tests get "insufficient funds, then approved".

Outcome tokens, in scripts and in wallet hints: an ISO 8583 response code ("000" approves, any other
declines with that code), ``DENIED_BY_RISK``, ``THREEDS_FAILED`` or ``FAILED``.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from durapay.gateway import RESPONSE_CODES, OperationResult

APPROVED = "000"


@dataclass(frozen=True)
class CardProfile:
    """How a card number behaves: its authorization answer and its 3DS behaviour."""

    response_code: str
    challenge: bool = False
    threeds_fails: bool = False
    denied_by_risk: bool = False
    description: str = ""


PUBLISHED_CARDS: dict[str, CardProfile] = {
    "4349940199004549": CardProfile(APPROVED, description="VISA, approved, frictionless"),
    "5186151650005008": CardProfile(APPROVED, challenge=True, description="MC, approved after a 3DS challenge"),
    "4349940199997007": CardProfile("100", description="VISA, declined 100 do not honour (soft)"),
    "5533893874304465": CardProfile(APPROVED, challenge=True, threeds_fails=True, description="MC, 3DS fails"),
}

LAST_DIGIT_RULE: dict[str, CardProfile] = {
    "0": CardProfile(APPROVED, description="approved, frictionless"),
    "1": CardProfile(APPROVED, challenge=True, description="approved after a 3DS challenge"),
    "2": CardProfile("116", description="soft decline 116 insufficient funds"),
    "3": CardProfile("100", description="soft decline 100 do not honour"),
    "4": CardProfile("208", description="hard decline 208 lost card"),
    "5": CardProfile("209", description="hard decline 209 stolen card"),
    "6": CardProfile("111", description="hard decline 111 invalid card number"),
    "7": CardProfile(APPROVED, challenge=True, threeds_fails=True, description="3DS authentication fails"),
    "8": CardProfile(APPROVED, denied_by_risk=True, description="DENIED_BY_RISK"),
    "9": CardProfile(APPROVED, description="approved, frictionless"),
}


def card_profile(pan: str) -> CardProfile:
    return PUBLISHED_CARDS.get(pan) or LAST_DIGIT_RULE.get(pan[-1:], LAST_DIGIT_RULE["0"])


@dataclass(frozen=True)
class Outcome:
    """The answer to one payment attempt. ``failure`` is None when approved."""

    failure: OperationResult | None
    response_code: str | None

    @property
    def approved(self) -> bool:
        return self.failure is None


OUTCOME_APPROVED = Outcome(None, APPROVED)
DENIED = Outcome(OperationResult.DENIED_BY_RISK, "102")
THREEDS_FAILURE = Outcome(OperationResult.THREEDS_FAILED, None)
TECHNICAL_FAILURE = Outcome(OperationResult.FAILED, "909")
_SPECIAL_TOKENS = {"DENIED_BY_RISK": DENIED, "THREEDS_FAILED": THREEDS_FAILURE, "FAILED": TECHNICAL_FAILURE}


def outcome_from_token(token: str) -> Outcome:
    """``"000"`` → approved, ``"116"`` → declined 116, ``"DENIED_BY_RISK"``...; ValueError otherwise."""
    token = token.strip().upper()
    if token in _SPECIAL_TOKENS:
        return _SPECIAL_TOKENS[token]
    if token == APPROVED:
        return OUTCOME_APPROVED
    if token in RESPONSE_CODES or (len(token) == 3 and (token.isascii() and token.isdigit())):
        return Outcome(OperationResult.DECLINED, token)
    raise ValueError(f"unknown outcome {token!r}: use an ISO response code, DENIED_BY_RISK, THREEDS_FAILED or FAILED")


def card_outcome(pan: str, *, with_3ds: bool) -> Outcome:
    """The card rule. Without 3DS (MOTO, MIT, wallet, charges) a 3DS-failing card simply approves."""
    profile = card_profile(pan)
    if with_3ds and profile.threeds_fails:
        return THREEDS_FAILURE
    if profile.denied_by_risk:
        return DENIED
    if profile.response_code != APPROVED:
        return Outcome(OperationResult.DECLINED, profile.response_code)
    return OUTCOME_APPROVED


class OutcomeScripts:
    """Queues of outcome tokens per contract id and per card number. Not thread-safe: the state's lock guards it."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[str]] = {}

    @staticmethod
    def _key(kind: str, value: str) -> str:
        return f"{kind}:{value}"

    def push(self, outcomes: Iterable[str], *, contract_id: str | None = None, pan: str | None = None) -> None:
        if (contract_id is None) == (pan is None):
            raise ValueError("give exactly one of contractId and pan")
        tokens = [str(token).strip().upper() for token in outcomes]
        for token in tokens:
            outcome_from_token(token)  # refuse unknown tokens now, not at payment time
        key = self._key("contract", contract_id) if contract_id is not None else self._key("pan", str(pan))
        self._queues.setdefault(key, deque()).extend(tokens)

    def take(self, *, contract_id: str | None, pan: str | None) -> Outcome | None:
        """The next scripted outcome for this attempt (the contract's first, then the card's), if any."""
        for key in (
            self._key("contract", contract_id) if contract_id else None,
            self._key("pan", pan) if pan else None,
        ):
            queue = self._queues.get(key) if key else None
            if queue:
                return outcome_from_token(queue.popleft())
        return None

    def clear(self) -> None:
        self._queues.clear()

    def snapshot(self) -> dict[str, list[str]]:
        return {key: list(queue) for key, queue in self._queues.items() if queue}

    def restore(self, data: dict[str, list[str]]) -> None:
        self._queues = {key: deque(values) for key, values in data.items()}


def circuit(pan: str) -> str:
    """The card scheme from the number's prefix (enough for a simulator)."""
    if pan.startswith("4"):
        return "VISA"
    if pan[:2] in {"51", "52", "53", "54", "55"} or "2221" <= pan[:4] <= "2720":
        return "MC"
    if pan[:2] in {"34", "37"}:
        return "AMEX"
    if pan[:2] in {"30", "36", "38"}:
        return "DINERS"
    if pan[:2] == "35":
        return "JCB"
    return "MAESTRO"


def masked(pan: str) -> str:
    return pan[:6] + "*" * (len(pan) - 10) + pan[-4:]


def card_id(pan: str) -> str:
    """A stable 64-hex card reference, as the sandbox returns in ``additionalData.cardId``."""
    return hashlib.sha256(pan.encode()).hexdigest()


def expiry_yyyymm(mmyy: str) -> str:
    return f"20{mmyy[2:]}{mmyy[:2]}"
