"""The simulator's memory: every record, behind one lock, snapshot-able to a JSON file.

Why one re-entrant lock around everything: a request touches several records at once (an order, its
operations, a contract, a link) and must see and leave them consistent; handlers are short and
synchronous, so one lock costs nothing measurable next to HTTP. Tests read through the methods at the
bottom (``find_operations``, ``order``...), which take the lock and return copies.

Identifiers: operation ids are 18-digit numeric strings from a counter; tokens and other ids come from
a random generator seeded with the simulator's seed, so two fresh runs with the same seed and the same
calls hand out the same values. Both survive ``reset`` and are kept in the snapshot: an id is never
handed out twice, not across a reset and not across a restart from ``--state-file``.
"""

from __future__ import annotations

import json
import os
import random
import threading
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, TypeVar

from durapay.gateway import format_gateway_time
from durapay.simulator._cards import OutcomeScripts
from durapay.simulator._clock import Clock, iso
from durapay.simulator._records import (
    BuildSessionRecord,
    ContractRecord,
    LinkRecord,
    OperationRecord,
    OrderRecord,
    PendingRecord,
)

SNAPSHOT_VERSION = 1
_OPERATION_ID_BASE = 800_000_000_000_000_000

R = TypeVar("R")


def _load(cls: type[R], data: dict[str, Any]) -> R:
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{key: value for key, value in data.items() if key in known})


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


class SimulatorState:
    """All records of one simulator. Hold :attr:`lock` while reading or changing them."""

    def __init__(self, clock: Clock, seed: int = 0) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.seed = seed
        self._next_operation = 0
        # Seeded once: ``reset`` keeps the sequence going, so no id or token repeats in one process.
        self.rng = random.Random(seed)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.orders: dict[str, OrderRecord] = {}
            self.operations: dict[str, OperationRecord] = {}
            self.links: dict[str, LinkRecord] = {}
            self.contracts: dict[str, ContractRecord] = {}
            self.build_sessions: dict[str, BuildSessionRecord] = {}
            self.structures: dict[str, dict[str, Any]] = {}
            self.agencies: dict[str, dict[str, Any]] = {}
            self.reservations: dict[str, dict[str, Any]] = {}
            self.reservation_orders: dict[str, str] = {}
            self.terms: dict[str, dict[str, Any]] = {}
            self.structure_conditions: dict[str, dict[str, Any]] = {}
            self.agency_conditions: dict[str, dict[str, Any]] = {}
            self.structure_custom_fields: dict[str, dict[str, Any]] = {}
            self.agency_custom_fields: dict[str, dict[str, Any]] = {}
            self.services: dict[str, dict[str, Any]] = {}
            self.idempotency: dict[str, dict[str, Any]] = {}
            #: Operations answered PENDING by a ``pend`` rule, until they settle (``_pending``).
            self.pending: dict[str, PendingRecord] = {}
            #: Order id -> the terminal whose key made it (only with ``terminal_keys`` configured).
            self.order_terminals: dict[str, str] = {}
            #: Calls refused because they named another terminal's order or operation.
            self.terminal_refusals = 0
            self.scripts = OutcomeScripts()
            self.dirty = True

    # -- identifiers ------------------------------------------------------------------------------

    def now_iso(self) -> str:
        return iso(self.clock.now())

    def now_gateway(self) -> str:
        """Now as operation times are written: ``2023-11-28 12:41:46.724`` (UTC+01:00), like the test environment."""
        return format_gateway_time(self.clock.now())

    def new_operation_id(self) -> str:
        with self.lock:
            self._next_operation += 1
            return str(_OPERATION_ID_BASE + self._next_operation)

    @property
    def operations_made(self) -> int:
        """How many operation ids were handed out (a mark: :meth:`operation_ids_after` lists those after it)."""
        return self._next_operation

    def operation_ids_after(self, made: int) -> list[str]:
        """The operation ids handed out after the mark ``made``."""
        with self.lock:
            return [str(_OPERATION_ID_BASE + number) for number in range(made + 1, self._next_operation + 1)]

    def terminal_of_order(self, order_id: str) -> str:
        """The terminal whose key made the order (``default`` when no terminal keys are configured)."""
        return self.order_terminals.get(order_id, "default")

    def new_token(self) -> str:
        """32 lowercase hex characters, like the gateway's security tokens."""
        with self.lock:
            return f"{self.rng.getrandbits(128):032x}"

    def new_id(self, prefix: str = "") -> str:
        with self.lock:
            return prefix + f"{self.rng.getrandbits(64):016x}"

    # -- reads for tests and /_sim/ ----------------------------------------------------------------

    def find_operations(
        self,
        *,
        order_id: str | None = None,
        operation: str | None = None,
        idempotency_key: str | None = None,
        operation_type: str | None = None,
        operation_result: str | None = None,
        operation_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Recorded operations (oldest first) as ``/_sim/operations`` shows them, filtered."""
        with self.lock:
            found = []
            for record in self.operations.values():
                if (
                    (order_id is not None and record.order_id != order_id)
                    or (operation is not None and record.created_by != operation)
                    or (idempotency_key is not None and record.idempotency_key != idempotency_key)
                    or (operation_type is not None and record.operation_type != operation_type)
                    or (operation_result is not None and record.result != operation_result)
                    or (operation_id is not None and record.operation_id != operation_id)
                ):
                    continue
                shown = record.inspect()
                if self.order_terminals:
                    shown["terminal"] = self.order_terminals.get(record.order_id, "default")
                found.append(shown)
            return found

    def order(self, order_id: str) -> dict[str, Any] | None:
        """A copy of one order record (internal field names), or None."""
        with self.lock:
            record = self.orders.get(order_id)
            return json.loads(json.dumps(asdict(record))) if record else None

    def link(self, link_id: str) -> dict[str, Any] | None:
        with self.lock:
            record = self.links.get(link_id)
            return asdict(record) if record else None

    def contract(self, contract_id: str) -> dict[str, Any] | None:
        with self.lock:
            record = self.contracts.get(contract_id)
            return asdict(record) if record else None

    def build_session(self, session_id: str) -> dict[str, Any] | None:
        with self.lock:
            record = self.build_sessions.get(session_id)
            return asdict(record) if record else None

    # -- snapshot -----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "version": SNAPSHOT_VERSION,
                "nextOperation": self._next_operation,
                "clockOffsetSeconds": self.clock.offset_seconds,
                "orders": {key: asdict(value) for key, value in self.orders.items()},
                "operations": {key: asdict(value) for key, value in self.operations.items()},
                "links": {key: asdict(value) for key, value in self.links.items()},
                "contracts": {key: asdict(value) for key, value in self.contracts.items()},
                "buildSessions": {key: asdict(value) for key, value in self.build_sessions.items()},
                "structures": self.structures,
                "agencies": self.agencies,
                "reservations": self.reservations,
                "reservationOrders": self.reservation_orders,
                "terms": self.terms,
                "structureConditions": self.structure_conditions,
                "agencyConditions": self.agency_conditions,
                "structureCustomFields": self.structure_custom_fields,
                "agencyCustomFields": self.agency_custom_fields,
                "services": self.services,
                "idempotency": self.idempotency,
                "pending": {key: asdict(value) for key, value in self.pending.items()},
                "orderTerminals": self.order_terminals,
                "scripts": self.scripts.snapshot(),
                "rngState": _rng_state(self.rng),
            }

    def restore(self, data: dict[str, Any]) -> None:
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"state snapshot version {data.get('version')!r} is not {SNAPSHOT_VERSION}")
        with self.lock:
            self.reset()
            self._next_operation = max(self._next_operation, int(data.get("nextOperation", 0)))
            self.clock.set_offset(float(data.get("clockOffsetSeconds", 0.0)))
            self.orders = {k: _load(OrderRecord, v) for k, v in data.get("orders", {}).items()}
            self.operations = {k: _load(OperationRecord, v) for k, v in data.get("operations", {}).items()}
            self.links = {k: _load(LinkRecord, v) for k, v in data.get("links", {}).items()}
            self.contracts = {k: _load(ContractRecord, v) for k, v in data.get("contracts", {}).items()}
            self.build_sessions = {k: _load(BuildSessionRecord, v) for k, v in data.get("buildSessions", {}).items()}
            self.structures = dict(data.get("structures", {}))
            self.agencies = dict(data.get("agencies", {}))
            self.reservations = dict(data.get("reservations", {}))
            self.reservation_orders = dict(data.get("reservationOrders", {}))
            self.terms = dict(data.get("terms", {}))
            self.structure_conditions = dict(data.get("structureConditions", {}))
            self.agency_conditions = dict(data.get("agencyConditions", {}))
            self.structure_custom_fields = dict(data.get("structureCustomFields", {}))
            self.agency_custom_fields = dict(data.get("agencyCustomFields", {}))
            self.services = dict(data.get("services", {}))
            self.idempotency = dict(data.get("idempotency", {}))
            self.pending = {k: _load(PendingRecord, v) for k, v in data.get("pending", {}).items()}
            # Whose each order is: a restarted simulator still refuses another terminal's key on it.
            self.order_terminals = dict(data.get("orderTerminals", {}))
            self.scripts.restore(data.get("scripts", {}))
            if "rngState" in data:
                # Continue the sequence: a restarted simulator must not hand out the same ids again.
                version, internal, gauss = data["rngState"]
                self.rng.setstate((version, tuple(internal), gauss))

    def save(self, path: Path) -> None:
        """Write the snapshot atomically (a temporary file renamed over ``path``)."""
        with self.lock:
            text = json.dumps(self.snapshot(), indent=1, sort_keys=True)
            self.dirty = False
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text)
        os.replace(temporary, path)

    def load(self, path: Path) -> bool:
        """Load ``path`` if it exists; False when there is nothing to load."""
        if not path.exists():
            return False
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: not a simulator state file: {exc}") from None
        self.restore(data)
        return True
