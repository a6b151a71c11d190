"""One deadline for a whole gateway call (``gateway._deadline``): a gateway that answers a byte at a time
no longer holds a call past ``connect_timeout + timeout`` (each read alone stayed within the timeout)."""

from __future__ import annotations

import pytest

from bench._slow_receiver import SlowReceiver
from durapay.config.settings import GatewaySettings
from durapay.gateway import Catalogue, GatewayClient, GatewayTimeout, bounded, clamp
from durapay.gateway._deadline import DeadlinePassed
from tests.resolver import HELD, HeldResolver
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


def test_a_name_the_resolver_does_not_answer_ends_the_call_at_its_deadline(held_resolver: HeldResolver) -> None:
    """getaddrinfo takes no timeout: a resolver that did not answer held the call as long as it did (the
    system's own timeout), past the deadline and the engine's lease. Now the call ends at its deadline,
    a connect timeout: nothing was sent."""
    settings = GatewaySettings(base_url=f"http://{HELD}:8080/api", timeout=0.5, connect_timeout=0.5)
    with GatewayClient(settings) as client, pytest.raises(GatewayTimeout) as raised:
        client.call(Catalogue.get_order, "ord-dns")
    assert held_resolver.asked.is_set()
    assert not raised.value.ambiguous, "nothing was sent: no need to read back before sending again"


def test_a_call_through_the_environments_proxy_keeps_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transport of one's own turns httpx's reading of HTTP(S)_PROXY off: the deadline's transport
    alone called the gateway direct, proxy or not. The environment's proxy is used, through the same
    deadline: a proxy trickling the gateway's answer is cut at the call's deadline."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with SlowReceiver("trickle", every=0.1, length=40) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        # A name no resolver knows: only the proxy can reach it (direct, the call fails to resolve).
        settings = GatewaySettings(base_url="http://gateway.durapay.test/api", timeout=1.0, connect_timeout=0.5)
        with GatewayClient(settings) as client, pytest.raises(GatewayTimeout) as raised:
            client.call(Catalogue.get_order, "ord-proxied")
        assert raised.value.ambiguous, "a read timeout: the request reached the proxy"
        assert proxy.requests == 1, "the call went through the proxy"
        wait_until(lambda: proxy.cut == 1, what="the client to give the proxied call up")
        assert proxy.finished == 0


def test_a_host_the_environment_exempts_from_the_proxy_is_called_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    with SlowReceiver("silent", every=0.05) as proxy, SlowReceiver("silent", every=0.05) as gateway:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        settings = GatewaySettings(base_url=gateway.url.rsplit("/", 1)[0], timeout=0.5, connect_timeout=0.5)
        with GatewayClient(settings) as client, pytest.raises(GatewayTimeout):
            client.call(Catalogue.get_order, "ord-direct")
        assert (gateway.requests, proxy.requests) == (1, 0)
