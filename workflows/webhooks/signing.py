"""Standard Webhooks signatures: the one home of how a webhook is signed and checked.

The scheme (https://www.standardwebhooks.com): three headers, ``webhook-id`` (the event id, the same
on every retry, so a receiver drops repeats), ``webhook-timestamp`` (POSIX seconds of this attempt)
and ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, the key being the
base64-decoded part of the secret after ``whsec_``. Several signatures are separated by spaces: while
a secret is being rotated, each attempt is signed with the new and the old one, and a receiver holding
either accepts it.

``verify`` refuses a timestamp more than ``tolerance`` seconds away from the receiver's clock (both
ways: an old request replayed, or a clock far off), then compares every signature in constant time.
Nothing here touches Redis or the network: merchants' receivers import it (``service.webhooks``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Mapping

SECRET_PREFIX = "whsec_"  # noqa: S105 (the scheme's prefix, not a secret)
#: Seconds a timestamp may differ from the receiver's clock (the Standard Webhooks libraries use 5 min).
DEFAULT_TOLERANCE = 300


class WebhookVerificationError(Exception):
    """The request is not a genuine, fresh webhook: refuse it (answer 400; the sender retries)."""


def new_secret() -> str:
    """A fresh secret: ``whsec_`` + base64 of 24 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of ``secret`` (``whsec_<base64>``). Raises ValueError when it is not one."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with whsec_")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :] + "==", validate=False)
    except ValueError:
        raise ValueError("a webhook secret is whsec_ followed by base64") from None
    if len(key) < 16:
        raise ValueError("a webhook secret holds at least 16 bytes")
    return key


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256>`` of ``msg_id.timestamp.body`` under ``secret``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign(msg_id: str, body: bytes, secrets_: Iterable[str], *, timestamp: int | None = None) -> dict[str, str]:
    """The three headers of one attempt, signed with every secret in ``secrets_`` (current first)."""
    moment = int(time.time()) if timestamp is None else timestamp
    signatures = " ".join(signature(secret, msg_id, moment, body) for secret in secrets_)
    return {"webhook-id": msg_id, "webhook-timestamp": str(moment), "webhook-signature": signatures}


def verify(
    headers: Mapping[str, str],
    body: bytes | str,
    secret: str | Iterable[str],
    *,
    tolerance: int = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Check a received webhook; raise :class:`WebhookVerificationError` saying why when it fails.

    ``headers`` in any case (a dict, Starlette's or Django's headers); ``body`` exactly as received
    (bytes: parse the JSON only after this check); ``secret`` one secret or several (a receiver
    rotating its own copy). ``tolerance``: seconds of clock skew accepted either way.
    """
    lowered = {str(name).lower(): str(value) for name, value in headers.items()}
    msg_id = lowered.get("webhook-id", "")
    stamp = lowered.get("webhook-timestamp", "")
    given = lowered.get("webhook-signature", "")
    if not msg_id or not stamp or not given:
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        raise WebhookVerificationError("webhook-timestamp too old (a replay, or a clock far behind)")
    if timestamp > current + tolerance:
        raise WebhookVerificationError("webhook-timestamp too new (a clock far ahead)")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    candidates = [secret] if isinstance(secret, str) else list(secret)
    expected = []
    for candidate in candidates:
        try:
            expected.append(signature(candidate, msg_id, timestamp, raw).encode())
        except ValueError as exc:
            raise WebhookVerificationError(f"bad secret: {exc}") from None
    for presented in given.split(" "):
        version, _, _value = presented.partition(",")
        if version != "v1":
            continue
        if any(hmac.compare_digest(presented.encode(), wanted) for wanted in expected):
            return
    raise WebhookVerificationError("no matching signature")
