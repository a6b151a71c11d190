"""Which signals a flow takes, from whom, with which payload (``workflows.engine.signals``), on the real flows."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.workflows.engine.signals import SignalRefused, accepted, admit
from durapay.workflows.flows import REGISTRY


def refused(kind: str, name: str, payload: Any, by: str = "api") -> SignalRefused:
    with pytest.raises(SignalRefused) as caught:
        admit(REGISTRY[kind], name, payload, by=by)
    return caught.value


def test_each_kind_takes_the_signals_its_wait_steps_name() -> None:
    assert accepted(REGISTRY["three_steps"]) == ("3ds_result",)
    assert accepted(REGISTRY["hpp"]) == ("notification",)
    assert set(accepted(REGISTRY["build"])) == {"form_completed", "notification"}
    assert accepted(REGISTRY["moto"]) == ()


def test_only_the_receiver_sends_a_notification() -> None:
    paid = {"operation": {"orderId": "o", "operationId": "1", "operationResult": "EXECUTED"}}
    for by in ("api", "cli", "python"):
        assert refused("hpp", "notification", paid, by).field == "name"
    assert admit(REGISTRY["hpp"], "notification", paid, by="notification") == paid
    # the receiver's word (its token checked) is kept as before for any kind: a refusal would only
    # make the gateway send it again
    assert admit(REGISTRY["moto"], "notification", paid, by="notification") == paid


@pytest.mark.parametrize(
    ("payload", "field"),
    [({"foo": 1}, "foo"), ({}, "threeDSAuthResponse"), ({"threeDSAuthResponse": ""}, "threeDSAuthResponse"),
     ({"threeDSAuthResponse": 5}, "threeDSAuthResponse"), ({"threeDSAuthResponse": "a", "PaRes": "b"}, "threeDSAuthResponse"),
     ({"threeDSAuthRespons": "a"}, "threeDSAuthRespons")],
)  # fmt: skip
def test_a_3ds_result_carries_its_answer_and_nothing_else(payload: dict[str, Any], field: str) -> None:
    assert refused("three_steps", "3ds_result", payload).field == field


def test_good_payloads_pass_unchanged() -> None:
    assert admit(REGISTRY["three_steps"], "3ds_result", {"PaRes": "x"}, by="api") == {"PaRes": "x"}
    assert admit(REGISTRY["build"], "form_completed", None, by="cli") == {}
    assert refused("build", "form_completed", {"paid": True}).field == "paid"


def test_an_unknown_name_gets_the_known_ones() -> None:
    error = refused("three_steps", "3ds", {})
    assert error.field == "name"
    assert "it takes: 3ds_result" in error.reason
    assert "waits for no signal" in refused("moto", "3ds_result", {}).reason
