"""A webhook attempt's one deadline (``transport.Poster``, through ``gateway._deadline``): connect, send
and read together end within ``connect_timeout + timeout``, however the endpoint paces its bytes."""

from __future__ import annotations

from typing import Any

import pytest

from bench._slow_receiver import SlowReceiver
from durapay.config import load_settings
from durapay.workflows.webhooks import Webhooks
from durapay.workflows.webhooks.transport import Poster
from tests.resolver import HELD, HeldResolver
from tests.waiting import wait_until


def test_a_trickling_receiver_ends_the_attempt_at_its_deadline() -> None:
    # Status line at once, then one byte every 0.1 s (40 in all): no read waits near the 1 s timeout,
    # so a per-read timeout kept the attempt for the whole 4 s and answered 200.
    with SlowReceiver("trickle", every=0.1, length=40) as slow:
        poster = Poster(timeout=1.0, connect_timeout=0.5)
        with pytest.raises(TimeoutError):
            poster.post(slow.url, b"{}", {"content-type": "application/json"}, excerpt=64)
        wait_until(lambda: slow.cut == 1, what="the poster to close the trickling connection")
        assert slow.finished == 0, "the attempt ended before the body did"


def test_a_receiver_that_never_answers_ends_the_attempt_at_its_deadline() -> None:
    with SlowReceiver("silent", every=0.05) as slow:
        poster = Poster(timeout=0.5, connect_timeout=0.5)
        with pytest.raises(TimeoutError):
            poster.post(slow.url, b"{}", {"content-type": "application/json"}, excerpt=64)
        wait_until(lambda: slow.cut == 1, what="the poster to close the silent connection")


def test_the_attempt_against_a_trickling_endpoint_is_recorded_failed_and_retried(hooks: Any) -> None:
    with SlowReceiver("trickle", every=0.1, length=40) as slow:
        _, webhooks = hooks(timeout=1.0, connect_timeout=0.5)
        assert isinstance(webhooks, Webhooks)
        endpoint = webhooks.endpoints.add(slow.url)
        attempt = webhooks.attempt(endpoint, "evt_1", "flow.succeeded", b"{}")
        assert attempt["ok"] is False and attempt["status"] is None
        assert attempt["error"].startswith(("TimeoutError", "DeadlinePassed")), attempt
        wait_until(lambda: slow.cut == 1, what="the attempt to give the connection up")


def test_the_deadline_setting_is_connect_plus_read() -> None:
    settings = load_settings({"webhooks": {"timeout": 4.0, "connect_timeout": 1.5}}).webhooks
    assert Poster(timeout=settings.timeout, connect_timeout=settings.connect_timeout).deadline == 5.5


def test_a_name_the_resolver_does_not_answer_ends_the_attempt_at_its_deadline(held_resolver: HeldResolver) -> None:
    """getaddrinfo takes no timeout: an endpoint's name the resolver did not answer held the attempt, and
    its thread, as long as the resolver did (past the attempt's deadline and the lease)."""
    poster = Poster(timeout=0.5, connect_timeout=0.5)
    with pytest.raises(TimeoutError):
        poster.post(f"http://{HELD}:8080/hook", b"{}", {"content-type": "application/json"}, excerpt=64)
    assert held_resolver.asked.is_set()


def test_the_checked_resolution_of_a_public_endpoint_ends_at_the_attempts_deadline(
    hooks: Any, held_resolver: HeldResolver
) -> None:
    """Where private addresses are refused (production), the name is resolved and checked first
    (``resolve_public``), within the same deadline as the POST."""
    _, webhooks = hooks(allow_private=False, timeout=0.5, connect_timeout=0.5)
    endpoint = webhooks.endpoints.add(f"https://{HELD}/hook")
    attempt = webhooks.attempt(endpoint, "evt_1", "flow.succeeded", b"{}")
    assert attempt["ok"] is False and attempt["status"] is None
    assert attempt["error"].startswith("DeadlinePassed: resolving"), attempt
    assert held_resolver.lookups == 1
