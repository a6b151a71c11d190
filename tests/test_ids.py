"""tests/ids.py: the ids tests make are unique and never card-like."""

from __future__ import annotations

from durapay.workflows.engine.sensitive import card_like
from tests.ids import unique


def test_ids_hold_no_digit_and_do_not_repeat() -> None:
    made = {unique("k") for _ in range(2000)}
    assert len(made) == 2000
    assert all(card_like(value) is None and not any(c.isdigit() for c in value[2:]) for value in made)
