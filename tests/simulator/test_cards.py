"""The card table: published cards as published, the last-digit rule, outcome tokens and scripts."""

from __future__ import annotations

import pytest

from durapay.gateway import SOFT_DECLINE_CODES, OperationResult, decline_kind
from durapay.simulator._cards import (
    LAST_DIGIT_RULE,
    PUBLISHED_CARDS,
    OutcomeScripts,
    card_outcome,
    card_profile,
    circuit,
    masked,
    outcome_from_token,
)


def test_published_cards_behave_as_published() -> None:
    assert card_outcome("4349940199004549", with_3ds=True).approved
    assert not card_profile("4349940199004549").challenge
    assert card_profile("5186151650005008").challenge and card_outcome("5186151650005008", with_3ds=True).approved
    declined = card_outcome("4349940199997007", with_3ds=True)
    assert (declined.failure, declined.response_code) == (OperationResult.DECLINED, "100")
    assert card_outcome("5533893874304465", with_3ds=True).failure == OperationResult.THREEDS_FAILED
    assert len(PUBLISHED_CARDS) == 4


@pytest.mark.parametrize(
    ("digit", "failure", "code", "kind"),
    [
        ("0", None, "000", None),
        ("2", OperationResult.DECLINED, "116", "soft"),
        ("3", OperationResult.DECLINED, "100", "soft"),
        ("4", OperationResult.DECLINED, "208", "hard"),
        ("5", OperationResult.DECLINED, "209", "hard"),
        ("6", OperationResult.DECLINED, "111", "hard"),
        ("8", OperationResult.DENIED_BY_RISK, "102", "hard"),
        ("9", None, "000", None),
    ],
)
def test_other_cards_by_last_digit(digit: str, failure: OperationResult | None, code: str, kind: str | None) -> None:
    outcome = card_outcome("411111111111111" + digit, with_3ds=True)
    assert (outcome.failure, outcome.response_code, decline_kind(outcome.response_code)) == (failure, code, kind)


def test_challenge_and_3ds_failure_digits_only_matter_with_3ds() -> None:
    assert card_profile("4111111111111111").challenge
    assert card_outcome("4111111111111117", with_3ds=True).failure == OperationResult.THREEDS_FAILED
    assert card_outcome("4111111111111117", with_3ds=False).approved
    assert set(LAST_DIGIT_RULE) == set("0123456789")


def test_outcome_tokens() -> None:
    assert outcome_from_token("000").approved
    assert outcome_from_token("116").response_code in SOFT_DECLINE_CODES
    assert outcome_from_token("threeds_failed").failure == OperationResult.THREEDS_FAILED
    with pytest.raises(ValueError, match="unknown outcome"):
        outcome_from_token("often")


def test_scripts_are_consumed_in_order_contract_first() -> None:
    scripts = OutcomeScripts()
    scripts.push(["116", "000"], contract_id="c-1")
    scripts.push(["209"], pan="4111111111111110")
    taken = [scripts.take(contract_id="c-1", pan="4111111111111110") for _ in range(4)]
    assert [(o.response_code if o else None) for o in taken] == ["116", "000", "209", None]
    with pytest.raises(ValueError, match="exactly one"):
        scripts.push(["000"])


def test_card_helpers() -> None:
    assert [circuit(p) for p in ("4349940199004549", "5186151650005008", "2221000000000009", "371449635398431")] == [
        "VISA",
        "MC",
        "MC",
        "AMEX",
    ]
    assert masked("4349940199004549") == "434994******4549"
