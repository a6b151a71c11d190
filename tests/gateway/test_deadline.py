"""One deadline for a whole gateway call (``gateway._deadline``): a gateway that answers a byte at a time
no longer holds a call past ``connect_timeout + timeout`` (each read alone stayed within the timeout)."""

from __future__ import annotations

import pytest

from bench._slow_receiver import SlowReceiver
from durapay.config.settings import GatewaySettings
from durapay.gateway import Catalogue, GatewayClient, GatewayTimeout, bounded, clamp
from durapay.gateway._deadline import DeadlinePassed
from tests.waiting import wait_until


def test_a_gateway_trickling_its_answer_is_cut_at_the_calls_deadline() -> None:
    # 40 bytes, one every 0.1 s: each read waits 0.1 s (well within the 1 s timeout), the whole answer 4 s.
    with SlowReceiver("trickle", every=0.1, length=40) as gateway:
        settings = GatewaySettings(base_url=gateway.url.rsplit("/", 1)[0], timeout=1.0, connect_timeout=0.5)
        with GatewayClient(settings) as client, pytest.raises(GatewayTimeout) as raised:
            client.call(Catalogue.get_order, "ord-trickle")
        assert raised.value.ambiguous, "a read timeout: the request may have reached the gateway (reconcile first)"
        # The client gave up before the answer's last byte (before: it read all 40, then failed to parse).
        wait_until(lambda: gateway.cut == 1, what="the client to close the trickling connection")
        assert gateway.finished == 0


def test_a_gateway_that_never_answers_is_cut_at_the_calls_deadline() -> None:
    with SlowReceiver("silent", every=0.05) as gateway:
        settings = GatewaySettings(base_url=gateway.url.rsplit("/", 1)[0], timeout=0.5, connect_timeout=0.5)
        with GatewayClient(settings) as client, pytest.raises(GatewayTimeout):
            client.call(Catalogue.get_order, "ord-silent")
        wait_until(lambda: gateway.cut == 1, what="the client to close the silent connection")


def test_a_nested_deadline_keeps_the_sooner_end_and_a_passed_one_refuses_at_once() -> None:
    assert clamp(5.0) == 5.0, "outside a bounded call a timeout is as it is"
    with bounded(10.0):
        left = clamp(None)
        assert left is not None and left <= 10.0
        with bounded(-1.0), pytest.raises(DeadlinePassed):
            clamp(5.0)
        with bounded(60.0):
            inner = clamp(None)
            assert inner is not None and inner <= 10.0, "an inner block never extends the outer deadline"
