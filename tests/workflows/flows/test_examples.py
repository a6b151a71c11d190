"""Every flow kind has an example input (``workflows.flows.examples``, issue 41 finding 8), read as the
kind's input by the same strict reader as a start: what ``durapay flows kinds KIND --example``, the
console and the OpenAPI document show. tests/test_snippets.py starts each against ``durapay dev``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from durapay.gateway import validate_strict
from durapay.workflows.engine.sensitive import card_like
from durapay.workflows.flows import REGISTRY
from durapay.workflows.flows.examples import MAKERS, example


def test_every_kind_has_an_example_and_nothing_else_has_one() -> None:
    assert set(MAKERS) == set(REGISTRY)


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_each_example_is_its_kinds_valid_input_with_a_fresh_order(kind: str) -> None:
    today = datetime(2026, 11, 23, 5, tzinfo=UTC)
    first, second = example(kind, today=today), example(kind, today=today)
    validate_strict(REGISTRY[kind].input_model, first.data)
    assert first.data != second.data or "order" not in first.data, "a second start is a second flow"
    order = first.data.get("order") or {}
    assert len(order.get("orderId", "")) <= 18, "the gateway takes 18 characters"
    assert not card_like(str(order.get("orderId", ""))), "an order id that looks like a card number is refused"
