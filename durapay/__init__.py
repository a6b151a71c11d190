"""durapay: durable payment flows on Celery and Redis; nothing lost, nothing charged twice.

The public API (README, "From Python"):

* :func:`connect` gives the engine (start, get, wait, list, history, signal, cancel, retry) on the flow
  store the ``DURAPAY_*`` settings name, for a backend on the workers' Redis;
* :class:`Schedules` on that engine (recurring merchant-initiated charges);
* the flow states, the errors those calls raise, and the settings model;
* :func:`verify_webhook` for a merchant's receiver of durapay's webhooks;
* :class:`Client` and :class:`AsyncClient`, the typed client of the HTTP API for a backend that is not
  on the workers' Redis, with :class:`ApiError` (the API's problem) and :class:`Retries`.

Four modules are public as well, each by its ``__all__``: ``durapay.client`` (the HTTP client and the
answer models it returns: ``FlowView``, ``FlowList``, ``EventView``...), ``durapay.flows`` (declaring a
flow of your own: docs/deploys.md), ``durapay.gateway`` (the typed client of the payment gateway) and
``durapay.simulator`` (its stand-in for tests). Everything else
(``durapay.workflows``, ``durapay.service``, ...) is the implementation: importable, documented, not
promised to stay as it is.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from durapay._lazy import lazy_names

if TYPE_CHECKING:
    from durapay.client import ApiError, AsyncClient, Client, Retries
    from durapay.config.settings import GatewaySettings, Settings, SettingsError, load_settings
    from durapay.service.runtime import NoFlowStore, connect
    from durapay.workflows.engine import (
        STOPPED,
        TERMINAL,
        EarlyWaitaof,
        Engine,
        FlowRecord,
        FlowState,
        InputError,
        NotDurable,
        NotFound,
        OperatorError,
        OrderIdTaken,
        StartConflict,
    )
    from durapay.workflows.listing import BadCursor
    from durapay.workflows.schedules import Schedules
    from durapay.workflows.webhooks.signing import WebhookVerificationError
    from durapay.workflows.webhooks.signing import verify as verify_webhook

#: Where each public name lives, loaded on first use (PEP 562): ``import durapay`` (and so every
#: ``durapay.x`` import, the CLI's shell completion among them) loads no engine, Celery or HTTP client
#: until a name needs it. The ``TYPE_CHECKING`` imports above are the same names, for type checkers.
_HOMES = {
    "ApiError": "durapay.client",
    "AsyncClient": "durapay.client",
    "Client": "durapay.client",
    "Retries": "durapay.client",
    "GatewaySettings": "durapay.config.settings",
    "Settings": "durapay.config.settings",
    "SettingsError": "durapay.config.settings",
    "load_settings": "durapay.config.settings",
    "connect": "durapay.service.runtime",
    "NoFlowStore": "durapay.service.runtime",
    "EarlyWaitaof": "durapay.workflows.engine.durability",
    "NotDurable": "durapay.workflows.engine.durability",
    "Engine": "durapay.workflows.engine.api",
    "InputError": "durapay.workflows.engine.api",
    "NotFound": "durapay.workflows.engine.api",
    "OrderIdTaken": "durapay.workflows.engine.api",
    "OperatorError": "durapay.workflows.engine.errors",
    "BadCursor": "durapay.workflows.listing",
    "Schedules": "durapay.workflows.schedules",
    "STOPPED": "durapay.workflows.engine.states",
    "TERMINAL": "durapay.workflows.engine.states",
    "FlowState": "durapay.workflows.engine.states",
    "FlowRecord": "durapay.workflows.engine.store",
    "StartConflict": "durapay.workflows.engine.store",
    "WebhookVerificationError": "durapay.workflows.webhooks.signing",
    "verify_webhook": "durapay.workflows.webhooks.signing:verify",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES)

try:
    __version__ = version("durapay")
except PackageNotFoundError:  # a checkout on sys.path, not installed
    __version__ = "0+unknown"

__all__ = [
    "STOPPED",
    "TERMINAL",
    "ApiError",
    "AsyncClient",
    "BadCursor",
    "Client",
    "EarlyWaitaof",
    "Engine",
    "FlowRecord",
    "FlowState",
    "GatewaySettings",
    "InputError",
    "NoFlowStore",
    "NotDurable",
    "NotFound",
    "OperatorError",
    "OrderIdTaken",
    "Retries",
    "Schedules",
    "Settings",
    "SettingsError",
    "StartConflict",
    "WebhookVerificationError",
    "__version__",
    "connect",
    "load_settings",
    "verify_webhook",
]
