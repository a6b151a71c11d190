"""Signed webhooks: endpoints (``endpoints``), Standard Webhooks signatures (``signing``) and durable
delivery by the workers from a due set (``delivery``). The events themselves are ``workflows.events``."""

from durapay.workflows.webhooks.delivery import SCHEDULE, Webhooks, next_delay, retry_after
from durapay.workflows.webhooks.endpoints import Endpoint, EndpointError, EndpointStore, check_types, check_url
from durapay.workflows.webhooks.signing import WebhookVerificationError, new_secret, sign, verify

__all__ = [
    "SCHEDULE",
    "Endpoint",
    "EndpointError",
    "EndpointStore",
    "WebhookVerificationError",
    "Webhooks",
    "check_types",
    "check_url",
    "new_secret",
    "next_delay",
    "retry_after",
    "sign",
    "verify",
]
