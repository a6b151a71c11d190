"""Standard Webhooks signatures: what durapay signs verifies with the independent ``standardwebhooks``
package, and durapay's ``verify`` refuses a tampered body, an old timestamp or a rotated-out secret."""

from __future__ import annotations

import time

import pytest
from standardwebhooks import Webhook
from standardwebhooks import WebhookVerificationError as TheirError

from durapay.service.webhooks import WebhookVerificationError, verify
from durapay.workflows.webhooks.signing import new_secret, secret_key, sign

BODY = b'{"id":"evt_p0_1-0","type":"flow.succeeded","timestamp":"2026-11-23T05:00:00.000Z","data":{}}'


def test_a_signature_verifies_with_the_standardwebhooks_package() -> None:
    secret = new_secret()
    headers = sign("evt_p0_1-0", BODY, [secret])
    assert Webhook(secret).verify(BODY, headers)["type"] == "flow.succeeded"
    verify(headers, BODY, secret)


def test_standardwebhooks_signatures_verify_with_durapay() -> None:
    secret = new_secret()
    stamp = int(time.time())
    from datetime import UTC, datetime

    theirs = Webhook(secret).sign("msg_1", datetime.fromtimestamp(stamp, UTC), BODY.decode())
    verify({"webhook-id": "msg_1", "webhook-timestamp": str(stamp), "webhook-signature": theirs}, BODY, secret)


def test_a_tampered_body_fails_both() -> None:
    secret = new_secret()
    headers = sign("evt_p0_1-0", BODY, [secret])
    tampered = BODY.replace(b"succeeded", b"failed")
    with pytest.raises(TheirError):
        Webhook(secret).verify(tampered, headers)
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(headers, tampered, secret)


def test_an_old_timestamp_fails_and_a_small_skew_passes() -> None:
    secret = new_secret()
    old = sign("evt_p0_1-0", BODY, [secret], timestamp=int(time.time()) - 600)
    with pytest.raises(TheirError):
        Webhook(secret).verify(BODY, old)
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(old, BODY, secret)
    ahead = sign("evt_p0_1-0", BODY, [secret], timestamp=int(time.time()) + 120)
    verify(ahead, BODY, secret)  # a receiver's clock two minutes behind
    with pytest.raises(WebhookVerificationError, match="too new"):
        verify(sign("evt_p0_1-0", BODY, [secret], timestamp=int(time.time()) + 900), BODY, secret)


def test_during_a_rotation_both_secrets_verify_and_after_it_the_old_one_fails() -> None:
    old, new = new_secret(), new_secret()
    during = sign("evt_p0_1-0", BODY, [new, old])
    for secret in (old, new):
        Webhook(secret).verify(BODY, during)
        verify(during, BODY, secret)
    after = sign("evt_p0_1-0", BODY, [new])
    with pytest.raises(TheirError):
        Webhook(old).verify(BODY, after)
    with pytest.raises(WebhookVerificationError):
        verify(after, BODY, old)


def test_headers_in_any_case_and_missing_ones() -> None:
    secret = new_secret()
    headers = {name.upper(): value for name, value in sign("evt_1", BODY, [secret]).items()}
    verify(headers, BODY, secret)
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify({}, BODY, secret)


def test_a_secret_must_be_whsec_and_long_enough() -> None:
    with pytest.raises(ValueError, match="whsec_"):
        secret_key("abc")
    with pytest.raises(ValueError, match="16 bytes"):
        secret_key("whsec_YWJj")
