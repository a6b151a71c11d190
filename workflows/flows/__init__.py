"""Every flow kind durapay runs, by name. ``REGISTRY`` is what the engine is built with."""

from __future__ import annotations

from durapay.workflows.engine import FlowDefinition
from durapay.workflows.flows.backoffice import CANCEL_CAPTURE, CAPTURE, DEACTIVATE_CONTRACT, REFUND
from durapay.workflows.flows.direct import CARD_VERIFICATION, MIT, MOTO, SVS, THREE_STEPS, WALLET
from durapay.workflows.flows.forms import BUILD, BUILD_CANCEL
from durapay.workflows.flows.reservation_setup import RESERVATION_SETUP
from durapay.workflows.flows.reservations import DELAY_CHARGE, INCREMENTAL, NO_SHOW, RESERVATION
from durapay.workflows.flows.sessions import (
    HPP,
    PAYBYLINK,
    PAYBYLINK_CANCEL,
    PAYBYLINK_MODIFY,
    PAYBYLINK_RENEW,
)

FLOWS: tuple[FlowDefinition, ...] = (
    HPP,
    PAYBYLINK,
    PAYBYLINK_CANCEL,
    PAYBYLINK_RENEW,
    PAYBYLINK_MODIFY,
    THREE_STEPS,
    SVS,
    BUILD,
    BUILD_CANCEL,
    MOTO,
    CARD_VERIFICATION,
    WALLET,
    MIT,
    REFUND,
    CAPTURE,
    CANCEL_CAPTURE,
    DEACTIVATE_CONTRACT,
    RESERVATION,
    NO_SHOW,
    INCREMENTAL,
    DELAY_CHARGE,
    RESERVATION_SETUP,
)
REGISTRY: dict[str, FlowDefinition] = {flow.kind: flow for flow in FLOWS}

__all__ = ["FLOWS", "REGISTRY"]
