"""What a gateway error means: ``BadRequest.already_done`` tells a duplicate from a refusal."""

from __future__ import annotations

import pytest

from durapay.gateway import BadRequest, ErrorDetail


def bad_request(code: str, description: str) -> BadRequest:
    return BadRequest("400", status_code=400, errors=[ErrorDetail(code, description)])


@pytest.mark.parametrize(
    ("code", "description"),
    [
        ("PS0026", "Invalid order.orderId parameter: orderId already used"),
        ("PS0026", "Invalid operationId parameter: operation already completed (EXECUTED)"),
        ("PS0017", "contract ct-1 already exists"),
    ],
)
def test_a_duplicate_is_already_done(code: str, description: str) -> None:
    assert bad_request(code, description).already_done


@pytest.mark.parametrize(
    ("code", "description"),
    [
        ("PS0026", "Invalid order.amount parameter: must be digits"),
        ("PS0027", "Operation already refunded"),
        ("PS0023", "An already executed operation can't be captured"),
        ("PS0045", "PaymentLink cannot be deleted because it has already been used"),
    ],
)
def test_a_refusal_is_not(code: str, description: str) -> None:
    assert not bad_request(code, description).already_done
