"""Decline classification (``gateway._codes``): which ISO response codes dunning may retry."""

from __future__ import annotations

import pytest

from durapay.gateway import HARD_DECLINE_CODES, RESPONSE_CODES, SOFT_DECLINE_CODES, decline_kind


@pytest.mark.parametrize("code", ["100", "106", "116", "117", "121", "123", "903", "906", "907", "908", "909", "911", "913"])
def test_a_decline_the_issuer_may_approve_later_is_soft(code: str) -> None:
    """Visa's category 2 ("cannot approve at this time": funds, limits, issuer or system unavailable) and
    its generic do-not-honour: retried within the networks' caps."""
    assert decline_kind(code) == "soft"


HARD = "101 102 104 109 110 111 115 118 119 120 122 124 125 129 202 204 208 209 210 413 902 904 999".split()


@pytest.mark.parametrize("code", HARD)
def test_a_decline_no_retry_of_the_same_card_data_cures_is_hard(code: str) -> None:
    """Visa's category 1 (never approved: lost, stolen, invalid, not permitted, the law), category 3 (new
    card data needed, which a retry of a stored contract does not bring), and 413 "excess reattempts"."""
    assert decline_kind(code) == "hard"


def test_an_unknown_code_is_hard_and_a_missing_one_is_no_kind() -> None:
    """Issue 23, item 7: an unknown code counted as soft and was retried. Nothing says it may pass later:
    hard. No code at all (or approved, pending) has no kind; schedules do not retry it either."""
    assert [decline_kind(code) for code in ("05", "777", "X1")] == ["hard", "hard", "hard"]
    assert [decline_kind(code) for code in (None, "000", "888")] == [None, None, None]


def test_every_published_code_is_approved_pending_soft_or_hard() -> None:
    assert SOFT_DECLINE_CODES | HARD_DECLINE_CODES | {"000", "888"} == set(RESPONSE_CODES)
    assert not SOFT_DECLINE_CODES & HARD_DECLINE_CODES
