"""The durable engine's Python API: start flows, read them, signal, cancel, retry, wait.

The Celery chain is the fast path; the Redis record is the truth (docs/durability.md). The pieces:

* this module - what a merchant's backend and an operator call (``Engine``);
* ``workflows.engine.protocol`` - the worker's side: claim a step, run it, complete it, dispatch what is due;
* ``workflows.engine.orders`` - which flow a gateway order belongs to, and its notifications' tokens;
* ``workflows.engine.store`` and ``workflows/engine/lua/`` - the record in Redis and every atomic change to it.

Delays of every kind (backoff, polls, waits, timers, leases, a lost chain link) are scores on the
``due`` set; :meth:`Engine.dispatch_due` (run by ``durapay scheduler``) sends what is due.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import redis
from pydantic import BaseModel, ValidationError

from durapay.config.settings import DEFAULT_TERMINAL, Settings
from durapay.config.tracing import OFF, TRACE_FIELD, FlowTag, Tracing
from durapay.gateway import GatewayClient, customer_payment, describe_validation_error, validate_strict
from durapay.tasks.outcomes import Outcome
from durapay.tasks.retry import RetryPolicy
from durapay.workflows.engine import operator_actions, versions
from durapay.workflows.engine.cards import SETTING as CARD_SETTING
from durapay.workflows.engine.cards import CardKeyMissing, CardVault, carries, may_carry
from durapay.workflows.engine.clock import Clock, ManualClock, SystemClock
from durapay.workflows.engine.durability import Durability, NotDurable
from durapay.workflows.engine.errors import ChangedSince, OperatorError
from durapay.workflows.engine.events import Cursor, Event, EventFeed
from durapay.workflows.engine.fairness import Caps, Fairness, fair_key, tenant_refusal
from durapay.workflows.engine.keys import Keys, derived_id
from durapay.workflows.engine.orders import OrderIdsTaken, OrderIndex, gateway_order_id
from durapay.workflows.engine.protocol import RESTARTED, Claim, StepProtocol
from durapay.workflows.engine.sensitive import (
    CardIdentifier,
    Identifier,
    holds_card,
    mask_text,
    refuse_card_identifier,
    refuse_card_identifiers,
)
from durapay.workflows.engine.signals import admit
from durapay.workflows.engine.states import STOPPED, TERMINAL, FlowState
from durapay.workflows.engine.steps import FlowDefinition, Step, check_run_bound
from durapay.workflows.engine.store import (
    Change,
    CreateCall,
    FlowRecord,
    FlowStore,
    MoneyTaken,
    NewFlow,
    NotStarted,
    OrderHeld,
    StartConflict,
    compact_json,
)
from durapay.workflows.engine.targets import Targets
from durapay.workflows.engine.terminals import Terminals, UnknownTerminal, mark_used
from durapay.workflows.flows.waits import keep_until
from durapay.workflows.late_payments import LatePayments
from durapay.workflows.listing import FlowListing, FlowPage
from durapay.workflows.pauses import Pauses

log = logging.getLogger("durapay.engine")

#: Per (kind, old version): the migration this code declares from it, (old, new) (``versions.migrations``).
Migrations = dict[tuple[str, str], tuple[FlowDefinition, FlowDefinition]]

__all__ = [
    "Claim",
    "Engine",
    "InputError",
    "NotDurable",
    "NotFound",
    "OperatorError",
    "OrderIdTaken",
    "Sender",
    "StartConflict",
    "gateway_order_id",
]


class Sender(Protocol):
    """How the engine sends work. ``queue`` is passed only with fairness on (``workflows.engine.fairness``): a
    sender of the tests' that takes none is the sender of a one-queue engine."""

    def send(self, task_name: str, flow_id: str, step: str) -> None: ...

    def send_chain(self, flow_id: str, links: builtins.list[tuple[str, str]], *, queue: str = ...) -> None: ...


class InputError(Exception):
    """A flow input refused at ``start``: ``field`` says which, ``reason`` says why."""

    def __init__(self, kind: str, field: str, reason: str) -> None:
        super().__init__(f"{kind}: {field}: {reason}")
        self.kind = kind
        self.field = field
        self.reason = reason


class OrderIdTaken(StartConflict):
    """A start naming a gateway order id that another flow holds (its lookup names that flow, until the
    retention after that flow ended): refused before anything is written. ``field`` names where the input
    gives the order id, ``reason`` which flow holds it. A conflict with what exists, not a bad input."""

    def __init__(self, kind: str, field: str, reason: str) -> None:
        super().__init__(f"{kind}: {field}: {reason}")
        self.kind = kind
        self.field = field
        self.reason = reason


class NotFound(Exception):
    """No flow with that id (or it expired after its retention time)."""


class Engine:
    """One per process. Give it the settings, a Redis client, the flow registry and a sender."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        registry: Mapping[str, FlowDefinition],
        *,
        sender: Sender | None = None,
        clock: Clock | None = None,
        client_factory: Callable[[], GatewayClient] | None = None,
        rng: random.Random | None = None,
        keys: Keys | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self.settings = settings
        self.redis: Any = client
        #: Traces (``config.tracing``): the off face unless the process's OTEL_* variables ask for them.
        self.tracing = tracing
        self.registry = dict(registry)
        check_run_bound(versions.held(self.registry).values(), settings.engine.max_step_runs)
        self.sender = sender
        self.clock = clock or SystemClock()
        self.keys = keys or Keys(prefix=settings.engine.key_prefix, partitions=settings.engine.partitions)
        engine_settings = settings.engine
        #: Card data at rest (``workflows.engine.cards``): sealed by the store, opened for a step's request.
        self.cards = CardVault.from_settings(settings.card)
        self.store = FlowStore(
            client,
            self.keys,
            engine_settings.retention,
            lambda: Durability.resolve(
                client, engine_settings.sync_aof, engine_settings.sync_replicas, engine_settings.sync_timeout
            ),
            cards=self.cards,
        )
        self.retry_policy = RetryPolicy.from_settings(settings.retry, rng)
        self.lease = settings.engine.lease_seconds
        self.orders = OrderIndex(client, self.keys, settings.engine.retention, settings.gateway.order_id_max_length)
        #: One unresolved money call per gateway target (a payment's order, a reservation): ``workflows.engine.targets``.
        self.targets = Targets(self.store, self.lease, self.clock.now)
        #: The gateway's health shared by every worker: breaker, rate limiter, 429 hold (``workflows.engine.gate``).
        #: On Redis's clock (one for every worker); an engine on a ManualClock (tests) keeps it on that one.
        gate_now = self.clock.now if isinstance(self.clock, ManualClock) else None
        #: The gateway terminals (``workflows.engine.terminals``): per terminal its client, key and gate. A flow's
        #: calls use its own terminal's only; ``gate`` is the ``default`` terminal's.
        self.terminals = Terminals(settings, client, self.keys, gate_now=gate_now, client_factory=client_factory, tracing=tracing)
        self.gate = self.terminals.gate(DEFAULT_TERMINAL)
        #: Jitters the dues of flows deferred while the breaker is open (seeded with the retry policy's).
        self.gate_rng = rng or random.Random()
        self.store.pause_recheck = settings.pause.recheck_seconds
        #: Every definition this process runs, by (kind, version): current and previous versions. A flow
        #: runs only on its own (claim.lua parks one whose version is not among them: workflows.engine.versions).
        self._held: tuple[tuple[int, ...], dict[tuple[str, str], FlowDefinition], str, Migrations] = ((), {}, "", {})
        self.store.held_definitions = lambda: self._held_now()[1]
        self.store.park_seconds = settings.engine.park_seconds
        #: Pauses of flow kinds (maintenance windows): a paused kind's flows run no step (``workflows.pauses``).
        self.pauses = Pauses(self.store, self.registry, self.clock.now)
        #: Which queue a flow's steps go to (``workflows.engine.fairness``): the one queue unless fairness is on.
        self.fairness = Fairness(settings.fairness)
        #: Per-key concurrency caps (``workflows.engine.fairness.Caps``): none unless fairness is on and caps are set.
        self.caps = Caps(client, self.keys, settings.fairness, self.lease)
        self.protocol = StepProtocol(self)
        self.late = LatePayments(self)
        # What ``close`` releases: set by whoever opened the engine's connections (``durapay.connect``).
        self.closer: Callable[[], None] | None = None

    # -- the Python API ----------------------------------------------------------------------

    def close(self) -> None:
        """Release what the engine was opened with (``durapay.connect``: its Redis connections, and an
        embedded Valkey it started). Once; an engine built by hand owns nothing and this does nothing."""
        closer, self.closer = self.closer, None
        if closer is not None:
            closer()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def held(self) -> dict[tuple[str, str], FlowDefinition]:
        """Every definition this process runs, by (kind, version): current and previous versions. A flow
        runs only on its own (claim.lua parks one whose version is not among them: workflows.engine.versions)."""
        return self._held_now()[0]

    def _held_now(self) -> tuple[dict[tuple[str, str], FlowDefinition], str, Migrations]:
        """``held``, claim.lua's text of it and the migrations declared, made again when the registry
        changed (a test's own kinds)."""
        identity = tuple(id(definition) for definition in self.registry.values())
        if identity != self._held[0]:
            made = versions.held(self.registry), versions.held_text(self.registry), versions.migrations(self.registry)
            self._held = (identity, *made)
        return self._held[1], self._held[2], self._held[3]

    def migration_for(self, record: FlowRecord) -> tuple[FlowDefinition, FlowDefinition] | None:
        """(old, new): the migration this code declares from the version ``record`` runs on, or None."""
        return self._held_now()[2].get(versions.recorded(record.kind, record.fields, self.registry))

    def definition_for(self, record: FlowRecord) -> FlowDefinition | None:
        """The definition ``record`` runs on (the version it started on), None when this code holds none."""
        return self.held.get(versions.recorded(record.kind, record.fields, self.registry))

    def definition(self, kind: str) -> FlowDefinition:
        try:
            return self.registry[kind]
        except KeyError:
            known = ", ".join(sorted(self.registry))
            raise InputError(kind, "kind", f"unknown flow kind; known kinds: {known}") from None

    def validate(self, kind: str, data: Mapping[str, Any] | BaseModel, *, strict: bool = True) -> BaseModel:
        """``data`` as the input of ``kind``, read strictly (``gateway._strict``): an unknown field, an
        unknown value of a closed set or an amount out of bounds is an InputError naming the field, the
        reason and the closest known name. (A stored input is read back leniently at each step: a
        record written by an earlier release must still run.) ``strict=False``: read as a stored input
        is, the model's own types and constraints only (``start_many``'s ``trusted``)."""
        definition = self.definition(kind)
        try:
            if isinstance(data, BaseModel):
                data = data.model_dump(mode="json", by_alias=True, exclude_none=True)
            if not strict:
                return definition.input_model.model_validate(data)
            model = validate_strict(definition.input_model, data)
            # A merchant's identifiers are shown whole (sensitive.identifier): none may be a card number.
            refuse_card_identifiers(model.model_dump(mode="json", by_alias=True, exclude_none=True))
            return model
        except ValidationError as exc:
            field, reason = describe_validation_error(exc)
            raise InputError(kind, field, reason) from None
        except CardIdentifier as exc:
            raise InputError(kind, exc.field, exc.reason) from None

    def start(
        self,
        kind: str,
        data: Mapping[str, Any] | BaseModel,
        key: str | None = None,
        *,
        run_at: float | None = None,
        run_at_asked: str = "",
        derived_key: bool = False,
        note: Mapping[str, str] | None = None,
        terminal: str | None = None,
        tenant: str | None = None,
    ) -> FlowRecord:
        """Start a flow; with ``key``, a second start with the same key, input and start time returns the
        first flow (a different one is a StartConflict: a key names one whole request). A merchant's key,
        like the input's identifiers, must not look like a card number (InputError, field ``key``);
        ``derived_key``: durapay made the key itself (a late payment's refund names the gateway's
        operation id in it), so it is not a merchant's and that rule does not apply. ``note``: why the flow
        was started, kept in its record (a late payment's refund: who asked, and why); not part of what a
        start key must match. ``tenant``: the merchant's tenant on a platform (``workflows.engine.fairness``:
        with the terminal, the flow's fairness key), kept on the record when set; InputError (field
        ``tenant``) unless it is 1 to 64 letters, digits, ``.``, ``_`` or ``-``.

        With ``run_at`` (POSIX seconds, future) the flow sleeps on the due set until then: a durable
        timer, never a Celery ETA. ``run_at_asked``: how the caller wrote it (the API's ``?run_at``, say
        ``in 2h``), which a repeated request must match; by default ``run_at`` itself.

        ``terminal``: the gateway terminal whose key, base URL and gate every call of the flow uses
        (``workflows.engine.terminals``; None: ``default``); one the settings do not declare is an InputError
        (field ``terminal``, naming the known ones) before anything is written.

        Raises InputError (field, reason) before anything is written when the input is bad, and
        StartConflict when ``key`` was used for a different input (or terminal), or OrderIdTaken (field,
        reason) when its gateway order id is another flow's.
        """
        now = self.clock.now()
        new = self._new_flow(kind, data, key, run_at, now, derived_key=derived_key, terminal=terminal)
        if tenant is not None:
            refused = tenant_refusal(tenant)
            if refused is not None:
                raise InputError(kind, "tenant", refused)
            new = dataclasses.replace(new, tenant=tenant)
        if note:
            new = dataclasses.replace(new, note=compact_json(dict(note)))
        if run_at is not None:
            new = dataclasses.replace(new, when=run_at_asked or repr(run_at))
        if self.tracing.on:
            tag = FlowTag(new.flow_id, kind, new.terminal or DEFAULT_TERMINAL)
            self.tracing.tag_current(tag)  # the API request's span, begun before the flow had an id
            with self.tracing.flow_span(f"start {kind}", tag):
                # The flow's trace context, on its record: each step's span links to it.
                return self._start(dataclasses.replace(new, trace=self.tracing.context()), now)
        return self._start(new, now)

    def _start(self, new: NewFlow, now: float) -> FlowRecord:
        self._order_free(new)
        if new.terminal:  # noted before the flow exists: a start refusing a removed terminal never misses it
            mark_used(self.redis, self.keys, [new.terminal])
        try:
            record, created = self.store.create(new, now=now, by="start", safety=self.safety)
        except OrderHeld as held:
            raise self._order_refusal(new, held) from None
        if new.order_id and not created.order:
            # A retried start too: on a cluster its first try may have died between the two writes.
            self.orders.claim(new.order_id, new.flow_id)
        # Acknowledged means durable: a start lost by a crash after this answer would be a promise broken.
        self.store.sync(new.flow_id, f"start of flow {new.flow_id}", orders=[new.order_id] if new.order_id else [])
        if created.flow and record.state is FlowState.READY:
            self.protocol.send_from(record, record.step)
        return record

    def start_many(
        self,
        starts: Sequence[tuple[str, Mapping[str, Any] | BaseModel, str | None]],
        *,
        owners: Sequence[str] = (),
        terminals: Sequence[str] = (),
        trusted: bool = False,
        within: Callable[[builtins.list[tuple[int, CreateCall]]], Sequence[Any]] | None = None,
    ) -> builtins.list[str | Exception]:
        """Start many flows (kind, input, key) in a few round trips: one to create them all, one wait for
        durability covering them all (the scheduler fires occurrences this way). ``owners``: per start,
        what owns the flow's retries (a schedule, whose dunning retries a declined charge: an operator's
        restart of that flow is refused, or the occurrence would be charged twice). ``terminals``: per start,
        its gateway terminal (a schedule's; empty: ``default``). Per start: the flow
        id, or the InputError or StartConflict that refused it (the others go on).

        ``trusted``: the inputs were built by durapay itself from input already read strictly (a
        schedule's occurrences: the schedule's fields, read strictly when it was created or changed, and
        the occurrence's ``orderId``). They are read as the same typed input, every field's type and
        constraints checked (a bad ``orderId`` is still an InputError), without the merchant checks of the
        strict reader (unknown fields and values with their "did you mean", amount bounds) that the
        schedule's own input passed already. Never for a merchant's input.

        ``within``: on a single server, the caller runs the creates inside its own scripts (the scheduler's
        fire: a schedule's change, its flows' creates and its mark in one script, ``create_flow.lua``
        being the create's one home). It is given (position in ``starts``, the create's call) for every
        start not refused before, in order (even none), and answers each one's ``create.lua`` answer, or
        None where its script ran no create (that start's result is a NotStarted); every rule of the start
        (input, card sealing, order lookup, durability wait, the first step sent) stays here."""
        if within is not None and self.store.pins.cluster:
            raise ValueError("start_many(within=...) is for a single server: a cluster holds a flow's keys in other slots")
        now = self.clock.now()
        results: builtins.list[str | Exception] = []
        news: builtins.list[NewFlow] = []
        for index, (kind, data, key) in enumerate(starts):
            try:
                new = self._new_flow(
                    kind,
                    data,
                    key,
                    None,
                    now,
                    trusted=trusted,
                    terminal=terminals[index] if terminals else None,
                    owner=owners[index] if owners else "",
                )
                if self.tracing.on:
                    new = self._traced(new)
                self._order_free(new)
                news.append(new)
                results.append(news[-1].flow_id)
            except (InputError, OrderIdTaken) as refused:
                results.append(refused)
        mark_used(self.redis, self.keys, [new.terminal for new in news if new.terminal])
        write = None
        if within is not None:
            positions = [index for index, result in enumerate(results) if not isinstance(result, Exception)]
            run = within

            def write(calls: builtins.list[CreateCall]) -> Sequence[Any]:
                return run(list(zip(positions, calls, strict=True)))

        outcomes = self.store.create_many(news, now=now, by="start", safety=self.safety, write=write)
        created = iter(zip(news, outcomes, strict=True))
        made: builtins.list[NewFlow] = []
        unpointed: builtins.list[tuple[str, str]] = []  # order lookups the create did not point (cluster, held)
        for index, result in enumerate(results):
            if isinstance(result, Exception):
                continue
            new, outcome = next(created)
            if isinstance(outcome, StartConflict | NotStarted):
                results[index] = outcome
            elif isinstance(outcome, OrderHeld):
                results[index] = self._order_refusal(new, outcome)
            elif outcome.flow:
                made.append(new)
                if new.order_id and not outcome.order:
                    unpointed.append((new.order_id, new.flow_id))
        self.orders.claim_many(unpointed)
        if news:
            # On a cluster the flows (and their order lookups) sit on several nodes: one wait per node.
            orders = [new.order_id for new in made if new.order_id]
            self.store.sync([new.flow_id for new in news], f"start of {len(news)} flows", orders=orders)
        for new in made:
            # (A start of the scheduler's names no tenant: its key is its terminal.)
            self.protocol.send_chain(
                new.flow_id, self.registry[new.kind], new.first_step, fair_key=fair_key(new.terminal, new.tenant)
            )
        return results

    def _traced(self, new: NewFlow) -> NewFlow:
        """``new`` with the trace context of a ``start <kind>`` span of its own (a schedule's occurrence: no
        request to belong to), so that its steps' spans link to one start as an API start's do."""
        tag = FlowTag(new.flow_id, new.kind, new.terminal or DEFAULT_TERMINAL)
        with self.tracing.flow_span(f"start {new.kind}", tag, attributes={"durapay.batch": True}):
            return dataclasses.replace(new, trace=self.tracing.context())

    def _order_free(self, new: NewFlow) -> None:
        """On a cluster, where ``create.lua`` cannot see the order lookup (another slot): refuse a start
        whose gateway order id another flow holds, before anything is written."""
        if new.order_id and self.store.pins.cluster:
            holder = self.orders.flow_for(new.order_id)
            if holder is not None and holder != new.flow_id:
                raise self._order_refusal(new, OrderHeld(new.order_id, holder))

    def _order_refusal(self, new: NewFlow, held: OrderHeld) -> OrderIdTaken:
        holder = self.store.get(held.holder)
        state = f" (it is {holder.state})" if holder is not None else ""
        return OrderIdTaken(
            new.kind,
            self.registry[new.kind].order_field,
            f"order id {held.order_id} is flow {held.holder}'s{state}: a payment on it is that flow's, and the gateway "
            "refuses an order id twice; start with a new order id",
        )

    def _new_flow(
        self,
        kind: str,
        data: Mapping[str, Any] | BaseModel,
        key: str | None,
        run_at: float | None,
        now: float,
        *,
        trusted: bool = False,
        derived_key: bool = False,
        terminal: str | None = None,
        owner: str = "",
    ) -> NewFlow:
        """The flow ``start`` would create (its input read strictly, or with ``trusted`` as ``start_many``
        says), or InputError. A merchant's ``key`` (neither ``trusted`` nor ``derived_key``) is read as the
        identifier it is (``sensitive.refuse_card_identifier``). ``owner``: ``NewFlow.owner``."""
        definition = self.definition(kind)
        if terminal is not None:
            try:
                self.terminals.check(terminal)
            except UnknownTerminal as exc:
                raise InputError(kind, "terminal", str(exc)) from None
        model = self.validate(kind, data, strict=not trusted)
        terminal = self._terminal_of(kind, model, terminal)
        if key and not (trusted or derived_key):
            try:
                refuse_card_identifier("key", key)
            except CardIdentifier as exc:
                raise InputError(kind, exc.field, exc.reason) from None
        if run_at is not None and run_at <= now:
            # A time in the past would run the payment at once: the mistake of an age for a time.
            raise InputError(kind, "run_at", f"must be in the future (it is {now - run_at:.0f}s in the past)")
        wire = model.model_dump(mode="json", by_alias=True, exclude_none=True)
        delay = self.settings.engine.max_card_delay_seconds
        if run_at is not None and run_at - now > delay and holds_card(wire):
            # The card (its CVV too) stays in the record until the flow runs: PCI DSS keeps no CVV longer
            # than the authorization needs. A later charge is a card on file (mit, a schedule), not a delay.
            raise InputError(
                kind,
                "run_at",
                f"a flow carrying card data may wait at most {delay:g}s (DURAPAY_ENGINE__MAX_CARD_DELAY_SECONDS): its "
                f"card, CVV included, is kept until it runs; this is {run_at - now:.0f}s ahead",
            )
        text = compact_json(wire)  # what the store writes (sealed first when it may carry a card)
        if not self.cards.configured and may_carry(text) and carries(wire):
            # Before anything is written: card data reaches Redis only sealed (the store refuses too).
            raise CardKeyMissing(
                f"a {kind} flow carries card data, which is written to Redis only encrypted, and {CARD_SETTING} is not "
                "set: set it on every durapay process (docs/security.md, Card data at rest; `durapay cards new-key`)"
            )
        key = key or (definition.start_key(model) if definition.start_key else None)
        flow_id = derived_id("f", kind, key) if key else "f" + uuid.uuid4().hex[:24]
        order_id = definition.order_id(model) if definition.order_id else ""
        limit = self.orders.max_length
        # (A merchant object's own id, ``order_fixed``, a reservation's, keeps its own published limit.)
        if len(order_id) > limit and not definition.order_fixed:
            # The gateway would refuse it after the flow began; say so before anything is written or sent.
            raise InputError(
                kind,
                definition.order_field,
                f"at most {limit} characters (the gateway's orderId limit, DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH); "
                f"{order_id!r} has {len(order_id)}",
            )
        steps = definition.steps
        if steps and steps[0].when is None:  # most flows: the first step applies to every input, no context needed
            first: Step | None = steps[0]
        else:
            first = definition.first_step(self.protocol.context(flow_id, kind, "", model, {}, now, order_id))
        if first is None:
            raise InputError(kind, "(input)", "no step of this flow applies to this input")
        return NewFlow(
            flow_id,
            kind,
            first.name,
            wire,
            order_id,
            key or "",
            run_at,
            owner=owner,
            text=text,
            definition=versions.label(definition),
            terminal="" if terminal == DEFAULT_TERMINAL else terminal,
        )

    def _terminal_of(self, kind: str, model: BaseModel, asked: str | None) -> str:
        """The terminal a flow runs on: the one asked, else ``default``; for a flow acting on an operation
        durapay recorded (a refund, a capture of a payment: its input's ``operationId``), that operation's
        flow's terminal, whose key alone may act on it: asked for none, it is the flow's; asked for another,
        an InputError naming both (a refund with another terminal's key would be refused by the gateway).
        Read only when terminals are declared (one lookup per partition, and the flow's field)."""
        if len(self.terminals.names) == 1:
            return asked or DEFAULT_TERMINAL
        operation_id = getattr(model, "operationId", None)
        holder = self.store.flow_for_operation(str(operation_id)) if operation_id else None
        owner = self.redis.hget(self.keys.flow(holder), "terminal") if holder else None
        if holder is None:
            return asked or DEFAULT_TERMINAL
        found = owner.decode() if isinstance(owner, bytes) else owner or DEFAULT_TERMINAL
        if asked is not None and asked != found:
            raise InputError(
                kind,
                "terminal",
                f"operation {operation_id} is flow {holder}'s, on terminal {found!r}: only that terminal's key may act "
                f"on it (start with terminal {found!r}, or none)",
            )
        return found

    def get(self, flow_id: str) -> FlowRecord:
        record = self.store.get(flow_id)
        if record is None:
            raise NotFound(f"no flow {flow_id!r}")
        return record

    def list(
        self,
        *,
        state: FlowState | None = None,
        kind: str | None = None,
        since: float | None = None,
        limit: int = 50,
        after: str | None = None,
        terminal: str | None = None,
    ) -> FlowPage:
        """Flows newest first, filtered by state, kind, gateway terminal and creation (``since`` = POSIX seconds: created
        since, with a state or without): at most ``limit``, after the cursor ``after`` (a page's ``next``;
        ``BadCursor``, a ValueError, says why when it is malformed).

        Newest by creation (with ``state``: by the flow's last change), then by id. The cursor is a
        position (the last flow's time and id), not a count: flows started after a page was read never
        shift or repeat the next one, and a flow that moves on keeps its place in the list by creation.
        With ``state``, a flow that changes between two pages (enters the state, or moves on within it:
        waiting at one step, then at the next) moves to the top: the following pages do not show it, a
        listing from the top does, first; every flow that did not change is shown once. One call reads
        at most ``listing.READ_BUDGET`` index entries: a filter that steps over many flows answers a short
        page (even empty) with a ``next`` to go on from. The answer is a list of the flows with ``.next``,
        the cursor of the next page (None at the end); ``workflows.listing`` reads it from the indexes
        without reading every id."""
        return FlowListing(self.store, self.registry).flows(
            states=[state] if state is not None else [], kind=kind, since=since, limit=limit, after=after, terminal=terminal
        )

    def events(
        self,
        after: str | Cursor | None = None,
        *,
        types: Iterable[str] | None = None,
        follow: bool = False,
        poll: float = 0.5,
    ) -> Iterator[tuple[Event, Cursor]]:
        """Merchant events (``workflows.engine.events``) after the cursor ``after`` (its text form, as the
        feed answers it, or a Cursor; None: from the oldest kept), each with the cursor to resume
        after it. With ``follow`` it waits for new ones (polling every ``poll`` seconds) for ever."""
        cursor = Cursor.parse(after) if isinstance(after, str) or after is None else after
        feed = EventFeed(self.redis, self.keys)
        if follow:
            yield from feed.follow(cursor, types=types, poll=poll)
            return
        while True:
            page, following = feed.read(cursor, types=types)
            for event in page:
                cursor = cursor.after(event)
                yield event, cursor
            if following == cursor and not page:
                return
            cursor = following

    def history(self, flow_id: str) -> builtins.list[dict[str, Any]]:
        self.get(flow_id)
        return self.store.history(flow_id)

    def signal(
        self,
        flow_id: str,
        name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        by: str = "api",
        keep_until: float | None = None,
    ) -> str:
        """Deliver a signal (``3ds_result``, ``form_completed``, ``notification``, ...): ``resumed``,
        ``stored`` (kept until the flow waits for it), ``finished``, ``late_payment``, or raise NotFound.

        A signal reporting a payment taken (a notification of an AUTHORIZED or EXECUTED operation) is
        marked, so that the money always shows in the flow: a flow that ended failed or cancelled, or
        succeeded with another operation, moves to ``needs_attention`` (``late_payment``) with the
        signal kept; ``retry`` then lets the waiting step take it, or a person refunds it.

        ``keep_until``: the signal tells of a change that lets the customer pay until then (a renewed
        link, :meth:`tell_holder`): a completion that ends the flow before its step reads the signal
        keeps the flow that long (transition.lua), as a finished holder is kept."""
        flow = self.get(flow_id)
        if self.tracing.on:
            tag = FlowTag(flow_id, flow.kind, flow.terminal)
            self.tracing.tag_current(tag)  # the request's span (the API's, or the receiver's for a notification)
            link = flow.fields.get(TRACE_FIELD, "")
            with self.tracing.flow_span(f"signal {name}", tag, link=link, attributes={"durapay.signal": name, "durapay.by": by}):
                result = self._signal(flow, name, payload, by, keep_until)
                self.tracing.annotate({"durapay.result": result})
                return result
        return self._signal(flow, name, payload, by, keep_until)

    def _signal(self, flow: FlowRecord, name: str, payload: Mapping[str, Any] | None, by: str, keep_until: float | None) -> str:
        flow_id = flow.id
        # The signals of the flow's own definition (a previous version may wait for one the current does not).
        # A version this process does not hold (a rolling deploy: a newer build's flow) is left to the store,
        # as a kind not held is: judged by the current definition, its awaited signal was refused.
        body = admit(self.definition_for(flow), name, payload, by=by)  # SignalRefused
        paid = customer_payment(body)
        now = self.clock.now()
        kept = {"keep_until": keep_until} if keep_until is not None else {}
        result = self.store.signal(flow_id, name, body, now=now, by=by, safety=self.safety, paid=paid, **kept)
        if result == "missing":
            raise NotFound(f"no flow {flow_id!r}")
        if result != "finished":
            self.store.sync(flow_id, f"signal {name} of flow {flow_id}")  # before the sender is told
        if result == "resumed":
            record = self.get(flow_id)
            self.protocol.send_from(record, record.step)
        elif result == "late_payment":
            record = self.get(flow_id)
            self.orders.keep([record.lookups])
            operation = Identifier(str((paid or {}).get("operationId") or "?"))  # the gateway's, read back: whole
            kind = (record.error or {}).get("type")
            log.error("flow %s: %s of operation %s", flow_id, kind, operation, extra={"payment": paid})
        return result

    def tell_holder(self, name: str, output: Mapping[str, Any]) -> None:
        """Tell the flow that holds the gateway order ``output`` names (``orderId``) that another flow
        changed it there (``FlowDefinition.tells_holder``: a renewed or modified link). The answer's
        security token is kept for the order (a holder that adopted its link has none of its own). A flow
        still going gets signal ``name`` and reads the gateway; a finished one is kept, with its order
        lookups and notification tokens, while the change lets its customer pay (``workflows.flows.waits``),
        so that a payment then is verified and shows in it as a late payment."""
        order_id = output.get("orderId")
        holder = self.orders.flow_for(str(order_id)) if order_id else None
        if holder is None:
            return
        # The signal's answer decides, not the read before it: a holder read going whose step completes
        # before the signal is written (its read made before the renewal) answers ``finished``, and is kept
        # like one read finished. Stored, the signal carries the keep: a step reading it follows the link,
        # and a completion ending the flow before that (a cancel's read) keeps it as long (transition.lua).
        # Bounded: a flow finishes once; only a person's retry makes it go again.
        until = keep_until(dict(output))
        for _ in range(3):
            try:
                record = self.get(holder)
            except NotFound:
                return
            # The change's answer carries the link's security token: kept for the holder's order, so that
            # the receiver verifies its notifications also when the holder adopted the link without one
            # (its create's answer lost). Written while the record stands: its lookups get their end with it.
            self.orders.keep_token(str(order_id), holder, output)
            if not record.finished:
                if self.signal(holder, name, {}, by="engine", keep_until=until) != "finished":
                    return
                continue  # it finished between the read and the signal: keep it, read again
            self._keep_for(record, until)
            return
        log.warning("flow %s: told %s three times, going and finished in turn; its deadline read decides", holder, name)

    def _keep_for(self, record: FlowRecord, until: float | None) -> None:
        """Keep a finished holder until ``until``, while the change it was told lets its customer pay."""
        if until is not None:
            # Written to the record (the packing pass gives record and lookups their end from it); a record
            # packed already has its end moved now, and its lookups with it.
            seconds = self.store.keep_until(record.id, max(until, record.keep_until), now=self.clock.now())
            if seconds:
                self.orders.expire(record.lookups, seconds)

    def cancel(
        self, flow_id: str, reason: str = "cancelled", *, by: str = "api", seen: operator_actions.Seen | None = None
    ) -> FlowRecord:
        """Cancel now, at the end of the step in flight, or, while money may be in flight at the gateway,
        once a read of the gateway shows none moved (docs/durability.md, "Money in flight").

        The record returned says which: ``cancelled``; or ``cancel_requested`` with the flow still going
        (a step in flight, or money in flight: its step reads the gateway now and the flow then ends
        ``cancelled`` if no money moved, ``succeeded`` if it did, or ``needs_attention`` naming it).

        ``seen``: the flow as a person confirmed it (a bulk dry run's, a confirmation page's): :class:`ChangedSince` if it is no
        longer so, judged on the read each write is guarded by (its version), so a change in between is
        found on the next read."""
        for _ in range(20):
            record = self.get(flow_id)
            if seen is not None and (changed := seen.changed(record)) is not None:
                raise ChangedSince(changed)
            if record.cancel_requested and record.state not in TERMINAL:
                return record  # asked again (a merchant's retried call): the request stands
            refused = operator_actions.refusal(record, "cancel")
            if refused is not None:
                raise OperatorError(refused)
            if record.state is FlowState.RUNNING:
                # A step in flight: it stops at its end (its effect kept and reported), never mid-call.
                if self.store.request_cancel(flow_id, record.version):
                    self.store.sync(flow_id, f"cancel request of flow {flow_id}")
                    return self.get(flow_id)
                continue  # it completed meanwhile: cancel what it left
            reason = mask_text(reason)  # a person's words, masked where they are written (workflows.engine.sensitive)
            fields: dict[str, str | None] = {"outcome": compact_json({"reason": reason})}
            fields |= operator_actions.decision(record, "cancel")  # a person's, on a call sent with no hold
            change = Change(FlowState.CANCELLED, f"cancelled: {reason}", fields)
            # transition.lua decides: cancelled, or (money in flight) a request whose step runs now to read,
            # or refused (its payment succeeded).
            try:
                written = self.store.transition(record, change, now=self.clock.now(), by=by)
            except MoneyTaken as taken:
                raise OperatorError(
                    f"{taken}; close the second payment it waits on with refund-late-payment or keep-late-payment"
                ) from None
            if written is not None:
                self.store.sync(flow_id, f"cancel of flow {flow_id}")
                if written.state is FlowState.READY:
                    self.protocol.send_from(written, written.step)
                return written
        raise OperatorError(f"flow {flow_id} kept changing; try again")

    def retry(self, flow_id: str, *, by: str = "api", seen: operator_actions.Seen | None = None) -> FlowRecord:
        """Move a ``needs_attention`` flow on from its current step (reconciling first when its last
        try was ambiguous), or start a ``failed`` flow again from its first step on a fresh gateway
        order id and fresh idempotency keys. Either runs on the flow's own version, or on one this code
        may move it to (:meth:`_retry_definition`); otherwise it is refused naming the version.

        Judged again from a fresh read when the flow changed between the read and the write (the
        dispatcher's packing pass, which moves the version: the change is then written on the record
        unpacked), a few times; then the operator is told to look again. ``seen``: as for :meth:`cancel`
        (a flow that failed again after a person's dry run showed it failed is not restarted)."""
        for _ in range(3):
            record = self.get(flow_id)
            if seen is not None and (changed := seen.changed(record)) is not None:
                raise ChangedSince(changed)
            refused = operator_actions.refusal(record, "retry")
            if refused is not None:
                raise OperatorError(refused)
            now = self.clock.now()
            written = self.store.transition(record, self._retry_change(record, now), now=now, by=by)
            if written is not None:
                # Live again: every order it made still routes to it, every lookup kept (after the change:
                # a crash before this leaves it listed for the packing pass, which keeps them then).
                self.orders.keep([written.lookups])
                self.store.sync(flow_id, f"retry of flow {flow_id}")
                self.protocol.send_from(written, written.step)
                return written
        raise OperatorError(f"flow {flow_id} changed meanwhile; look again")

    def _retry_definition(self, record: FlowRecord, step: str | None) -> tuple[FlowDefinition, str | None]:
        """The one definition a retry runs ``record`` on, and the ``definition`` field to record when that
        moves it (else None): its own version when this code holds it; else the version this code declares
        a migration to, where the migration rule allows it at ``step`` (the step it goes on from; None: the
        restart's first step of that version), the claim's rule (``versions.migration``). Otherwise
        OperatorError naming the version: a retry never puts a flow on steps of another version than the one
        it records (every claim would then park it), and a flow refused here waits, as it is, for a build
        that holds its version (``durapay deploy check`` counts it)."""
        definition = self.definition_for(record)
        if definition is not None:
            return definition, None
        kind, version = versions.recorded(record.kind, record.fields, self.registry)
        own = f"{kind}@{version}" if version else kind
        migration = self.migration_for(record)
        if migration is None:
            held = ", ".join(sorted(f"{k}@{v}" for k, v in self.held if k == kind)) or f"no {kind} kind"
            raise OperatorError(
                f"flow {record.id} runs on {own}, which this code does not hold (it holds {held}); retry it from "
                f"a build that holds {own}"
            )
        old, new = migration
        at = step if step is not None else new.steps[0].name
        unsettled = (record.unsettled or {}).get("step") if step is not None else None
        refused = versions.migration(old, new, at, unsettled)
        if refused is not None:
            raise OperatorError(
                f"flow {record.id} runs on {own}, which this code does not hold, and may not move to "
                f"{versions.label(new)}: {refused}; retry it from a build that holds {own}"
            )
        return new, versions.label(new)

    def _retry_change(self, record: FlowRecord, now: float) -> Change:
        """The change an operator's retry makes of ``record`` (needs_attention or failed), on the definition
        :meth:`_retry_definition` says."""
        flow_id = record.id
        stopped = record.state is FlowState.NEEDS_ATTENTION
        # A needs_attention flow goes on from its step (a migration is then written by the claim, with that
        # step's completion); a failed one restarts, on the version it is moved to if any, recorded here.
        definition, moved_to = self._retry_definition(record, record.step if stopped else None)
        if record.state is FlowState.NEEDS_ATTENTION:
            error = record.error or {}
            if error.get("type") == "LatePayment":
                self._retry_takes_late_payment(record, error)
            # Whatever stopped the flow (an ambiguous error, a crash, a lost worker), the step's call
            # may have reached the gateway: read it back before calling again (a no-op for reads).
            fields: dict[str, str | None] = {
                "attempt": "0",
                "polls": "0",
                "runs": None,
                "reconcile": "1",
                # Any call of the last try was sent before the flow stopped.
                "maybe_sent": repr(record.updated),
                "cancel_requested": None,
                # A person's decision on a call an earlier release sent with no hold (the operation taken).
                **operator_actions.decision(record, "retry"),
            }
            return Change(FlowState.READY, "retry requested (reconcile first)", fields, due=now + self.safety)
        if record.state is FlowState.FAILED:
            try:
                model = definition.input_model.model_validate(self.cards.open(flow_id, record.input))
            except ValidationError:
                raise OperatorError(
                    f"flow {flow_id}: its card data was erased when it ended; start a new flow with the card"
                ) from None
            ctx = self.protocol.context(flow_id, record.kind, "", model, {}, now, record.order_id)
            first = definition.first_step(ctx)
            assert first is not None
            seq = record.order_seq + 1
            base = definition.order_id(model) if definition.order_id and not definition.order_fixed else ""
            new_order = record.order_id if definition.order_fixed else ""  # the gateway's order, for good
            if base:
                try:
                    seq, new_order = self.orders.take(base, seq, flow_id)  # a derived order id is one flow's only
                except OrderIdsTaken as exc:
                    raise OperatorError(f"flow {flow_id}: no fresh gateway order id: {exc}") from None
            fields = {f"out:{name}": None for name in record.outputs}
            fields |= {signal.field: None for signal in record.signals}
            fields |= {
                "step": first.name,
                "attempt": "0",
                "polls": "0",
                "generation": str(record.generation + 1),
                "order_seq": str(seq if base else record.order_seq),
                "order_id": new_order,
                "reconcile": None,
                "uncertain": None,
                "error": None,
                "outcome": None,
                "wait": None,
                "customer_url": None,
                "cancel_requested": None,
                "runs": None,
                "unsettled": None,
                "ending": None,
                "maybe_sent": None,
                # A new generation's money step takes its target anew (workflows.engine.targets): the hold of the
                # failed one was of its own call, its snapshot of what the target held then.
                "hold": None,
                "hold_fence": None,
                "decided": None,
            }
            if moved_to is not None:
                fields["definition"] = moved_to
            if new_order and new_order not in record.orders:
                fields["orders"] = compact_json([*record.orders, new_order])
            return Change(FlowState.READY, RESTARTED, fields, due=now + self.safety)
        raise AssertionError(record.state)  # operator_actions.refusal said which states retry

    def refund_late_payment(
        self, flow_id: str, reason: str = "late payment refunded", *, by: str = "api", seen: operator_actions.Seen | None = None
    ) -> FlowRecord:
        """Refund a ``LatePayment`` (a ``refund`` flow of it); the flow is closed once that refund succeeded
        (``workflows.late_payments``). ``seen``: as for :meth:`cancel` (judged on a read right before)."""
        self._as_seen(flow_id, seen)
        return self.late.refund(flow_id, reason, by=by)

    def _as_seen(self, flow_id: str, seen: operator_actions.Seen | None) -> None:
        """:class:`ChangedSince` when the flow is no longer as a person was shown it."""
        if seen is not None and (changed := seen.changed(self.get(flow_id))) is not None:
            raise ChangedSince(changed)

    def refund_under_way(self, record: FlowRecord) -> FlowRecord | None:
        """The refund flow of the flow's late payment while it is being refunded (the flow is closed when
        it succeeded), to link to; None when the flow is no ``LatePayment`` or none is under way."""
        return self.late.under_way(record)

    def refusal(self, record: FlowRecord, action: str) -> str | None:
        """Why the engine would refuse ``action`` on the flow now (None: it would take it), told of a
        refund under way as :meth:`actions` is: what the console's confirmation page says."""
        return operator_actions.refusal(record, action, refunding=self.late.under_way(record))

    def actions(self, record: FlowRecord) -> builtins.list[str]:
        """The operator actions the engine accepts on the flow now (``operator_actions.allowed``, told of a
        refund under way): what the console offers and ``durapay flows show`` lists."""
        return operator_actions.allowed(record, refunding=self.late.under_way(record))

    def keep_late_payment(self, flow_id: str, *, by: str = "api", seen: operator_actions.Seen | None = None) -> FlowRecord:
        """Keep a ``LatePayment``: beside a succeeded flow's payment, listed; otherwise the flow's outcome
        (``workflows.late_payments``). ``seen``: as for :meth:`refund_late_payment`."""
        self._as_seen(flow_id, seen)
        return self.late.keep(flow_id, by=by)

    def _retry_takes_late_payment(self, record: FlowRecord, error: Mapping[str, Any]) -> None:
        """A retry of a ``LatePayment`` flow lets its waiting step take the payment as its outcome (only for a
        flow that had not succeeded: ``operator_actions.refusal``): not while a refund of it is under way, and
        only once a read of the gateway shows it still held (``LatePayments.accepting``): the step takes the
        kept notification as it came."""
        operation_id = str((error.get("operation") or {}).get("operationId") or "")
        self.late.accepting(record.id, operation_id)

    _no_worker = "; no worker serves this store (no heartbeat): start `durapay worker` with the same settings, or `durapay dev`"

    def wait(self, flow_id: str, timeout: float = 30.0, *, states: frozenset[FlowState] = STOPPED) -> FlowRecord:
        """Block until the flow is in one of ``states`` (finished or needing a person), or TimeoutError (which
        says when no worker's heartbeat is in this store: then no step of it runs at all)."""
        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            record = self.get(flow_id)
            if record.state in states:
                return record
            if time.monotonic() >= deadline:
                idle = "" if self.redis.exists(self.keys.heartbeat("worker")) else self._no_worker
                raise TimeoutError(f"flow {flow_id} still {record.state} at step {record.step} after {timeout}s{idle}")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.25)

    # -- the worker side ---------------------------------------------------------------------

    def run_step(
        self,
        flow_id: str,
        step_name: str,
        *,
        worker: str = "",
        chained_next: str | None = None,
        money: bool | None = None,
        follow: int = 0,
    ) -> str:
        """Claim, run and complete one step (``workflows.engine.protocol``). Returns what happened. ``money``:
        the caller knows whether the step's call moves money (its Celery task says which operation);
        ``follow``: then run up to that many of the flow's next steps that are due at once."""
        return self.protocol.run_step(flow_id, step_name, worker=worker, chained_next=chained_next, money=money, follow=follow)

    def claim(self, flow_id: str, step_name: str, *, worker: str = "") -> Claim | str:
        return self.protocol.claim(flow_id, step_name, worker=worker)

    def complete(self, claim: Claim, outcome: Outcome, *, chained_next: str | None = None) -> str:
        return self.protocol.complete(claim, outcome, chained_next=chained_next)

    def dispatch_due(self, *, batch: int | None = None) -> int:
        """Send every flow that is due (timers, retries, wait deadlines, lost links, dead workers)."""
        return self.protocol.dispatch_due(batch=batch)

    # -- shared by the API and the worker side ---------------------------------------------------

    @property
    def safety(self) -> float:
        """How long a flow whose step was just sent waits on the due set before the dispatcher sends it
        again: a lease when a sender delivers the step now, zero when only the dispatcher will."""
        return self.lease if self.sender is not None else 0.0

    def gateway(self, terminal: str = DEFAULT_TERMINAL) -> GatewayClient:
        """This process's gateway client of ``terminal`` (made after a fork, kept alive between calls): the
        one a flow's calls use is its own terminal's (``workflows.engine.terminals``), never another's."""
        return self.terminals.client(terminal)

    def flow_for_order(self, order_id: str) -> str | None:
        return self.orders.flow_for(order_id)

    def tokens_for_order(self, order_id: str) -> builtins.list[str]:
        return self.orders.tokens(order_id)
