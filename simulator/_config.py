"""The simulator's settings: one frozen value object, given to ``SimulatorServer`` or built by the CLI.

Why a separate object and not the ``DURAPAY_*`` tree: the simulator stands in for the gateway, which
durapay does not configure; tests start many simulators side by side, each with its own seed, latency
and port. The defaults are those of ``durapay simulator`` (the API key is the one durapay's client
sends when nothing is configured).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from durapay.config.settings import GATEWAY_PATH_PREFIX, SIMULATOR_API_KEY

#: The card the simulator's pages use when they complete by themselves (``auto_complete_ms``).
AUTO_COMPLETE_PAN = "4349940199004549"
#: The longest ``orderId`` any public source allows (the request models, shared with durapay's client,
#: accept no more): a limit above it could never be reached.
LONGEST_PUBLISHED_ORDER_ID = 27


@dataclass(frozen=True)
class SimulatorConfig:
    """How one simulator behaves. ``port=0`` picks a free port."""

    api_key: str = SIMULATOR_API_KEY
    seed: int = 0
    latency_ms: int = 0
    latency_jitter_ms: int = 0
    auto_complete_ms: int | None = None
    host: str = "127.0.0.1"
    port: int = 0
    state_file: Path | None = None
    path_prefix: str = GATEWAY_PATH_PREFIX
    #: Notification deliveries: attempts per event, and the exponential backoff between them.
    notify_max_attempts: int = 8
    notify_backoff_ms: int = 200
    notify_backoff_cap_ms: int = 10_000
    notify_timeout_seconds: float = 5.0
    #: How often (real seconds) expiries are checked against the simulator's clock.
    sweep_interval_seconds: float = 0.5
    #: The longest ``orderId`` a request creating an order may carry (PS0026 on ``order.orderId`` beyond
    #: it). Public sources say 18 (two client libraries written for the live gateway) or 27 (another
    #: document): docs/gateway.md. 18, as durapay's DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH: the stricter.
    order_id_max_length: int = 18
    #: Gateway terminals besides ``default`` (whose key is ``api_key``): each key and the terminal it is
    #: (``{"key-it": "it"}``). A terminal's key sees its own orders and operations only (another's are 404,
    #: and ``GET /operations`` lists its own), and every order is recorded with the terminal whose key made
    #: it: a test proves each flow's calls used its terminal's key (docs/simulator.md, Terminals).
    terminal_keys: Mapping[str, str] = field(default_factory=dict)

    def terminal_of(self, key: str | None) -> str | None:
        """The terminal whose key ``key`` is (None: no terminal's, a 401)."""
        if key == self.api_key:
            return "default"
        return self.terminal_keys.get(key or "") if key else None

    def __post_init__(self) -> None:
        problems = []
        if not self.api_key:
            problems.append("api_key must not be empty")
        for name in ("latency_ms", "latency_jitter_ms", "notify_backoff_ms", "notify_backoff_cap_ms"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative")
        if self.auto_complete_ms is not None and self.auto_complete_ms < 0:
            problems.append("auto_complete_ms must not be negative")
        if not 0 <= self.port <= 65535:
            problems.append("port must be between 0 and 65535")
        if self.notify_max_attempts < 1:
            problems.append("notify_max_attempts must be at least 1")
        if self.notify_timeout_seconds <= 0 or self.sweep_interval_seconds <= 0:
            problems.append("notify_timeout_seconds and sweep_interval_seconds must be positive")
        if not 1 <= self.order_id_max_length <= LONGEST_PUBLISHED_ORDER_ID:
            problems.append(f"order_id_max_length must be between 1 and {LONGEST_PUBLISHED_ORDER_ID}")
        if not self.path_prefix.startswith("/") or self.path_prefix.endswith("/"):
            problems.append("path_prefix must start with '/' and not end with one")
        if self.api_key in self.terminal_keys or "default" in self.terminal_keys.values():
            problems.append("terminal_keys must not name api_key nor the terminal 'default' (api_key is default's)")
        if problems:
            raise ValueError("SimulatorConfig: " + "; ".join(problems))
