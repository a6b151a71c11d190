"""Webhook addresses: a delivery connects to the address it checked (a name that answers a public
address to the check and a private one afterwards, DNS rebinding, gets no connection), and IPv6 forms
that embed a private IPv4 address are refused at registration and at delivery.

The resolver is replaced (``socket.getaddrinfo``) because a name that changes its answer between two
lookups cannot be produced otherwise on this machine."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.workflows.webhooks.endpoints import EndpointError, NotPublic, literal_address, resolve_public

EMBEDDING = (
    "::127.0.0.1",  # IPv4-compatible
    "::ffff:10.0.0.1",  # IPv4-mapped
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
)
#: A public address nothing here listens on (the connection fails or times out: never reaches us).
PUBLIC = "192.0.43.10"


def resolver(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> list[str]:
    """Answer each name of ``answers`` with its addresses in turn (the last one from then on)."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def lookup(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        queue = answers[host]
        address = queue.pop(0) if len(queue) > 1 else queue[0]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        where = (address, int(port), 0, 0) if family == socket.AF_INET6 else (address, int(port))
        return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", where)]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return asked


@pytest.mark.parametrize("address", EMBEDDING)
def test_ipv6_forms_embedding_a_private_ipv4_address_are_refused_at_registration(hooks: Any, address: str) -> None:
    _, strict = hooks(allow_private=False)
    with pytest.raises(EndpointError, match="not a public address"):
        strict.endpoints.add(f"https://[{address}]/h")


@pytest.mark.parametrize("address", [*EMBEDDING, "127.0.0.1"])
def test_a_name_resolving_to_an_embedding_form_gets_no_connection_and_no_address_named(
    hooks: Any, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    _, webhooks = hooks(allow_private=False, connect_timeout=0.5)
    endpoint = webhooks.endpoints.add("https://hooks.example.com/h")
    object.__setattr__(endpoint, "url", f"http://inside.example:{receiver.port}/hooks")
    resolver(monkeypatch, {"inside.example": [address]})
    attempt = webhooks.attempt(endpoint, "evt_x", "flow.created", b"{}")
    assert not attempt["ok"] and "not public" in attempt["error"]
    assert address not in attempt["error"] and "127.0.0.1" not in attempt["error"]
    assert receiver.received == []


def test_a_name_rebinding_to_a_private_address_after_the_check_gets_no_connection(
    hooks: Any, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, webhooks = hooks(allow_private=False, connect_timeout=0.5, timeout=0.5)
    endpoint = webhooks.endpoints.add("https://hooks.example.com/h")
    object.__setattr__(endpoint, "url", f"http://rebind.example:{receiver.port}/hooks")
    asked = resolver(monkeypatch, {"rebind.example": [PUBLIC, "127.0.0.1"]})
    attempt = webhooks.attempt(endpoint, "evt_x", "flow.created", b"{}")
    assert receiver.received == [], "the connection went to the address checked, not to the second answer"
    assert not attempt["ok"] and "127.0.0.1" not in str(attempt)
    assert asked == ["rebind.example"], "the name was resolved once"


@pytest.mark.parametrize("allow_private", [True, False])
def test_a_url_urlsplit_refuses_is_a_clear_error(hooks: Any, allow_private: bool) -> None:
    _, webhooks = hooks(allow_private=allow_private)
    with pytest.raises(EndpointError, match="is not a URL"):
        webhooks.endpoints.add("http://[::1/h")


@pytest.mark.parametrize(
    "host",
    [
        "224.0.0.1",  # multicast (is_global says yes)
        "239.255.255.250",
        "[ff0e::1]",  # IPv6 multicast, global scope
        "2130706433",  # 127.0.0.1 as one number
        "0177.0.0.1",  # octal
        "0x7f000001",  # hex
        "0x7f.0.0.1",
        "127.1",  # short form
        "10.1",
        "3232235521",  # 192.168.0.1
        "99999999999",  # no address at all
    ],
)
def test_multicast_and_numeric_ipv4_forms_are_refused_at_registration_as_at_delivery(hooks: Any, host: str) -> None:
    """Issue 37, finding 8: accepted when an endpoint was added, refused only at delivery. The host is
    read as the resolver reads it (``endpoints.literal_address``), and judged by the one rule, ``public``."""
    _, strict = hooks(allow_private=False)
    with pytest.raises(EndpointError, match="not a public address"):
        strict.endpoints.add(f"https://{host}/h")
    with pytest.raises((NotPublic, OSError)):
        resolve_public(f"https://{host}/h")


def test_a_numeric_form_of_a_public_address_is_that_address() -> None:
    assert literal_address("134744072") == ipaddress.IPv4Address("8.8.8.8")
    assert literal_address("hooks.example.com") is None and literal_address("a1.example") is None
