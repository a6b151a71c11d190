"""The simulator's request parsing (``simulator/_protocol.py``)."""

from __future__ import annotations

import pytest

from durapay.simulator._protocol import SimError, parse_minor


@pytest.mark.parametrize("value", ["\u00b2", "1\u00b2", "\u0661\u0665\u0660\u0660", "\uff11\uff15"])
def test_an_amount_in_other_digits_is_a_field_error_not_a_500(value: str) -> None:
    """``str.isdigit`` takes superscripts, Arabic-Indic and full-width digits, which ``int`` then refuses
    (a 500) or reads as an amount: only ASCII digits are an amount."""
    with pytest.raises(SimError):
        parse_minor(value, "amount")
