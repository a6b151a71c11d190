"""A stateful simulator of the payment gateway: every catalogue operation over real HTTP, with faults.

durapay's tests, its demo and merchants' own development need a gateway that behaves like the real one
(docs/gateway.md) without the network: the same path prefix, headers, error bodies and flows, test
cards with documented outcomes, notifications with retries, and faults on demand (latency, 5xx, 429,
hangs, commit-then-fail, dropped connections). ``durapay simulator`` serves it; tests start it
in-process::

    from durapay.simulator import SimulatorConfig, SimulatorServer

    with SimulatorServer(SimulatorConfig(seed=1)) as sim:
        settings = GatewaySettings(base_url=sim.base_url)   # the API key defaults to the simulator's
        sim.admin.set_faults(mode="commit_then_fail", operation="create_mit_order", count=1)
        sim.admin.operations(order_id="o-1")                # what was recorded, with its Idempotency-Key

Modules: ``_config`` (settings), ``_server`` (uvicorn), ``_app`` (the protocol pipeline and routes),
``_admin_routes`` / ``_admin`` (``/_sim/`` and its client), ``_pages`` (customer pages), ``_core``
(the simulator's parts wired together), ``_state`` / ``_records`` (memory), ``_payments`` / ``_ledger``
(payment rules), ``_contracts`` (what a contract lets the merchant charge), one module per area of
handlers (``_direct``, ``_links``, ``_three_steps``, ``_build``, ``_backoffice``, ``_structures``,
``_reservations``), ``_cards``, ``_faults``, ``_pending`` (PENDING answers settled later), ``_notifier``,
``_idempotency``, ``_scheduler``, ``_clock``, ``_lists``.
"""

from durapay.simulator._admin import SimulatorAdmin, SimulatorAdminError
from durapay.simulator._app import build_app
from durapay.simulator._cards import LAST_DIGIT_RULE, PUBLISHED_CARDS, CardProfile, card_profile
from durapay.simulator._clock import Clock
from durapay.simulator._config import AUTO_COMPLETE_PAN, SimulatorConfig
from durapay.simulator._core import Simulator
from durapay.simulator._faults import FaultRule
from durapay.simulator._payments import PAGE_PAYMENT
from durapay.simulator._server import SimulatorServer, serve_forever
from durapay.simulator._state import SimulatorState

__all__ = [
    "AUTO_COMPLETE_PAN",
    "LAST_DIGIT_RULE",
    "PAGE_PAYMENT",
    "PUBLISHED_CARDS",
    "CardProfile",
    "Clock",
    "FaultRule",
    "Simulator",
    "SimulatorAdmin",
    "SimulatorAdminError",
    "SimulatorConfig",
    "SimulatorServer",
    "SimulatorState",
    "build_app",
    "card_profile",
    "serve_forever",
]
