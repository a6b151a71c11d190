"""Signed webhooks: endpoints (``endpoints``), Standard Webhooks signatures (``signing``) and durable
delivery by the workers from a due set (``delivery``). The events themselves are ``workflows.engine.events``."""

from typing import TYPE_CHECKING

from durapay._lazy import lazy_names

if TYPE_CHECKING:
    from durapay.workflows.webhooks.delivery import SCHEDULE, Webhooks, next_delay, retry_after
    from durapay.workflows.webhooks.endpoints import Endpoint, EndpointError, EndpointStore, check_types, check_url
    from durapay.workflows.webhooks.signing import WebhookVerificationError, new_secret, sign, verify

#: Loaded on first use (durapay/_lazy.py): importing one module of the package loads no other.
_HOMES = {
    "SCHEDULE": "durapay.workflows.webhooks.delivery",
    "Webhooks": "durapay.workflows.webhooks.delivery",
    "next_delay": "durapay.workflows.webhooks.delivery",
    "retry_after": "durapay.workflows.webhooks.delivery",
    "Endpoint": "durapay.workflows.webhooks.endpoints",
    "EndpointError": "durapay.workflows.webhooks.endpoints",
    "EndpointStore": "durapay.workflows.webhooks.endpoints",
    "check_types": "durapay.workflows.webhooks.endpoints",
    "check_url": "durapay.workflows.webhooks.endpoints",
    "WebhookVerificationError": "durapay.workflows.webhooks.signing",
    "new_secret": "durapay.workflows.webhooks.signing",
    "sign": "durapay.workflows.webhooks.signing",
    "verify": "durapay.workflows.webhooks.signing",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)

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
