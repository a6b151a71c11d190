"""Unique keys and order ids for tests that can never look like a card number.

A merchant's identifier holding a Luhn-valid run of 13-19 digits from a card scheme's prefix is refused
(``durapay.workflows.engine.sensitive.card_like``). A uuid's 32 hex characters hold such a run about once in
1,500 keys, which made a test fail at random; these ids carry no digit at all.
"""

from __future__ import annotations

import uuid

_LETTERS = str.maketrans("0123456789", "ghijklmnop")


def unique(prefix: str) -> str:
    """``prefix-`` and 32 random letters (a uuid4 with its digits spelt as letters g-p)."""
    return f"{prefix}-{uuid.uuid4().hex.translate(_LETTERS)}"
