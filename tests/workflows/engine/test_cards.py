"""Card data at rest (``workflows.engine.cards``): sealed before Redis, opened for the step, rotated.

The file-level proof (no card number in the AOF or an RDB dump after every card-carrying kind) is
``tests/workflows/integration/test_card_at_rest.py``; here the rules it rests on.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durapay.config import load_settings
from durapay.config.settings import SettingsError
from durapay.gateway import Card, GatewayModel
from durapay.tasks.outcomes import Finish
from durapay.workflows.engine import Engine
from durapay.workflows.engine.cards import (
    CardKeyMissing,
    CardUnreadable,
    CardVault,
    carries,
    in_flight,
    may_carry,
    new_key,
    presented,
)
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.steps import FlowDefinition
from durapay.workflows.engine.store import compact_json
from tests.workflows.engine_support import ScriptedStep, summary, wait_step

PAN = "4349940199004549"
CARD = {"pan": PAN, "expiryDate": "1230", "cvv": "739"}


class CardInput(GatewayModel):
    card: Card
    walletPaymentData: dict[str, str] | None = None


def _use(engine: Engine, *entries: str) -> CardVault:
    """The engine's keys as if ``DURAPAY_CARD__KEYS`` were ``entries`` (a restart with new settings)."""
    engine.cards = engine.store.cards = CardVault.from_texts(list(entries))
    engine.protocol._inputs.clear()  # a new process: no input typed yet
    return engine.cards


def test_a_card_is_stored_sealed_and_opened_for_its_step_only(make_engine: Any) -> None:
    seen: list[Any] = []
    pay = ScriptedStep("pay", outcomes=[Finish(True, "paid")], during=lambda ctx: seen.append(ctx.input))
    engine, _ = make_engine(FlowDefinition("demo", CardInput, (pay,), summary))
    record = engine.start("demo", {"card": CARD, "walletPaymentData": {"token": "wtok-1"}})
    raw = engine.redis.hget(engine.keys.flow(record.id), "input").decode()
    assert PAN not in raw and "739" not in raw and "wtok-1" not in raw, raw
    stored = engine.get(record.id).input
    assert stored["card"]["pan"] == "434994******4549" and stored["card"]["sealed"].startswith("dpc1.test.")
    assert presented(stored) == {
        "card": {"pan": "434994******4549", "expiryDate": "***", "cvv": "***"},
        "walletPaymentData": "***",
    }
    assert engine.run_step(record.id, "pay") == "succeeded"
    assert seen[0].card.pan == PAN and seen[0].card.cvv == "739", "the step got the card in the clear"
    assert engine.get(record.id).input == {"card": {"pan": "434994******4549"}, "walletPaymentData": "redacted"}


def test_a_sealed_card_opens_only_for_its_own_flow_and_place() -> None:
    vault = CardVault.from_texts([new_key("k1")])
    sealed = vault.seal("f1", {"card": CARD})
    assert vault.open("f1", sealed) == {"card": CARD}
    with pytest.raises(CardUnreadable):
        vault.open("f2", sealed)  # moved to another flow
    with pytest.raises(CardUnreadable):
        vault.open("f1", {"passThrough": sealed})  # moved to another field


def test_no_card_key_refuses_a_card_carrying_start_before_anything_is_written(make_engine: Any) -> None:
    engine, sent = make_engine(FlowDefinition("demo", CardInput, (ScriptedStep("pay"),), summary))
    _use(engine)
    with pytest.raises(CardKeyMissing, match="DURAPAY_CARD__KEYS is not set"):
        engine.start("demo", {"card": CARD}, key="order-1")
    assert list(engine.list()) == [] and sent.chains == []


def test_rotation_opens_with_the_old_key_and_reseals_under_the_new_one(make_engine: Any) -> None:
    pay = ScriptedStep("pay", outcomes=[Finish(True, "paid")])
    engine, _ = make_engine(FlowDefinition("demo", CardInput, (wait_step("customer"), pay), summary))
    old, new = new_key("old"), new_key("new")
    _use(engine, old)
    first = engine.start("demo", {"card": CARD}, key="order-1")
    _use(engine, new, old)  # the new key first: it seals; the old one still opens
    second = engine.start("demo", {"card": {**CARD, "cvv": "740"}}, key="order-2")
    assert engine.cards.key_ids(engine.get(first.id).input) == {"old"}
    assert engine.cards.key_ids(engine.get(second.id).input) == {"new"}
    assert engine.start("demo", {"card": CARD}, key="order-1").id == first.id, "a repeated start across the rotation"
    assert in_flight(engine).by_key == {"old": 1, "new": 1}
    assert in_flight(engine, reseal=True).resealed == 1
    assert in_flight(engine).by_key == {"new": 2}
    _use(engine, new)  # the old key removed: every flow in flight still opens
    assert engine.cards.open(first.id, engine.get(first.id).input) == {"card": CARD}


def test_a_flow_whose_key_was_removed_stops_for_a_person_naming_the_key(make_engine: Any) -> None:
    engine, _ = make_engine(FlowDefinition("demo", CardInput, (ScriptedStep("pay"),), summary))
    _use(engine, new_key("gone"))
    record = engine.start("demo", {"card": CARD})
    _use(engine, new_key("other"))
    engine.run_step(record.id, "pay")
    stopped = engine.get(record.id)
    assert stopped.state is FlowState.NEEDS_ATTENTION and stopped.error == {"type": "CardKeyMissing"}
    assert "card key 'gone'" in engine.history(record.id)[-1]["what"]


def test_the_setting_is_checked_and_never_quotes_a_key() -> None:
    good = new_key("k1")
    assert load_settings({"card": {"keys": [good]}}).card.keys[0].get_secret_value() == good
    secret = "k2:" + "A" * 20
    with pytest.raises(SettingsError, match="DURAPAY_CARD__KEYS: key 'k2': 15 bytes, not 32") as refused:
        load_settings({"card": {"keys": [secret]}})
    assert "A" * 20 not in str(refused.value)
    with pytest.raises(SettingsError, match="appears twice"):
        load_settings({"card": {"keys": [good, good]}})


#: Keys and strings that come close to the card fields' names: a name inside a string, quoted, escaped.
NEAR = st.sampled_from(["card", "walletPaymentData", "order", "cards", 'x"card":', '"card":', "card\\", "pan"])
INPUTS = st.recursive(
    st.none() | st.integers() | NEAR | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NEAR | st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(NEAR, INPUTS, max_size=4))
def test_an_input_told_free_of_card_data_by_its_text_holds_none(data: dict[str, Any]) -> None:
    """The store seals an input only when its written text may hold card data (``may_carry``): never
    wrong the other way, whatever the names inside strings and the nesting."""
    if carries(data):
        assert may_carry(compact_json(data))


def test_a_start_without_card_data_is_told_so_by_its_text() -> None:
    assert not may_carry(compact_json({"order": {"orderId": "o-1", "amount": "1990"}, "contractId": "card"}))
    assert may_carry(compact_json({"order": {"orderId": "o-1"}, "card": {"pan": "4349940199004549"}}))
