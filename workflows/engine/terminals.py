"""Gateway terminals: which key, base URL and gate each flow's calls use (issue 40, item 1).

Why one home: a flow's every gateway call (its steps, the read-back of a lost answer, the read of a
notification, a refund of its payment, the reconciliation of its operations, a late payment's refund)
must use the credentials of the terminal the flow was started on, and meet that terminal's gate only.
A call made with another terminal's key would act on another merchant account (or be refused by the
gateway as an unknown order); a gate shared by two terminals lets an outage of one hold the other's
flows. So nothing else builds a gateway client or a gate: each asks :class:`Terminals` by name.

``default`` is the terminal of ``DURAPAY_GATEWAY__*`` under ``DURAPAY_GATEWAY_HEALTH__*``, as before
terminals existed: a flow record names its terminal only when it is another (``terminal``, absent for
``default``), so a deployment with one terminal writes not one byte more per flow.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from durapay.config.settings import DEFAULT_TERMINAL, GatewayHealthSettings, GatewaySettings, Settings, SettingsError
from durapay.config.tracing import OFF, Tracing
from durapay.gateway import GatewayClient
from durapay.workflows.engine.gate import Gate
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.states import TERMINAL, FlowState

#: The flow record's field naming its terminal (absent: ``default``).
FIELD = "terminal"
#: The setting that declares terminals.
SETTING = "DURAPAY_TERMINALS"
#: The states of a flow in flight (every one but the finished): those a removed terminal may not leave behind.
#: (A failed or cancelled flow is not counted: a retry of one on a removed terminal is parked at its claim.)
IN_FLIGHT = tuple(state for state in FlowState if state not in TERMINAL)


class UnknownTerminal(ValueError):
    """A start (or a schedule, a filter) names a terminal the settings do not declare."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(f"unknown terminal {name!r}; known terminals: {', '.join(self.known)}")


def of_fields(fields: Mapping[str, str]) -> str:
    """The terminal a record's fields name (``default`` when none)."""
    return fields.get(FIELD) or DEFAULT_TERMINAL


def gateway_settings(settings: Settings, name: str) -> GatewaySettings:
    """The gateway settings of terminal ``name``: its key and base URL, the gateway's timeouts."""
    if name == DEFAULT_TERMINAL:
        return settings.gateway
    terminal = settings.terminals[name]
    update: dict[str, Any] = {"api_key": terminal.api_key}
    if terminal.base_url:
        update["base_url"] = terminal.base_url
    return settings.gateway.model_copy(update=update)


def health_settings(settings: Settings, name: str) -> GatewayHealthSettings:
    """The gate settings of terminal ``name``: its own rate, burst and outage bound where it sets them."""
    if name == DEFAULT_TERMINAL:
        return settings.gateway_health
    terminal = settings.terminals[name]
    update = {
        field: value
        for field in ("rate_per_second", "burst", "outage_seconds")
        if (value := getattr(terminal, field)) is not None
    }
    return settings.gateway_health.model_copy(update=update)


class Terminals:
    """The terminals of one process: per terminal a gate (made once) and a gateway client (made per
    process after a fork, kept alive between calls). Thread safe."""

    def __init__(
        self,
        settings: Settings,
        client: Any,
        keys: Keys,
        *,
        gate_now: Callable[[], float] | None = None,
        client_factory: Callable[[], GatewayClient] | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self.settings = settings
        self.names = settings.terminal_names
        self._factory = client_factory  # tests: one client for every terminal
        self._tracing = tracing
        self.gates = {
            name: Gate(
                client, keys, health_settings(settings, name), gateway_settings(settings, name), terminal=name, now=gate_now
            )
            for name in self.names
        }
        self._clients: dict[str, tuple[int, GatewayClient]] = {}
        self._lock = threading.Lock()

    def check(self, name: str) -> str:
        """``name`` if the settings declare it, else :class:`UnknownTerminal` naming the known ones."""
        if name not in self.gates:
            raise UnknownTerminal(name, self.names)
        return name

    def gate(self, name: str = DEFAULT_TERMINAL) -> Gate:
        """Terminal ``name``'s gate (:class:`UnknownTerminal` for one the settings no longer declare: never
        another terminal's)."""
        return self.gates[self.check(name)]

    def health(self, name: str = DEFAULT_TERMINAL) -> GatewayHealthSettings:
        return self.gate(name).settings

    def client(self, name: str = DEFAULT_TERMINAL) -> GatewayClient:
        """This process's gateway client of terminal ``name``, with its key and base URL."""
        self.check(name)
        with self._lock:
            held = self._clients.get(name)
            if held is None or held[0] != os.getpid():
                made = (
                    self._factory()
                    if self._factory is not None
                    else GatewayClient(gateway_settings(self.settings, name), tracing=self._tracing)
                )
                self._clients[name] = held = (os.getpid(), made)
            return held[1]


class TerminalRemoved(SettingsError):
    """Flows in flight, or live schedules, use terminals the settings no longer declare: the process refuses
    to start (their calls would otherwise be made with no key, or, worse, with another terminal's; a
    schedule's every charge would be refused, in the log only)."""

    def __init__(self, stranded: Mapping[str, Mapping[str, int]], schedules: Mapping[str, Sequence[str]] | None = None) -> None:
        self.stranded = {name: dict(kinds) for name, kinds in stranded.items()}
        self.schedules = {name: list(ids) for name, ids in (schedules or {}).items() if ids}
        parts = []
        for name in sorted(set(self.stranded) | set(self.schedules)):
            what = []
            if kinds := self.stranded.get(name):
                count = sum(kinds.values())
                by_kind = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
                what.append(f"{count} flow{'s' if count != 1 else ''} in flight ({by_kind})")
            if ids := self.schedules.get(name):
                named = ", ".join(ids[:NAMED])
                more = f" and {len(ids) - NAMED} more" if len(ids) > NAMED else ""
                what.append(f"{len(ids)} live schedule{'s' if len(ids) != 1 else ''} ({named}{more})")
            parts.append(f"terminal {name!r}: {' and '.join(what)}")
        super().__init__(
            f"{SETTING}: {'; '.join(parts)}, and the settings no longer declare it: declare it again until they "
            "have ended (durapay flows ls --terminal NAME; durapay schedules ls), or cancel them "
            "(docs/operations.md, Removing a terminal)"
        )


#: How many live schedules a refusal names per terminal (it counts them all).
NAMED = 10


def mark_used(redis: Any, keys: Keys, names: Iterable[str]) -> None:
    """Note that flows (or a schedule's charges) are being started on ``names`` (before they are created:
    the set names every terminal a flow or schedule may be on, so that the start-up check never misses
    one). ``default`` is never noted.

    Nothing removes a name from the set: a removal could not be ordered against a start under way in a
    process that still declares the terminal (noted, not yet created: a check in between would see no
    flow on it and forget the terminal, and the flow created next would be parked for ever with nothing
    naming it). The set is bounded by the terminals ever declared."""
    noted = sorted({name for name in names if name != DEFAULT_TERMINAL})
    if noted:
        redis.sadd(keys.terminals(), *noted)


def undeclared(redis: Any, keys: Keys, declared: Iterable[str]) -> set[str]:
    """The terminals flows or schedules were started on that ``declared`` does not name (one SMEMBERS)."""
    used = {member.decode() if isinstance(member, bytes) else member for member in redis.smembers(keys.terminals())}
    return used - set(declared)


def stranded(redis: Any, keys: Keys, declared: Iterable[str], *, page: int = 1000) -> dict[str, dict[str, int]]:
    """Per terminal the settings do not declare, the flows in flight on it, counted by kind. Reads the
    set :func:`mark_used` keeps; only when it names a terminal not declared are the flows in flight read
    (:func:`in_flight_on`)."""
    return in_flight_on(redis, keys, undeclared(redis, keys, declared), page=page)


def in_flight_on(redis: Any, keys: Keys, names: Iterable[str], *, page: int = 1000) -> dict[str, dict[str, int]]:
    """Per terminal of ``names``, the flows in flight on it, counted by kind (none: not in the answer).
    Reads every flow in flight, in pages of ``page`` (the ``terminal`` and ``kind`` fields): a start-up
    cost paid only while a terminal once used is not declared."""
    found: dict[str, dict[str, int]] = {name: {} for name in names}
    if not found:
        return {}
    for partition in range(keys.partitions):
        for state in IN_FLIGHT:
            index, start = keys.by_state(partition, state.value), 0
            while True:
                ids = redis.zrange(index, start, start + page - 1)
                if not ids:
                    break
                pipe = redis.pipeline(transaction=False)
                for flow_id in ids:
                    pipe.hmget(keys.flow(flow_id.decode() if isinstance(flow_id, bytes) else flow_id), FIELD, "kind")
                for terminal, kind in pipe.execute():
                    name = terminal.decode() if isinstance(terminal, bytes) else terminal
                    if name in found:
                        kinds = found[name]
                        kind_name = kind.decode() if isinstance(kind, bytes) else str(kind)
                        kinds[kind_name] = kinds.get(kind_name, 0) + 1
                if len(ids) < page:
                    break
                start += page
    return {name: kinds for name, kinds in found.items() if kinds}
