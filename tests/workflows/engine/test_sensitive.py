"""The identifier rule of ``workflows.engine.sensitive``: a merchant's identifier that looks like a card number
(a Luhn-valid run of 13-19 digits from a card scheme's prefix: 3 to 6, or Mastercard's 2221-2720) is
refused, naming the field; ordinary numeric ids (a millisecond timestamp, ids from 1, 7, 8 or 9, ids
that begin with a date of this century) are taken; the refusal never
repeats the number whole; ids the gateway assigns are not the merchant's, except inside passThrough."""

from __future__ import annotations

import logging
import random

import pytest

from durapay.workflows.engine.sensitive import (
    CARD_IDENTIFIER,
    CardIdentifier,
    Identifier,
    card_like,
    identifiers,
    install_log_masking,
    luhn,
    mask,
    mask_text,
    operation_ids_in,
    refuse_card_identifier,
    refuse_card_identifiers,
    scrub,
)

#: Published test numbers of each scheme the rule names, as a person types them.
PANS = [
    "4349940199004549",  # Visa
    "5186 1516 5000 5008",  # Mastercard
    "2221-0000-0000-0009",  # Mastercard 2-series
    "378282246310005",  # Amex
    "3530111333300000",  # JCB
    "6011111111111117",  # Discover
    "4111-1111-1111-1111",
]


def with_check_digit(body: str) -> str:
    """``body`` and the digit that makes it pass the Luhn check."""
    return next(body + digit for digit in "0123456789" if luhn(body + digit))


@pytest.mark.parametrize("pan", PANS)
@pytest.mark.parametrize("form", ["{}", "ORD-{}", "x{}y", "order {}", "{}-2"])
def test_a_card_number_in_an_identifier_is_refused(pan: str, form: str) -> None:
    value = form.format(pan)
    assert card_like(value) is not None, value
    with pytest.raises(CardIdentifier) as refused:
        refuse_card_identifier("order.orderId", value)
    assert refused.value.field == "order.orderId"
    assert CARD_IDENTIFIER in refused.value.reason
    digits = pan.replace(" ", "").replace("-", "")
    assert digits not in str(refused.value) and pan not in str(refused.value), "the refusal never repeats it whole"


def test_a_number_too_is_read_as_its_digits() -> None:
    with pytest.raises(CardIdentifier):
        refuse_card_identifier("n", 4349940199004549)


def test_ordinary_numeric_ids_are_taken() -> None:
    rng = random.Random(26)
    taken = ["1732660000000", "1732660000000123", "ord-20261126-7", "4349940199004548", "434994019900454", "12345678901234567890"]
    for first in "1789":
        for length in range(13, 20):
            for _ in range(25):
                body = first + "".join(rng.choice("0123456789") for _ in range(length - 2))
                taken.append(with_check_digit(body))  # Luhn-valid, every one
    for value in taken:
        refuse_card_identifier("orderId", value)
        assert card_like(value) is None, value


def test_ids_that_begin_with_a_date_are_taken() -> None:
    """Order numbers made of a date and a counter (20261126000123) are common; a leading 2 is a card
    scheme's only in Mastercard's 2-series, 2221-2720, which no date from 2000 to 2220 begins."""
    rng = random.Random(28)
    for year in (2000, 2019, 2024, 2026, 2099, 2220):
        for length in range(13, 20):
            for _ in range(10):
                body = f"{year}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}"
                body += "".join(rng.choice("0123456789") for _ in range(length - len(body) - 1))
                value = with_check_digit(body)
                refuse_card_identifier("orderId", value)
                assert card_like(value) is None, value


def test_a_luhn_valid_id_from_a_card_schemes_prefix_is_refused() -> None:
    rng = random.Random(27)
    for prefix in ["2221", "2500", "2720", "3", "4", "5", "6"]:
        for length in range(13, 20):
            value = with_check_digit(prefix + "".join(rng.choice("0123456789") for _ in range(length - len(prefix) - 1)))
            assert card_like(value) is not None, value


def test_the_walk_names_the_field_of_every_merchant_identifier() -> None:
    def refused(data: object) -> str:
        with pytest.raises(CardIdentifier) as caught:
            refuse_card_identifiers(data)
        return caught.value.field

    pan = PANS[0]
    assert refused({"order": {"orderId": pan}}) == "order.orderId"
    assert refused({"order": {"orderId": "o1", "customerId": pan}}) == "order.customerId"
    assert refused({"recurrence": {"contractId": pan}}) == "recurrence.contractId"
    assert refused({"reservation": {"termsAndConditionsIds": ["t1"], "structureId": pan}}) == "reservation.structureId"
    assert refused({"structures": [{"structureId": "a"}, {"structureId": pan}]}) == "structures.1.structureId"
    assert refused({"invoiceIds": ["i1", int(pan)]}) == "invoiceIds.1"
    assert refused({"passThrough": {"deep": [{"merchantRef_id": pan}]}}) == "passThrough.deep.0.merchantRef_id"
    assert refused({"passThrough": {"operationId": pan}}) == "passThrough.operationId", "passThrough is the merchant's own"
    refuse_card_identifiers({"order": {"orderId": "o1", "description": f"card {pan}"}})  # free text: masked, not refused
    # Ids the gateway assigns: a merchant copies them from the gateway's answers (18-digit operation ids
    # pass the check one time in ten); refusing one would refuse a real payment's refund.
    refuse_card_identifiers({"operationId": pan, "originalOperationId": pan, "linkId": pan, "sessionId": pan, "paymentId": pan})


#: A gateway operation id that passes the Luhn check (one in ten does): the rule alone masks it.
OPERATION = "800000000000000003"


def test_an_identifier_the_text_is_built_from_stays_whole_and_a_card_number_beside_it_never() -> None:
    """Issue 41, finding 3: the masking knows which values are identifiers (``keep``, the flow's
    operation ids), so that an operation id is never masked and a card number always is."""
    assert luhn(OPERATION) and mask_text(f"operation {OPERATION} ended DECLINED") == "operation 800000********0003 ended DECLINED"
    keep = identifiers([OPERATION, "op-7", None])
    assert mask_text(f"operation {OPERATION} ended DECLINED", keep) == f"operation {OPERATION} ended DECLINED"
    assert mask_text(f"operation {OPERATION} for card 4349940199004549", keep) == (
        f"operation {OPERATION} for card 434994******4549"
    )
    assert mask_text(f"{OPERATION} 4349 9401 9900 4549", keep) == f"{OPERATION} 4349 94** **** 4549", "one run, two stretches"
    assert mask_text("4349940199004549", identifiers([f"op-{OPERATION}"])) == "434994******4549", "only the identifier kept"
    assert mask({"message": f"operation {OPERATION} ended", "n": int(OPERATION), "pan": "4349940199004549"}, keep) == {
        "message": f"operation {OPERATION} ended",
        "n": int(OPERATION),
        "pan": "434994******4549",
    }
    assert scrub({"error": {"message": f"operation {OPERATION} ended"}}, keep) == {
        "error": {"message": f"operation {OPERATION} ended"}
    }


def test_the_operation_ids_of_an_event_are_its_own_and_its_outcomes() -> None:
    event = {
        "operationId": OPERATION,
        "data": {"error": {"operationId": "900000000000000004"}, "operation": {"operationIds": ["1"]}},
    }
    assert sorted(operation_ids_in(event)) == ["1", OPERATION, "900000000000000004"]


def test_a_log_line_keeps_an_operation_id_marked_as_one_and_masks_every_other_number(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 37, finding 8: log masking turned Luhn-valid operation ids into masked numbers. An argument
    marked :class:`Identifier` (the gateway's operation, read back) stays whole; nothing else does."""
    install_log_masking()
    log = logging.getLogger("durapay.test.sensitive")
    with caplog.at_level(logging.INFO, logger="durapay.test.sensitive"):
        log.info("operation %s for card %s", Identifier(OPERATION), "4349940199004549")
        log.info("operation %s, not marked", OPERATION)
        log.info("%(operation)s by name", {"operation": Identifier(OPERATION)})
    assert [record.getMessage() for record in caplog.records] == [
        f"operation {OPERATION} for card 434994******4549",
        "operation 800000********0003, not marked",
        f"{OPERATION} by name",
    ]
