"""Issue 26, item 4, over real HTTP: a body nested deeper than the API reads is a 422 naming the field
(or ``(body)``) at every depth, before anything is written: a ``passThrough`` of lists 280 levels deep
was a 500 ("Maximum serialization depth exceeded"), at 305 and 400 the connection was reset."""

from __future__ import annotations

import json

import pytest

from durapay.service.guard import MAX_DEPTH
from tests.service.conftest import API_KEY, Served

KEY = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}


def moto_with_pass_through(order_id: str, lists: int) -> bytes:
    """A moto body whose ``passThrough.deep`` holds ``lists`` nested lists (the body is 2 levels above)."""
    body = {
        "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
        "passThrough": {"deep": "LISTS"},
    }
    return json.dumps(body).replace('"LISTS"', "[" * lists + "]" * lists).encode()


@pytest.mark.parametrize("lists", [MAX_DEPTH - 1, 250, 280, 305, 400, 998, 1000, 5000, 100_000])
def test_a_pass_through_nested_too_deeply_is_a_422_naming_it_at_every_depth(served: Served, lists: int) -> None:
    answer = served.http.post("/flows/moto?wait=0", content=moto_with_pass_through(f"deep-{lists}", lists), headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json() == {
        "error": "invalid_input",
        "reason": f"nested deeper than {MAX_DEPTH} levels of arrays and objects",
        "field": "passThrough.deep",
    }
    assert served.engine.list(limit=10) == []


def test_the_limit_itself_is_accepted_and_a_deep_body_is_named_body(served: Served) -> None:
    accepted = served.http.post("/flows/moto?wait=0", content=moto_with_pass_through("at-limit", MAX_DEPTH - 2), headers=KEY)
    assert accepted.status_code == 201, accepted.text
    deep = served.http.post("/webhooks", content=b"[" * 300 + b"]" * 300, headers=KEY)
    assert (deep.status_code, deep.json()["field"]) == (422, "(body)")
    # A bracket inside a string is text, not depth.
    text = served.http.post(
        "/flows/moto?wait=0", content=moto_with_pass_through("in-text", 1).replace(b"[]", b'"' + b"[" * 500 + b'"'), headers=KEY
    )
    assert text.status_code == 201, text.text


def test_the_api_reference_states_the_limit() -> None:
    from pathlib import Path

    reference = " ".join((Path(__file__).parents[2] / "docs" / "api.md").read_text().split())
    assert f"A body may nest at most {MAX_DEPTH} levels of arrays and objects" in reference
