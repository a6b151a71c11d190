"""For merchants' receivers: check that a webhook really comes from durapay, and is fresh.

    from durapay.service.webhooks import verify, WebhookVerificationError

    verify(request.headers, raw_body, "whsec_...")   # raises WebhookVerificationError when it fails

The rules live in ``workflows.webhooks.signing`` (the same code signs what durapay sends); this module
is the receiver's import, with no dependency on Redis or the rest of durapay's runtime. docs/events.md
(Receiving: verify first) has complete FastAPI and Django receivers.
"""

from durapay.workflows.webhooks.signing import DEFAULT_TOLERANCE, WebhookVerificationError, sign, verify

__all__ = ["DEFAULT_TOLERANCE", "WebhookVerificationError", "sign", "verify"]
