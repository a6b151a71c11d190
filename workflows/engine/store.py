"""The flow record in Redis: the truth about every flow.

One hash per flow (fields below), an append-only log list, and per partition a ``due`` sorted set and
indexes by state and kind (see ``keys``). Every change is one Lua script: creation, a compare-and-set
transition guarded by the record's ``version``, signal delivery, and taking due entries. A stale
worker's write fails the version check and is dropped; nothing is half written.

Hash fields: ``id kind state step version attempt created updated due lease_until lease_owner
order_id order_seq start_key input_hash reconcile uncertain maybe_sent cancel_requested customer_url
polls generation runs`` as strings (``runs``: claims of the current step, the backstop under every loop;
``maybe_sent``: the latest moment an earlier try of the step may have sent a call it got no answer to),
``input error wait outcome orders ops unsettled ending`` as JSON (``orders``: every gateway order
id the flow made, oldest first; absent while it is only ``order_id``; ``ops``: every gateway operation
id it recorded, each with its lookup, see ``workflows.engine.orders.Lookups``; ``unsettled``: money in flight, the
money call a step may have sent, ``{step, op, t, operationId?}``, from its claim until a read of the
gateway settles it; ``ending``: the failure a flow owes once that read finds no money moved, see
``workflows.engine.inflight``), ``out:<step>`` (JSON) per
finished step and ``sig:<n>`` (JSON ``{name, payload, t}``) per received signal not yet consumed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import redis

from durapay.config.tracing import TRACE_FIELD
from durapay.workflows.engine.cards import CardVault, may_carry, presented
from durapay.workflows.engine.compact import is_chunk, joined, unpack
from durapay.workflows.engine.durability import Durability, NotDurable
from durapay.workflows.engine.fairness import TENANT_FIELD
from durapay.workflows.engine.jsonform import compact_sorted
from durapay.workflows.engine.keys import Keys
from durapay.workflows.engine.orders import Lookups
from durapay.workflows.engine.pins import Pins
from durapay.workflows.engine.scripts import MARKER, ScriptPipeline, assemble, register, request_token, source
from durapay.workflows.engine.sensitive import identifiers, mask, mask_text, scrub
from durapay.workflows.engine.states import TERMINAL, FlowState, IllegalTransition, can_move, lua_prelude


def _script(name: str) -> str:
    return source(f"engine/lua/{name}")


def compact_json(value: Any) -> str:
    """The one JSON form of everything the engine writes to Redis (compact, keys sorted; ``jsonform``)."""
    return compact_sorted(value)


def input_hash(kind: str, data: Mapping[str, Any], when: str = "") -> str:
    """What a start key promises: the same kind, input and start time (``NewFlow.when``) give the same
    flow; anything else is a StartConflict. Without a start time the hash is the input's alone."""
    return text_hash(kind, compact_json(data), when)


def text_hash(kind: str, text: str, when: str = "") -> str:
    """:func:`input_hash` of the input whose ``compact_json`` is ``text`` (a start serialises it once)."""
    hashed = f"{kind}\x1f{text}" + (f"\x1f{when}" if when else "")
    return hashlib.sha256(hashed.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Signal:
    field: str
    name: str
    payload: dict[str, Any]
    time: float


@dataclass
class FlowRecord:
    """One flow as read from Redis."""

    id: str
    kind: str
    state: FlowState
    step: str
    version: int
    attempt: int
    created: float
    updated: float
    input: dict[str, Any]
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    due: float | None = None
    lease_until: float | None = None
    lease_owner: str = ""
    order_id: str = ""
    order_seq: int = 0
    orders: list[str] = field(default_factory=list)
    start_key: str = ""
    reconcile: bool = False
    uncertain: bool = False
    maybe_sent: float | None = None
    cancel_requested: bool = False
    unsettled: dict[str, Any] | None = None
    ending: dict[str, Any] | None = None
    #: POSIX seconds: a finished flow is kept at least until then (its customer could still pay).
    keep_until: float = 0.0
    customer_url: str = ""
    polls: int = 0
    generation: int = 0
    error: dict[str, Any] | None = None
    wait: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    signals: list[Signal] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    #: The log entries a packed record carries (``workflows.engine.compact``); empty for a record not packed.
    packed_log: list[str] = field(default_factory=list, repr=False, compare=False)
    #: The state a claim took the flow from (``claim.lua``'s answer; "" for a record not read by a claim).
    claimed_from: str = field(default="", repr=False, compare=False)

    @property
    def packed(self) -> bool:
        return "z" in self.fields

    @property
    def terminal(self) -> str:
        """The gateway terminal the flow's calls use (``workflows.engine.terminals``; no field: ``default``)."""
        return self.fields.get("terminal") or "default"

    @classmethod
    def parse(cls, raw: Mapping[bytes, bytes]) -> FlowRecord:
        """A record as read from Redis, unpacked if it was packed (its plain fields win: they are newer)."""
        blob = joined(raw)
        if blob is None:
            return cls.from_fields({key.decode(): value.decode() for key, value in raw.items()})
        plain = {key.decode(): value.decode() for key, value in raw.items() if not is_chunk(key.decode())}
        cold, log = unpack(blob)
        record = cls.from_fields(cold | plain | {"z": "1"})
        record.packed_log = log
        return record

    @classmethod
    def from_fields(cls, data: dict[str, str]) -> FlowRecord:

        def number(name: str) -> float | None:
            value = data.get(name, "")
            return float(value) if value else None

        def loads(name: str) -> Any:
            value = data.get(name)
            return json.loads(value) if value else None

        outputs = {name[4:]: json.loads(value) for name, value in data.items() if name.startswith("out:")}
        signals = []
        for name, value in data.items():
            if name.startswith("sig:"):
                item = json.loads(value)
                signals.append(Signal(name, item["name"], item.get("payload") or {}, float(item.get("t", 0))))
        signals.sort(key=lambda s: int(s.field[4:]))
        return cls(
            id=data["id"],
            kind=data["kind"],
            state=FlowState(data["state"]),
            step=data.get("step", ""),
            version=int(data["version"]),
            attempt=int(data.get("attempt") or 0),
            created=float(data["created"]),
            updated=float(data.get("updated") or data["created"]),
            input=loads("input") or {},
            outputs=outputs,
            due=number("due"),
            lease_until=number("lease_until"),
            lease_owner=data.get("lease_owner", ""),
            order_id=data.get("order_id", ""),
            order_seq=int(data.get("order_seq") or 0),
            orders=loads("orders") or ([data["order_id"]] if data.get("order_id") else []),
            start_key=data.get("start_key", ""),
            reconcile=data.get("reconcile") == "1",
            uncertain=data.get("uncertain") == "1",
            maybe_sent=number("maybe_sent"),
            cancel_requested=data.get("cancel_requested") == "1",
            unsettled=loads("unsettled"),
            ending=loads("ending"),
            keep_until=number("keep_until") or 0.0,
            customer_url=data.get("customer_url", ""),
            polls=int(data.get("polls") or 0),
            generation=int(data.get("generation") or 0),
            error=loads("error"),
            wait=loads("wait"),
            outcome=loads("outcome"),
            signals=signals,
            fields=data,
        )

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def operations(self) -> list[str]:
        """The gateway operation ids the flow recorded (its ``op:`` lookups), oldest first."""
        return list(json.loads(self.fields.get("ops") or "[]"))

    @property
    def lookups(self) -> Lookups:
        """What names the flow from outside (orders, tokens, operations): they live as long as it does."""
        return Lookups(self.id, tuple(self.orders), tuple(self.operations))

    @property
    def identifiers(self) -> frozenset[str]:
        """The gateway operation ids the flow recorded, as a ``keep`` set (``sensitive.identifiers``):
        whole wherever its text names them (an error's message, a history entry), never masked as card
        numbers (one in ten is Luhn-valid). From the gateway's answers only, never the merchant's input."""
        return identifiers(self.operations)

    def shown(self) -> FlowRecord:
        """A copy fit to show (a console page): card data masked wherever it is (``workflows.engine.sensitive``),
        the flow's operation ids whole."""
        keep = self.identifiers
        return replace(
            self,
            input=mask(presented(self.input), keep),
            outputs=mask(self.outputs, keep),
            error=mask(self.error, keep),
            wait=mask(self.wait, keep),
            outcome=mask(self.outcome, keep),
            unsettled=mask(self.unsettled, keep),
            ending=mask(self.ending, keep),
            signals=[replace(signal, payload=mask(signal.payload, keep)) for signal in self.signals],
        )

    def summary(self) -> dict[str, Any]:
        """A JSON-able view of the record (API answers, CLI, the demo's table)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "state": self.state.value,
            "step": self.step,
            "version": self.version,
            "attempt": self.attempt,
            "created": self.created,
            "updated": self.updated,
            "due": self.due,
            "order_id": self.order_id,
            "customer_url": self.customer_url or None,
            "input": presented(self.input),  # sealed card data shown by its masked fields only
            "outputs": self.outputs,
            "error": self.error,
            "wait": self.wait,
            "outcome": self.outcome,
            "cancel_requested": self.cancel_requested,
            "unsettled": self.unsettled,
            "start_key": self.start_key or None,
        }


class StartConflict(Exception):
    """The start key was used before for another input: a second start must repeat the first exactly."""


class MoneyTaken(Exception):
    """A cancel of a flow whose payment succeeded, or whose money a step recorded taken (``money_moved``),
    refused by ``transition.lua``: its money moved."""

    def __init__(self, flow_id: str, operation_id: str) -> None:
        super().__init__(f"flow {flow_id}: the gateway took payment {operation_id}: a cancel cannot undo money taken")
        self.flow_id = flow_id
        self.operation_id = operation_id


class OrderHeld(Exception):
    """The gateway order id a start names is another flow's (its order lookup names that flow)."""

    def __init__(self, order_id: str, holder: str) -> None:
        super().__init__(f"order id {order_id} is flow {holder}'s")
        self.order_id = order_id
        self.holder = holder


class NotStarted(Exception):
    """A start whose create its caller's own script did not run (``FlowStore.create_many``'s ``write``: the
    scheduler's fire, whose schedule changed meanwhile): nothing of it was written."""

    def __init__(self, flow_id: str) -> None:
        super().__init__(f"flow {flow_id}: not created (the script that carried its create refused to write)")
        self.flow_id = flow_id


#: One create as a caller's own script carries it (``FlowStore.create_many``'s ``write``): its keys and
#: arguments as ``create.lua`` takes them, and the input hash of its start (a flow found existing with it is
#: this start's flow).
CreateCall = tuple[list[str], list[str], str]


@dataclass(frozen=True)
class NewFlow:
    """A flow to create: its id, kind, first step, input (as sent to the gateway), and how it starts."""

    flow_id: str
    kind: str
    first_step: str
    data: Mapping[str, Any]
    order_id: str = ""
    start_key: str = ""
    run_at: float | None = None
    #: The start time as the caller asked for it (``run_at``'s text: a delay such as ``in 2h`` is the same
    #: request when repeated later), part of what a start key must match.
    when: str = ""
    #: What started the flow and owns its retries (a schedule's id): an operator's restart is refused.
    owner: str = ""
    #: Why the flow was started, kept as the record's ``note`` (JSON): a late payment's refund keeps who
    #: asked for it and why, which its end writes into the refunded flow's history (``late_payments``).
    note: str = ""
    #: The flow's trace context (``config.tracing``): written only when tracing is on.
    trace: str = ""
    #: The definition it starts on, ``kind@version`` (``workflows.engine.versions``): its steps run on that one.
    definition: str = ""
    #: The merchant's tenant on a platform (``workflows.engine.fairness``): written only when a start set it.
    tenant: str = ""
    #: The gateway terminal its calls use (``workflows.engine.terminals``); "" is ``default``, not written.
    terminal: str = ""
    #: ``data``'s compact JSON (``compact_json``) when the start made it already ("": the store makes it).
    text: str = ""

    @property
    def promised(self) -> str:
        """What a start key must match besides kind and input: the start time as asked, and a terminal
        other than ``default`` (a key reused on another terminal is another request: a StartConflict)."""
        return self.when + (f"\x1eterminal={self.terminal}" if self.terminal and self.terminal != "default" else "")


class Created(NamedTuple):
    """What a create wrote: the flow (False: it existed with the same input), and the flow's order
    lookup (on a single server, when no flow held it; otherwise :meth:`OrderIndex.claim` decides)."""

    flow: bool
    order: bool


@dataclass(frozen=True)
class Change:
    """One transition to write: the new state, fields to set (``None`` deletes), the due time."""

    state: FlowState
    what: str
    fields: Mapping[str, str | None] = field(default_factory=dict)
    due: float | None = None
    awaited: tuple[str, ...] = ()
    step: str = ""
    #: The payment this change records (a step's adopted or answered charge): if a cancel request turns
    #: the change into a cancel, the flow needs a person instead (the money must show).
    paid: Mapping[str, Any] | None = None
    #: The gateway call this change completes (``op``, ``status``, ``ms``, ``reconcile``), kept in the
    #: log entry: the console draws the flow's timeline from it.
    call: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ClaimRequest:
    """What :meth:`FlowStore.claim` is asked (also the claim half of :meth:`FlowStore.transition_then_claim`)."""

    flow_id: str
    step: str
    now: float
    lease_until: float
    owner: str
    max_attempts: int
    max_runs: int
    durable: bool = False
    #: JSON {kind: operation} of the flow kinds whose step of this name moves money (claim.lua marks it
    #: unsettled), or "".
    money_ops: str = ""


@dataclass(frozen=True)
class _TransitionCall:
    """``transition.lua``'s keys and arguments for one change, and what the record is rebuilt from."""

    keys: list[str]
    args: list[str]
    fields: dict[str, str | None]
    scrubbed: str


def _taken(answer: Any) -> tuple[str, FlowRecord] | str:
    """``claim.lua``'s answer: why not, or the verdict and the record."""
    verdict = str(answer[0].decode())
    if len(answer) == 1:
        return verdict
    items = [item.decode() for item in answer[2:]]
    record = FlowRecord.from_fields(dict(zip(items[::2], items[1::2], strict=True)))
    record.claimed_from = answer[1].decode()
    return verdict, record


def _created_fields(args: Sequence[str]) -> dict[str, str]:
    """The fields ``create_flow.lua`` writes for a create's arguments: the ones every new record has, from
    the fixed arguments (its HSET, the one place they are made), then the name, value pairs passed."""
    flow_id, now, _, due = args[:4]
    fixed = {"id": flow_id, "version": "1", "attempt": "0", "created": now, "updated": now, "due": due}
    return fixed | dict(zip(args[5::2], args[6::2], strict=True))


class FlowStore:
    """Reads and atomically changes flow records. Give it a Redis client and the key layout."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        retention_seconds: float,
        durability: Durability | Callable[[], Durability] | None = None,
        *,
        events: bool = True,
        cards: CardVault | None = None,
    ) -> None:
        self.redis: Any = client
        #: Seals the card data of every input written (``workflows.engine.cards``): none reaches Redis in the clear.
        self.cards = cards or CardVault([])
        self.pins = Pins(client)
        self.events = "1" if events else ""
        self.keys = keys
        self.retention_seconds = retention_seconds
        self._durability: Durability | Callable[[], Durability] = durability or Durability()
        # Shared code is prepended: the states and their moves (generated from workflows/engine/states.py),
        # money.lua (one rule for payments reported), events.lua (the outbox).
        states, money, outbox = lua_prelude(), _script("money.lua"), _script("events.lua")
        inflight = _script("inflight.lua")  # money in flight as the scripts read it (workflows/engine/inflight.py's rule)
        # Each registered as workflows/engine/scripts.py classifies it: resent after a lost connection or not.
        self._create = register(client, "engine/lua/create.lua", assemble("engine/lua/create.lua"))  # (needs events.lua)
        self._transition = register(
            client, "engine/lua/transition.lua", states + money + outbox + inflight + _script("transition.lua")
        )
        self._signal = register(client, "engine/lua/signal.lua", states + money + outbox + _script("signal.lua"))
        self._take_due = register(client, "engine/lua/take_due.lua", _script("take_due.lua"))
        pause = _script("pause.lua")  # the one rule of a paused flow kind (workflows.pauses)
        self._claim = register(client, "engine/lua/claim.lua", states + pause + inflight + _script("claim.lua"))
        self.hold_script = register(client, "engine/lua/hold.lua", states + pause + _script("hold.lua"))
        self.release_script = register(client, "engine/lua/release.lua", states + pause + _script("release.lua"))
        #: How far a paused kind's due flow is moved each time it is met (``DURAPAY_PAUSE__RECHECK_SECONDS``).
        self.pause_recheck = 30.0
        #: What claim.lua's ARGV 10 says this process holds (``versions.held_text``; "": every definition).
        self.held_definitions: Callable[[], str] = lambda: ""
        #: Seconds after which a parked flow is offered again (``DURAPAY_ENGINE__PARK_SECONDS``).
        self.park_seconds = 30.0
        self._request_cancel = register(client, "engine/lua/request_cancel.lua", _script("request_cancel.lua"))
        self._renew = register(client, "engine/lua/renew.lua", _script("renew.lua"))
        self._keep = register(client, "engine/lua/keep.lua", _script("keep.lua"))
        self._expand = register(client, "engine/lua/expand.lua", _script("expand.lua"))
        self._keep_until = register(client, "engine/lua/keep_until.lua", states + _script("keep_until.lua"))
        self._mark = register(client, "engine/lua/mark.lua", _script("mark.lua"))
        self._marker = register(client, "marker", MARKER)

    # -- reading -------------------------------------------------------------------------------

    def get(self, flow_id: str) -> FlowRecord | None:
        raw: Any = self.redis.hgetall(self.keys.flow(flow_id))
        return FlowRecord.parse(raw) if raw else None

    def history(self, flow_id: str) -> list[dict[str, Any]]:
        """Every transition, oldest first (a packed record's log, then what was logged since), with the
        flow's reconciliation marks among them by time (``attention_entry``: not transitions)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.flow(flow_id))
        pipe.lrange(self.keys.log(flow_id), 0, -1)
        pipe.hgetall(self.keys.attention(flow_id))
        raw, entries, marks = pipe.execute()
        # Masked again on reading (entries logged before card numbers in free text were masked), the
        # flow's operation ids whole.
        keep = FlowRecord.parse(raw).identifiers if raw else frozenset()
        blob = joined(raw)
        packed = unpack(blob)[1] if blob else []
        logged = [mask(json.loads(item), keep) for item in [*packed, *entries]]
        if not marks:
            return logged
        noted = [attention_entry(mark) for mark in attention_marks(marks)]
        return sorted([*logged, *noted], key=lambda entry: float(entry.get("t") or 0.0))

    def marks(self, flow_id: str) -> list[dict[str, Any]]:
        """The flow's reconciliation marks, oldest first (``attention_marks``). Shown as the report shows
        them, not masked: a mark holds the gateway's operation fields (``judge.OPERATION_FIELDS``: no card
        data) and sentences about them; its operation ids (``named`` too) are identifiers, shown whole."""
        return attention_marks(self.redis.hgetall(self.keys.attention(flow_id)))

    def ids(
        self,
        *,
        state: FlowState | None = None,
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[tuple[float, str]]:
        """(time, id) pairs, newest first: by state (time = last change) or by kind (time = creation)."""
        found: list[tuple[float, str]] = []
        low = since if since is not None else "-inf"
        high = until if until is not None else "+inf"
        if state is None and kind is None:
            return found
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(self.keys.partitions):
            if state is not None:
                pipe.zrangebyscore(self.keys.by_state(partition, state.value), low, high, withscores=True)
            elif kind is not None:
                pipe.zrangebyscore(self.keys.by_kind(partition, kind), low, high, withscores=True)
        for members in pipe.execute():
            found += [(float(score), member.decode()) for member, score in members]
        found.sort(reverse=True)
        return found

    def all_ids(self, *, since: float | None = None) -> list[tuple[float, str]]:
        found: dict[str, float] = {}
        for state in FlowState:
            for when, flow_id in self.ids(state=state, since=since):
                found[flow_id] = when
        return sorted(((when, flow_id) for flow_id, when in found.items()), reverse=True)

    def many(self, flow_ids: Iterable[str]) -> list[FlowRecord]:
        pipe = self.redis.pipeline(transaction=False)
        wanted = list(flow_ids)
        for flow_id in wanted:
            pipe.hgetall(self.keys.flow(flow_id))
        return [FlowRecord.parse(raw) for raw in pipe.execute() if raw]

    # -- writing -------------------------------------------------------------------------------

    def create(self, new: NewFlow, *, now: float, by: str = "api", safety: float = 0.0) -> tuple[FlowRecord, Created]:
        """Create the flow ``ready`` and due now (or ``sleeping`` until ``run_at``); or return the
        existing one (``Created.flow`` False). ``safety`` delays the due entry of a flow whose first step
        is being sent right away, so the dispatcher only sends it if that message is lost. On a single
        server the same script points a free order lookup at the new flow (one round trip for both).

        Raises StartConflict when the flow exists with a different input (a start key reused), and
        OrderHeld (nothing written) when its order lookup names another flow.
        """
        keys, args, digests = self._create_call(new, now=now, by=by, safety=safety)
        for _ in range(2):
            outcome = self._created(new, digests, self._create(keys=keys, args=args))
            if isinstance(outcome, StartConflict | OrderHeld):
                raise outcome
            if outcome.flow:  # the script wrote exactly these fields: no need to read them back
                return FlowRecord.from_fields(_created_fields(args)), outcome
            record = self.get(new.flow_id)
            if record is not None:
                return record, outcome
            # The script found the flow and the read after it did not: a failover between the two
            # commands, to a node the record (never acknowledged durable) had not reached. Creating it
            # again is what this start asks; a second miss is a store still moving.
        raise NotDurable(f"start of flow {new.flow_id}: the store lost the flow between two reads (a failover); retry")

    def create_many(
        self,
        news: Sequence[NewFlow],
        *,
        now: float,
        by: str,
        safety: float = 0.0,
        write: Callable[[list[CreateCall]], Sequence[Any]] | None = None,
    ) -> list[Created | StartConflict | OrderHeld | NotStarted]:
        """:meth:`create` for many flows in one round trip (the scheduler's batches): per flow, what it
        wrote, or the StartConflict or OrderHeld it raised.

        ``write``: the creates are run by the caller's own scripts (the scheduler's fire on a single server:
        a schedule's change, its flows' creates and its mark in one script, ``create_flow.lua`` being the
        one home of the create): given every create's call, in order (called even with none), it answers
        each one's ``create.lua`` answer, or None where its script ran none (NotStarted: nothing written)."""
        calls = [self._create_call(new, now=now, by=by, safety=safety) for new in news]
        if write is not None:
            replies = list(write([(keys, args, digests[0]) for keys, args, digests in calls]))
        else:
            pipe = ScriptPipeline(self.redis)
            for keys, args, _ in calls:
                pipe.call(self._create, keys, args)
            replies = pipe.execute()
        return [
            NotStarted(new.flow_id) if reply is None else self._created(new, digests, reply)
            for new, (_, _, digests), reply in zip(news, calls, replies, strict=True)
        ]

    @staticmethod
    def _created(new: NewFlow, digests: Sequence[str], reply: Sequence[Any]) -> Created | StartConflict | OrderHeld:
        """``digests``: the input hashes a repeated start may match (``CardVault.digests``: one per card key)."""
        created, stored_hash, pointed = reply
        if created == 2:
            return OrderHeld(new.order_id, stored_hash.decode())
        if not created and stored_hash.decode() not in digests:
            return StartConflict(f"key {new.start_key or new.flow_id!r} was used to start a different {new.kind} flow")
        return Created(bool(created), bool(pointed))

    def _create_call(self, new: NewFlow, *, now: float, by: str, safety: float) -> tuple[list[str], list[str], list[str]]:
        run_at = new.run_at
        state = FlowState.SLEEPING if run_at is not None and run_at > now else FlowState.READY
        due = run_at if state is FlowState.SLEEPING and run_at is not None else now + safety
        # (id, version, attempt, created, updated and due the script writes from its fixed arguments.)
        fields: dict[str, str] = {"kind": new.kind, "state": state.value, "step": new.first_step}
        text = new.text or compact_json(new.data)
        if may_carry(text):
            # Card data sealed (CardKeyMissing, nothing written, when no key is configured).
            fields["input"] = compact_json(self.cards.seal(new.flow_id, new.data))
            digests = self.cards.digests(new.data, lambda data: input_hash(new.kind, data, new.promised))
        else:  # most inputs: no card to seal, the text written is the one hashed
            fields["input"] = text
            digests = [text_hash(new.kind, text, new.promised)]
        if new.order_id:
            fields["order_id"] = new.order_id
        if new.start_key:
            fields["start_key"] = new.start_key
        if new.owner:
            fields["owner"] = new.owner
        if new.note:
            fields["note"] = new.note
        if new.trace:
            fields[TRACE_FIELD] = new.trace
        if new.definition:
            fields["definition"] = new.definition
        if new.terminal and new.terminal != "default":
            fields["terminal"] = new.terminal  # one short field, only off the default terminal
        if new.tenant:
            fields[TENANT_FIELD] = new.tenant
        fields["input_hash"] = digests[0]
        what = "created" if state is FlowState.READY else "created to run later"
        entry = self._entry(now, None, state, new.first_step, by, what)
        partition = self.keys.partition(new.flow_id)
        keys = [
            self.keys.flow(new.flow_id),
            self.keys.log(new.flow_id),
            self.keys.due(partition),
            self.keys.by_state(partition, state.value),
            self.keys.by_kind(partition, new.kind),
            self.keys.events(partition),
        ]
        if new.order_id and not self.pins.cluster:
            keys.append(self.keys.order(new.order_id))
        # The fields as name, value pairs after the fixed arguments: the script writes them in one HSET.
        args = [new.flow_id, repr(now), entry, repr(due), self.events, *[part for pair in fields.items() for part in pair]]
        return keys, args, digests

    def transition(self, record: FlowRecord, change: Change, *, now: float, by: str) -> FlowRecord | None:
        """Write ``change`` if ``record`` is still current; None when another writer got there first.
        Raises MoneyTaken for a cancel of a flow whose money moved (its payment succeeded, or ``money_moved``)."""
        if record.packed and not self._unpack(record, now=now):
            return None
        call = self._transition_call(record, change, now=now, by=by)
        return self._written(record, change, call, self._transition(keys=call.keys, args=call.args), now=now)

    def transition_then_claim(
        self, record: FlowRecord, change: Change, claim: ClaimRequest, *, now: float, by: str
    ) -> tuple[FlowRecord | None, tuple[str, FlowRecord] | str]:
        """:meth:`transition`, then :meth:`claim` of the step it makes ready, in one round trip: a worker
        that follows a flow's steps completes one and takes the next without waiting for a second
        answer. Two scripts in one pipeline, each with its own rules and checks: when the completion
        is refused (stale) or moves the flow elsewhere, the claim finds that and says why not; when it
        claims anyway (another worker completed the step meanwhile), the claim is as valid as any.

        Only where :meth:`claims_with_transition` says so."""
        if record.packed or not self.claims_with_transition(claim):
            raise ValueError(f"flow {record.id}: the claim of {claim.step} cannot share the completion's round trip")
        call = self._transition_call(record, change, now=now, by=by)
        keys, args = self._claim_call(claim)
        pipe = ScriptPipeline(self.redis)
        pipe.call(self._transition, call.keys, call.args)
        pipe.call(self._claim, keys, args)
        written, answer = pipe.execute()
        taken = _taken(answer)
        if pipe.rerun[:1] == [0] and 1 not in pipe.rerun and isinstance(taken, str):
            # The server had lost transition.lua (a restart): the claim ran first and found the step
            # not yet ready. Now that the completion is written, the claim is made again.
            taken = _taken(self._claim(keys=keys, args=args))
        return self._written(record, change, call, written, now=now), taken

    def claims_with_transition(self, claim: ClaimRequest) -> bool:
        """Whether :meth:`transition_then_claim` may make ``claim``: on a single server (a cluster
        pipeline may split a moving slot's two scripts), and for a claim that needs no durability wait
        of its own (that wait must follow the claim's answer on a pinned connection)."""
        return not self.pins.cluster and not (claim.durable and self.durability.active)

    def keep_until(self, flow_id: str, until: float, *, now: float) -> int:
        """Keep a finished flow at least until ``until`` (a renewed link its customer can pay): written
        to the record as ``keep_until`` (the packing pass gives record and lookups their end from it), and
        a record that has its end already (packed) kept as long now. Returns the record's time to live in
        seconds then (0: it has no end, or is gone), what its lookups must have too (``keep_until.lua``)."""
        seconds = max(1, int(until - now) + 1)
        answer = self._keep_until(keys=[self.keys.flow(flow_id), self.keys.log(flow_id)], args=[repr(until), seconds * 1000])
        return -(-int(answer) // 1000)

    def mark(self, record: FlowRecord, name: str, value: Any) -> bool:
        """Record a person's decision on the flow as ``record`` shows it, its state left as it is
        (``mark.lua``: the version moves, so a decision read before it is refused). False when the flow
        changed since: the caller reads it again."""
        return bool(self._mark(keys=[self.keys.flow(record.id)], args=[str(record.version), name, compact_json(value)]))

    def _transition_call(self, record: FlowRecord, change: Change, *, now: float, by: str) -> _TransitionCall:
        if not can_move(record.state, change.state):
            raise IllegalTransition(record.state, change.state, record.id)
        partition = self.keys.partition(record.id)
        fields = dict(change.fields)
        # The request's token, written with the change: sent again after its answer was lost (a
        # failover), transition.lua recognises its own change by it instead of refusing it as stale.
        fields["treq"] = request_token()
        step = change.step or fields.get("step") or record.step
        clean = scrub(record.input)
        scrubbed = compact_json(clean) if clean != record.input else ""
        # A newly recorded operation gets its lookup (no expiry: it lives as long as the flow, see
        # workflows.engine.orders) and is listed in the record, so that its lookup expires with the record's.
        known = record.operations
        new = [operation_id for operation_id in operation_ids(fields) if operation_id not in known]
        if new:
            fields["ops"] = compact_json([*known, *new])
        # Text is masked where it is written (an error's message, a reason, the history's words), the
        # operation ids it is built from kept whole (workflows.engine.sensitive: they are identifiers).
        keep = identifiers([*known, *new])
        fields.update(_scrubbed_results(fields, keep, only=None if change.state in TERMINAL else ("error",)))
        entry = self._entry(now, record.state, change.state, step or "", by, change.what, change.call, keep=keep)
        operations = [self.keys.operation(partition, operation_id) for operation_id in new]
        keys = [
            self.keys.flow(record.id),
            self.keys.log(record.id),
            self.keys.due(partition),
            self.keys.by_state(partition, record.state.value),
            self.keys.by_state(partition, change.state.value),
            self.keys.by_state(partition, FlowState.READY.value),
            self.keys.by_state(partition, FlowState.CANCELLED.value),
            self.keys.by_state(partition, FlowState.NEEDS_ATTENTION.value),
            self.keys.events(partition),
            self.keys.finished(partition),
            self.keys.by_state(partition, FlowState.RETRYING.value),
            *operations,
        ]
        args = [
            record.id,
            str(record.version),
            change.state.value,
            compact_json(fields),
            "" if change.due is None else repr(change.due),
            entry,
            repr(now),
            compact_json(list(change.awaited)),
            scrubbed,
            self.events,
            compact_json(dict(change.paid)) if change.paid else "",
            record.state.value,
            "1" if record.cancel_requested else "",
        ]
        return _TransitionCall(keys, args, fields, scrubbed)

    def _written(
        self, record: FlowRecord, change: Change, call: _TransitionCall, answer: Any, *, now: float
    ) -> FlowRecord | None:
        """The record as ``transition.lua`` left it (None: refused as stale)."""
        version, final_state, rewritten = answer
        if version == -1:
            operation = rewritten.decode() if isinstance(rewritten, bytes) else str(rewritten)
            raise MoneyTaken(record.id, operation)
        if not version:
            return None
        state = final_state.decode() if isinstance(final_state, bytes) else str(final_state)
        if state != change.state.value or rewritten:
            # The script moved it elsewhere (a signal already there, a cancel request, money in flight, a
            # reported payment) or wrote fields of its own: read the record back (rare).
            return self.get(record.id)
        # The script applied exactly these changes: rebuild the record here instead of reading it back.
        data = dict(record.fields)
        for name, value in call.fields.items():
            if value is None:
                data.pop(name, None)
            else:
                data[name] = value
        if call.scrubbed and state in {s.value for s in TERMINAL}:
            data["input"] = call.scrubbed
        if state in {s.value for s in TERMINAL}:
            data.pop("cancel_requested", None)
        data.update({"state": state, "version": str(version), "updated": repr(now)})
        if change.due is None:
            data.pop("due", None)
        else:
            data["due"] = repr(change.due)
        return FlowRecord.from_fields(data)

    def _unpack(self, record: FlowRecord, *, now: float) -> bool:
        """Make a packed record plain again (same version) before a change that may delete fields, and
        list it for the packing pass again (``expand.lua``); False when it changed meanwhile."""
        fields = {name: value for name, value in record.fields.items() if not is_chunk(name)}
        answer = self._expand(
            keys=[self.keys.flow(record.id), self.keys.log(record.id), self.keys.finished(self.keys.partition(record.id))],
            args=[str(record.version), compact_json(fields), compact_json(record.packed_log), record.id, repr(now)],
        )
        if not answer:
            return False
        record.fields.pop("z", None)
        record.packed_log = []
        return True

    def claim(
        self,
        flow_id: str,
        step: str,
        *,
        now: float,
        lease_until: float,
        owner: str,
        max_attempts: int,
        max_runs: int,
        durable: bool = False,
        money_ops: str = "",
    ) -> tuple[str, FlowRecord] | str:
        """Claim ``step`` in one round trip (``claim.lua``, the one home of the claim rules).

        Returns why not (``missing``, ``not-current``, ``leased``, ``stopped``, ``early``), or
        ``(verdict, record)``: ``ok`` with the record as claimed, or ``cancel`` / ``lost`` /
        ``looping`` with the record untouched (a cancel was requested; the step's worker was lost
        ``max_attempts`` times; the step was claimed ``max_runs`` times without moving on), which the
        caller ends with :meth:`transition`.

        ``durable``: the step moves money, so a claim must be durable before it runs: the claim and the
        durability wait share one connection (two round trips in all); NotDurable when it is not."""
        request = ClaimRequest(flow_id, step, now, lease_until, owner, max_attempts, max_runs, durable, money_ops)
        keys, args = self._claim_call(request)
        if durable and self.durability.active:
            answer, pinned = self.pins.script(self._claim, keys, args)
            if answer[0] == b"ok":
                self.durability.wait(pinned, f"claim of {step} of flow {flow_id}")
        else:
            answer = self._claim(keys=keys, args=args)
        return _taken(answer)

    def _claim_call(self, request: ClaimRequest) -> tuple[list[str], list[str]]:
        partition = self.keys.partition(request.flow_id)
        states = (FlowState.READY, FlowState.RETRYING, FlowState.WAITING, FlowState.SLEEPING, FlowState.RUNNING)
        keys = [self.keys.flow(request.flow_id), self.keys.log(request.flow_id), self.keys.due(partition)]
        keys += [self.keys.by_state(partition, state.value) for state in states]
        keys += [self.keys.paused(partition), self.keys.held(partition), self.keys.by_state(partition, FlowState.PARKED.value)]
        args = [
            request.flow_id,
            request.step,
            repr(request.now),
            repr(request.lease_until),
            request.owner,
            str(request.max_attempts),
            str(request.max_runs),
            request.money_ops,
            repr(self.pause_recheck),
            self.held_definitions(),
            repr(self.park_seconds),
        ]
        return keys, args

    def renew(self, record: FlowRecord, *, lease_until: float) -> bool:
        """Extend the lease of ``record``'s claim (as claimed: its version and owner); False once the claim
        is no longer this worker's."""
        answer = self._renew(
            keys=[self.keys.flow(record.id), self.keys.due(self.keys.partition(record.id))],
            args=[record.id, str(record.version), record.lease_owner, repr(lease_until)],
        )
        return bool(answer)

    def drop_field(self, flow_id: str, name: str) -> None:
        """Remove one field of a record as it stands, its version unmoved: a mark whose job is done (a tell
        owed, ``workflows.engine.holders``), which a writer that read it before may still see, harmlessly.
        Nothing is written to a record that is gone or packed (the field is then not a plain one)."""
        self.redis.hdel(self.keys.flow(flow_id), name)

    def keep_output(self, record: FlowRecord, name: str, output: Mapping[str, Any]) -> dict[str, Any] | None:
        """Keep a merchant step's output under the record's field ``name`` while ``record``'s claim is this
        worker's (``engine/lua/keep.lua``): the output kept (an earlier try's, if one kept it first), or None when
        the claim is no longer this worker's."""
        kept = self._keep(
            keys=[self.keys.flow(record.id)], args=[str(record.version), record.lease_owner, name, compact_json(output)]
        )
        if kept is None:
            return None
        value: dict[str, Any] = json.loads(kept)
        return value

    def sync(self, ids: str | Iterable[str], what: str, *, orders: Iterable[str] = (), targets: Iterable[str] = ()) -> None:
        """Return once every write so far is durable as configured (see ``workflows.engine.durability``), or
        raise NotDurable. The marker written to get there sits in the partition (the slot) of the flows
        ``ids`` (and of the order lookups of ``orders``, the gateway targets of ``targets``:
        ``workflows.engine.targets``), so on a cluster it reaches the node that holds them; for several, one
        marker and one wait per node (on a single server: one in all).

        On a cluster the marker is written by a script that also names the flow's (or lookup's) own key:
        while its slot is being moved, the write then lands where that key is (``TRYAGAIN`` until both
        are on one side), never on the node the record has already left."""
        if not self.durability.active:
            return
        flows = [ids] if isinstance(ids, str) else list(ids)
        anchors = [(self.keys.partition(flow_id), self.keys.flow(flow_id)) for flow_id in flows]
        anchors += [(self.keys.partition(order_id), self.keys.order(order_id)) for order_id in orders]
        anchors += [(self.keys.partition(target), self.keys.target(target)) for target in targets]
        if not anchors:
            return
        if not self.pins.cluster:
            marker = f"{self.keys.prefix}:sync"
            _, pinned = self.pins.run(marker, _marker_write(marker), resend=True)  # a plain overwrite
            self.durability.wait(pinned, what)
            return
        by_slot = {f"{self.keys.tag(partition)}:sync": anchor for partition, anchor in anchors}
        seen: set[str] = set()
        for marker, anchor in sorted(by_slot.items()):
            node = self.redis.get_node_from_key(marker).name
            if node in seen:
                continue
            seen.add(node)
            _, pinned = self.pins.script(self._marker, [marker, anchor], [])
            self.durability.wait(pinned, what)

    @property
    def durability(self) -> Durability:
        """What to wait for, decided at the first need (the server must answer to tell its persistence)."""
        if not isinstance(self._durability, Durability):
            self._durability = self._durability()
        return self._durability

    def request_cancel(self, flow_id: str, version: int) -> bool:
        """Ask a running step's flow to stop at the step boundary (no version change: the step completes).
        False when the flow is not running at ``version`` any more (the step completed meanwhile, or the
        record expired): the caller reads it again and cancels what it finds."""
        return bool(self._request_cancel(keys=[self.keys.flow(flow_id)], args=[str(version)]))

    def signal(
        self,
        flow_id: str,
        name: str,
        payload: Mapping[str, Any],
        *,
        now: float,
        by: str,
        safety: float = 0.0,
        paid: Mapping[str, Any] | None = None,
        keep_until: float | None = None,
    ) -> str:
        """Deliver a signal: ``resumed``, ``stored`` (kept until the flow waits for it), ``finished``,
        ``late_payment`` (the flow ended without the payment ``paid`` reports: now needs a person),
        ``missing``. ``keep_until``: kept with the signal; a completion that ends the flow before its step
        reads it keeps the flow until then (transition.lua)."""
        partition = self.keys.partition(flow_id)
        by = mask_text(by)  # who, as written: a person's name may hold a card number (workflows.engine.sensitive)
        entry = self._entry(now, FlowState.WAITING, FlowState.READY, "", by, f"signal {name}")
        signal: dict[str, Any] = {"name": name, "payload": dict(payload), "t": now}
        if paid:
            signal["paid"] = dict(paid)
        if keep_until is not None:
            signal["keep_until"] = keep_until
        states = (FlowState.WAITING, FlowState.READY, FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED)
        keys = [self.keys.flow(flow_id), self.keys.log(flow_id), self.keys.due(partition)]
        keys += [self.keys.by_state(partition, state.value) for state in (*states, FlowState.NEEDS_ATTENTION)]
        keys += [self.keys.events(partition)]
        # The request's token: sent again after its answer was lost, signal.lua answers as it did first.
        args = [flow_id, name, compact_json(signal), repr(now), entry, repr(now + safety), by, self.events, request_token()]
        for _ in range(3):
            answer = self._signal(keys=keys, args=args)
            result = answer.decode() if isinstance(answer, bytes) else str(answer)
            if result != "packed":
                return result
            # A finished flow, compacted: made plain again first, so the script reads every field (its
            # signals and their numbering, its order id and step for the events) as written.
            record = self.get(flow_id)
            if record is not None and record.packed:
                self._unpack(record, now=now)
        raise RuntimeError(f"flow {flow_id}: the signal found the record packed again and again")

    def take_due(self, partition: int, *, now: float, batch: int, grace: float) -> list[str]:
        ids = self._take_due(keys=[self.keys.due(partition)], args=[repr(now), batch, repr(grace)])
        return [flow_id.decode() for flow_id in ids]

    def take_due_all(self, *, now: float, batch: int, grace: float) -> list[str]:
        """:meth:`take_due` of every partition in one pipeline (on a cluster: one round trip per node),
        so that a dispatcher's tick costs about the same whatever the number of partitions."""
        pipe = ScriptPipeline(self.redis)
        for partition in range(self.keys.partitions):
            pipe.call(self._take_due, [self.keys.due(partition)], [repr(now), batch, repr(grace)])
        return [flow_id.decode() for ids in pipe.execute() for flow_id in ids]

    def next_due(self) -> float | None:
        """The earliest due time over all partitions (for the dispatcher's sleep and for tests)."""
        earliest: float | None = None
        for partition in range(self.keys.partitions):
            first = self.redis.zrange(self.keys.due(partition), 0, 0, withscores=True)
            if first:
                score = float(first[0][1])
                earliest = score if earliest is None else min(earliest, score)
        return earliest

    def flow_for_operation(self, operation_id: str) -> str | None:
        """The flow that recorded gateway operation ``operation_id`` (one lookup per partition), if kept."""
        pipe = self.redis.pipeline(transaction=False)
        for partition in range(self.keys.partitions):
            pipe.get(self.keys.operation(partition, operation_id))
        found = [value for value in pipe.execute() if value]
        return found[0].decode() if found else None

    @staticmethod
    def _entry(
        now: float,
        source: FlowState | None,
        target: FlowState,
        step: str,
        by: str,
        what: str,
        call: Mapping[str, Any] | None = None,
        *,
        keep: frozenset[str] = frozenset(),
    ) -> str:
        entry: dict[str, Any] = {
            "t": now,
            "from": source.value if source else None,
            "to": target.value,
            "step": step,
            # A person's name and reason may hold a card number: never logged whole; the flow's operation
            # ids (``keep``) are identifiers and stay whole.
            "by": mask_text(by),
            "what": mask_text(what, keep),
        }
        if call:
            entry["call"] = mask(dict(call), keep)
        return compact_json(entry)


def attention_marks(raw: Mapping[bytes, bytes]) -> list[dict[str, Any]]:
    """A flow's reconciliation marks (the hash at ``Keys.attention``, written by
    ``workflows.reconciliation.report.Reports.mark``), oldest first."""
    return sorted((json.loads(value) for value in raw.values()), key=lambda mark: float(mark.get("time") or 0.0))


def attention_entry(mark: Mapping[str, Any]) -> dict[str, Any]:
    """A mark as its flow's history shows it: by ``reconcile``, when it was found, and no ``from``/``to``:
    it is not a transition (the flow's state and money are as they were; docs/operations.md)."""
    title = mark.get("title") or str(mark.get("category") or "").replace("_", " ")
    return {
        "t": float(mark.get("time") or 0.0),
        "by": "reconcile",
        "what": f"reconciliation {mark.get('report')}: {title}: {mark.get('what')}",
        "attention": dict(mark),
    }


def _scrubbed_results(
    fields: Mapping[str, str | None], keep: frozenset[str] = frozenset(), *, only: tuple[str, ...] | None = None
) -> dict[str, str]:
    """The outputs, outcome and error a flow's change writes (``only``: just these; every change's error,
    the last change's all), card numbers masked (a gateway answer echoing a description, a person's
    reason, an error's message), the operation ids ``keep`` whole: only those that change. Written with
    the transition, so the events ``events.lua`` makes of them are masked too. Only the change's own
    fields: rewriting older ones would change what ``transition.lua`` decides on."""
    rewritten: dict[str, str] = {}
    for name, value in fields.items():
        if only is not None and name not in only:
            continue
        if value and (name.startswith("out:") or name in ("outcome", "error")):
            before = json.loads(value)
            clean = scrub(before, keep)
            if clean != before:
                rewritten[name] = compact_json(clean)
    return rewritten


def operation_ids(fields: Mapping[str, str | None]) -> list[str]:
    """The gateway operation ids a change's fields record (a step's output, the outcome, an error)."""
    found: list[str] = []

    def note(value: Any) -> None:
        if isinstance(value, str | int) and str(value) and str(value) not in found and len(str(value)) <= 200:
            found.append(str(value))

    for name, raw in fields.items():
        if raw is None or not (name.startswith("out:") or name in {"outcome", "error"}):
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        note(value.get("operationId"))
        inner = value.get("operation")
        if isinstance(inner, dict):
            note(inner.get("operationId"))
        for item in value.get("operationIds") or []:
            note(item)
    return found


def _marker_write(key: str) -> Callable[[Any], Any]:
    """The small write whose durability covers every earlier write of its node (``FlowStore.sync``)."""
    return lambda client: client.set(key, "1")
