"""A model of whole flows: the real engine, the real simulator and a real Valkey, stepped by a test.

``test_flow_model.py`` lets Hypothesis choose what happens next; this module is the world it acts on:

* **Valkey** (``aof_tail.py``) runs with ``appendfsync always``; losing a tail of its writes (a host
  crash inside ``everysec``'s second, a failover) is an AOF cut and a restart, never below a write the
  engine waited on (``WAITAOF``).
* **Celery** is :class:`Messages`: the chains the engine sends, delivered when the test says, once,
  twice (a redelivery) or never (a lost message). Deliveries run the real worker path
  (``Engine.run_step`` with the task's ``money`` flag); a *kill* claims and runs a step, calls the
  gateway, and never completes (a worker SIGKILLed after the call).
* **The gateway** is the simulator over HTTP, its faults set per request (commit then fail, 429,
  5xx, a request that acts late: at a later move, before time moves on), its ledger the truth the
  invariants are checked against; its clock moves with the engine's.
* **Notifications** are the simulator's own bodies, delivered through the real
  ``NotificationReceiver`` (token check, deduplication), any number of times, in any order.

The invariants (:meth:`FlowWorld.check_always`, :meth:`FlowWorld.check_settled`): money at the
gateway shows in its flow (``succeeded`` naming it, or ``needs_attention`` naming it); at most one
charge per flow and per schedule occurrence, ever; an unfinished flow always has a due entry; and
:meth:`FlowWorld.settle` reaches quiescence within a bounded number of steps (every loop ends).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from hypothesis import HealthCheck, settings

from durapay.config import load_settings
from durapay.gateway import CATALOGUE, Catalogue, PayByLinkRenewRequest
from durapay.service.receiver import NotificationReceiver
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.tasks.runner import LeaseLost
from durapay.workflows.engine import Claim, Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.compact import Compactor
from durapay.workflows.engine.protocol import Ran
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from durapay.workflows.flows import REGISTRY
from durapay.workflows.late_payments import REFUND_KEY
from durapay.workflows.schedules import Schedules
from tests.workflows import model_checks
from tests.workflows.aof_tail import AofTail, FloorDurability
from tests.workflows.model_kinds import APPROVE, MOVED, POST_TYPES, Inputs, ModelFlow, card, now_of, owner_of, session

#: Whether a step's task writes at the gateway (its claim is then made durable), as the Celery task says.
MONEY = {op.task_name: op.method == "POST" for op in CATALOGUE}
#: A move of time this long ages what Redis keeps with a TTL (``FlowWorld.age_redis``).
AGES_REDIS = 86400.0
LIVE = {FlowState.READY, FlowState.RETRYING, FlowState.WAITING, FlowState.SLEEPING, FlowState.RUNNING}


# -- Celery ----------------------------------------------------------------------------------


class Messages:
    """Stands in for Celery: the chains the engine sent, delivered when the test says."""

    def __init__(self) -> None:
        self.chains: list[tuple[str, list[tuple[str, str]]]] = []

    def send(self, task_name: str, flow_id: str, step: str) -> None:
        self.chains.append((flow_id, [(task_name, step)]))

    def send_chain(self, flow_id: str, links: list[tuple[str, str]]) -> None:
        if links:
            self.chains.append((flow_id, list(links)))


# -- the world -------------------------------------------------------------------------------


@dataclass
class FlowWorld:
    """The engine, simulator, Valkey and messages of one example, and the invariants over them."""

    sim: SimulatorServer
    tail: AofTail
    example: int
    engine: Engine = field(init=False)
    clock: ManualClock = field(init=False)
    messages: Messages = field(init=False)
    receiver: NotificationReceiver = field(init=False)
    flows: list[ModelFlow] = field(default_factory=list)
    schedules: Schedules = field(init=False)
    schedule_ids: list[str] = field(default_factory=list)
    contract: str = ""
    inputs: Inputs = field(init=False)
    shown: set[str] = field(default_factory=set)  # orders whose page URL the merchant was shown
    held: list[tuple[Claim, Ran]] = field(default_factory=list)
    steps: int = 0
    cuts: int = 0
    retention_runs: int = 0
    ids: Iterator[int] = field(default_factory=lambda: iter(range(10_000)))

    def __post_init__(self) -> None:
        self.sim.admin.reset()
        self.sim.admin.clear_faults()
        client = redis.Redis.from_url(self.tail.server.url)
        client.flushall()
        self.tail.mark_durable()
        settings = load_settings(
            {
                "gateway": {"base_url": self.sim.base_url, "timeout": 5.0, "connect_timeout": 2.0},
                "engine": {"key_prefix": "m", "lease_seconds": 30, "partitions": 2},
                "retry": {"base_seconds": 1, "cap_seconds": 10, "max_attempts": 3, "reconcile_attempts": 3},
                "receiver": {"public_url": "http://127.0.0.1:9/notifications"},
                # Each flow meets a 429 alone, as the model's retries expect (the breaker stays on).
                "gateway_health": {"limiter": False},
            }
        )
        self.clock = ManualClock(self.sim.admin.now().timestamp())
        self.messages = Messages()
        rng = random.Random(0)  # retry jitter, the same in every replay
        self.engine = Engine(settings, client, REGISTRY, sender=self.messages, clock=self.clock, rng=rng)
        self.engine.store._durability = FloorDurability(aof=True, timeout_ms=2000, tail=self.tail)
        self.receiver = NotificationReceiver(self.engine, settings.receiver)
        self.schedules = Schedules(self.engine)
        self.contract = self.make_contract()
        self.inputs = Inputs(self.engine.gateway(), self.sim.admin, self.example, now_of(self.clock.now()), self.contract)

    def close(self) -> None:
        self.engine.redis.close()
        self.engine.gateway().close()

    # -- acting ----------------------------------------------------------------------------------

    def start(self, kind: str, variant: str) -> ModelFlow:
        """Start a flow of a model kind (``model_kinds.KINDS``); what it acts on is made first, outside it."""
        base = f"m{self.example}x{next(self.ids):02d}"
        engine_kind, data, flow = self.inputs.start(kind, variant, base)
        record = self.engine.start(engine_kind, data, key=flow.base)  # keyed: the same id (and partition) in every replay
        flow.flow_id = record.id
        self.flows.append(flow)
        return flow

    def start_flow(self, kind: str, data: dict[str, Any], *, key: str) -> ModelFlow:
        """Start a flow of any kind with ``data``; its base order id is its input's (the key otherwise)."""
        record = self.engine.start(kind, data, key=key)
        flow = ModelFlow(record.id, kind, record.order_id or key)
        if kind in POST_TYPES and "operationId" in data:
            flow.pool = str(data["operationId"])
        self.flows.append(flow)
        return flow

    @staticmethod
    def hpp_input(order_id: str) -> dict[str, Any]:
        return {
            "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
            "paymentSession": session(),
            "waitSeconds": 600,
        }

    def compactor(self) -> Compactor:
        return Compactor(self.engine.redis, self.engine.keys, self.engine.orders, tell=self.engine.tell_holder, delay=0.0)

    def compact(self) -> int:
        """Pack every finished flow now (the dispatcher does it a second after a flow ends)."""
        return self.compactor().run(now=self.clock.now() + 1)

    def make_contract(self) -> str:
        """A MIT_SCHEDULED contract, made by a first three-step payment outside any flow (before any fault)."""
        contract = f"ctr{self.example}"
        order = {"orderId": f"k{self.example}", "amount": "100", "currency": "EUR"}
        recurrence = {"action": "CONTRACT_CREATION", "contractId": contract, "contractType": "MIT_SCHEDULED"}
        client = self.engine.gateway()
        init = client.call(Catalogue.three_steps_init, request={"order": order, "card": card(APPROVE), "recurrence": recurrence})
        payment = {"operationId": init.operation.operationId, "order": order, "card": card(APPROVE), "recurrence": recurrence}
        client.call(Catalogue.three_steps_payment, request=payment)
        return contract

    def create_schedule(self) -> str:
        """A daily charge of the contract: four occurrences, every missed one fired, dunning after 1 and
        2 days."""
        start = datetime.fromtimestamp(self.clock.now() + 60, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        spec = {
            "contractId": self.contract,
            "amount": 1500,
            "currency": "EUR",
            "description": "model",
            "rule": {"every": "days", "interval": 1},
            "start": start,
            "count": 4,
            "missed": "each",
            "dunning": [1, 2],
        }
        created = self.schedules.create(spec, key=f"{self.contract}-{len(self.schedule_ids)}")
        self.schedule_ids.append(created.id)
        return created.id

    def deliver(self, index: int, *, again: bool = False, follow: int = 0) -> str:
        """Celery runs the first link of a chain (``again``: the message stays, to be delivered again;
        ``follow``: the worker goes on with the flow's next steps due at once, as workers do by default)."""
        flow_id, links = self.messages.chains[index] if again else self.messages.chains.pop(index)
        (task, step), rest = links[0], links[1:]
        self.steps += 1
        result = self.engine.run_step(
            flow_id, step, worker="w1", chained_next=rest[0][1] if rest else None, money=MONEY.get(task, False), follow=follow
        )
        if rest:
            self.messages.chains.append((flow_id, rest))
        return result

    def begin_step(self, flow: ModelFlow, worker: str = "slow") -> str:
        """A worker claims the flow's current step and runs it (the gateway acts), but does not complete
        it yet: the completion is held for :meth:`finish_step` (a slow worker) or dropped (a killed one),
        and anything may happen in between."""
        record = self.engine.store.get(flow.flow_id)
        if record is None or record.state not in LIVE:
            return "nothing to run"
        definition = self.engine.registry[record.kind]
        money = MONEY.get(definition.step(record.step).task_name, False)
        claim = self.engine.protocol.claim(flow.flow_id, record.step, worker=worker, money=money)
        if not isinstance(claim, Claim):
            return claim
        self.steps += 1
        try:
            ran = self.engine.protocol.run(claim)
        except LeaseLost:
            return "lease lost"
        self.held.append((claim, ran))
        return "held"

    def finish_step(self, index: int) -> str:
        """The slow worker completes (as ``StepProtocol.run_step`` would; refused if it is stale by now)."""
        claim, ran = self.held.pop(index)
        return self.engine.protocol.finish(claim, ran)[0]

    def pay_page(self, flow: ModelFlow, order_id: str, *, abandon: bool, pending: bool = False) -> None:
        """The customer pays (or abandons) the page of ``order_id`` they were given: a hosted page, a link,
        or an embedded form (whose page then tells the merchant, who signals ``form_completed``), whenever
        they like: also after the flow ended, or its record expired (they still have the page).
        ``pending``: the payment is answered PENDING (an APM) and settles at a later move."""
        admin = self.sim.admin
        kind, ref = flow.pages[order_id]
        if pending and not abandon:
            admin.pend("page_payment", final="000")
        if kind == "hpp":
            admin.complete_hpp(ref, cancel=abandon)
        elif kind == "paybylink":
            admin.complete_link(ref, cancel=abandon)
        elif kind == "build" and not abandon:
            admin.fill_build_form(ref)
            if not flow.expired:
                self.engine.signal(flow.flow_id, "form_completed", {})

    def renew(self, flow: ModelFlow, days: int, *, own: bool) -> None:
        """The merchant renews the flow's link ``days`` ahead: with durapay's ``paybylink_renew`` (run
        here, as a worker would), or elsewhere (the flow sees it at its deadline read)."""
        links = [ref for kind, ref in flow.pages.values() if kind == "paybylink"]
        if not links:
            return
        day = now_of(self.clock.now() + days * 86400).strftime("%Y-%m-%d")
        if own:
            started = self.engine.start("paybylink_renew", {"linkId": links[-1], "expirationDate": day})
            self.engine.run_step(started.id, "renew")
        else:
            body = PayByLinkRenewRequest(expirationDate=day).wire()
            self.engine.gateway().call(Catalogue.renew_paybylink, links[-1], request=body)

    def kill_mid_step(self, flow: ModelFlow) -> str:
        """A worker claims the flow's current step, runs it (the gateway acts), and dies before completing."""
        began = self.begin_step(flow, worker="doomed")
        if began == "held":
            self.held.pop()
            return "killed"
        return began

    def advance(self, seconds: float, *, release: bool = True) -> None:
        """Move time on. A request the gateway got late (a ``late`` fault) acts first: the gateway acts
        on a request within ``late_seconds`` of it being sent, or never, and the model's moves of
        time are as long as that, or longer (``release`` False: never)."""
        if release:
            self.sim.admin.release_late()
        if seconds >= AGES_REDIS:
            self.compact()  # the dispatcher's pass, a second after each flow ends, gives finished flows their end
        self.clock.advance(seconds)
        self.sim.admin.advance_clock(seconds)
        if seconds >= AGES_REDIS:
            self.age_redis(seconds)

    def lose_tail(self, commands: int) -> int:
        lost = self.tail.cut(commands)
        self.cuts += 1
        self.engine.redis.connection_pool.disconnect()
        return lost

    def notifications(self, flow: ModelFlow) -> list[dict[str, Any]]:
        return [n for n in self.sim.admin.notifications() if n["orderId"] == flow.base or n["orderId"] in flow.orders]

    def notify(self, body: dict[str, Any]) -> int:
        return self.receiver.receive(json.dumps(body).encode()).status

    def expire_retention(self) -> None:
        """Jump past the retention time: what Redis keeps with a TTL shorter than that is gone (finished
        flows, their logs and order lookups, the receiver's seen event ids); what must live longer (a
        flow whose link can still be paid) is older by as much."""
        self.retention_runs += 1
        self.advance(self.engine.settings.engine.retention + 60)

    def age_redis(self, seconds: float) -> None:
        """Time passes for Redis too: keys whose TTL runs out within ``seconds`` are gone, the others'
        TTLs shorter by as much (the model's clock is not the server's)."""
        client = self.engine.redis
        self.discover()  # every order id each flow made, before its record may go
        money = self.money()
        for key in client.scan_iter(count=1000):
            ttl = client.pttl(key)
            if ttl < 0:
                continue
            if ttl <= seconds * 1000:
                client.delete(key)
            else:
                client.pexpire(key, int(ttl - seconds * 1000))
        for flow in self.flows:
            if not flow.expired and client.exists(self.engine.keys.flow(flow.flow_id)) == 0:
                flow.expired = True
                flow.charges_at_expiry = len([op for op in money if flow.owns(op)])

    # -- reading ---------------------------------------------------------------------------------

    def record(self, flow: ModelFlow) -> FlowRecord | None:
        return self.engine.store.get(flow.flow_id)

    def money(self) -> list[dict[str, Any]]:
        """Every operation at the gateway that moved money."""
        return [op for op in self.sim.admin.operations() if op["operationResult"] in MOVED]

    def discover(self) -> None:
        """Add the flows the schedules started (MIT charges) to the model's flows, and learn every order id
        each flow made (a derived one is the flow's from the moment its record names it)."""
        known = {flow.flow_id for flow in self.flows}
        for record in self.engine.list(kind="mit", limit=1000):
            if record.id not in known:
                self.flows.append(ModelFlow(record.id, "mit", record.order_id, scheduled=True))
        for record in self.engine.list(kind="refund", limit=1000):  # an operator's refund of a late payment
            if record.id not in known and record.start_key.startswith(REFUND_KEY):
                self.flows.append(
                    ModelFlow(record.id, "refund", record.start_key, pool=str(record.input["operationId"]), scheduled=True)
                )
        for flow in self.flows:
            seen = None if flow.expired else self.record(flow)
            if seen is not None:
                flow.orders.update(seen.orders)

    def charges_by_flow(self) -> dict[str, list[dict[str, Any]]]:
        """The money moved at the gateway, by the flow it belongs to (each has one: ``model_kinds``)."""
        self.discover()
        found: dict[str, list[dict[str, Any]]] = {}
        for op in self.money():
            owner = owner_of(self.flows, op)
            if owner is None:
                # Made outside any flow (orders k...: what refund, capture and charge flows act on).
                assert op["orderId"].startswith("k"), f"money on an order no flow of the model made: {op}"
                continue
            found.setdefault(owner.flow_id, []).append(op)
        return found

    def live(self) -> list[ModelFlow]:
        self.discover()
        return [flow for flow in self.flows if not flow.expired and (self.record(flow) or _gone()).state in LIVE]

    def settle(self, limit: int = 800, *, release: bool = True, stalled: Callable[[list[ModelFlow]], bool] | None = None) -> int:
        """Deliver, dispatch, tick the schedules and move time on until every flow is stopped and no
        schedule has anything left to fire; the moves it took. Every notification the gateway made is
        delivered again first (the gateway retries until answered), after any request still held late
        (``release`` False: those never act, as a request the gateway dropped). ``stalled``: whether the
        flows still live can only go on once a person acts (they wait for a flow stopped for a person)."""
        if release:
            self.sim.admin.release_late()
        self.sim.admin.settle_pending()  # the gateway settles what it answered PENDING, in time
        for flow in self.flows:
            for note in self.notifications(flow):
                if not flow.expired:
                    self.notify(note["body"])
        while self.held:
            self.finish_step(0)
        for taken in range(limit):
            if self.messages.chains:
                self.deliver(0)
                continue
            if self.engine.dispatch_due() or self.schedules.tick():
                continue
            due = [at for at in (self.engine.store.next_due(), self.schedules.store.next_due()) if at is not None]
            live = self.live()
            if (not live or (stalled is not None and stalled(live))) and not self.schedules.store.next_due():
                return taken
            assert due, f"live flows {[flow.flow_id for flow in self.live()]} and nothing due"
            self.sim.admin.settle_pending()  # answered PENDING during the settling: final by the next read
            self.advance(max(min(due) - self.clock.now(), 0.0) + 0.001, release=release)
        raise AssertionError(f"not settled after {limit} moves: {[self.describe(flow) for flow in self.flows]}")

    def describe(self, flow: ModelFlow) -> dict[str, Any]:
        record = self.record(flow)
        if record is None:
            return {"flow": flow.flow_id, "expired": flow.expired}
        return {**record.summary(), "history": self.engine.store.history(flow.flow_id)}

    # -- invariants (tests/workflows/model_checks.py) ---------------------------------------------

    def check_always(self) -> None:
        """What holds after every move (``model_checks.check_always``)."""
        model_checks.check_always(self)

    def check_settled(self) -> list[ModelFlow]:
        """What holds once settled; the flows a person must retry (``model_checks.check_settled``)."""
        return model_checks.check_settled(self)

    def check_retried(self, unnamed: list[ModelFlow]) -> None:
        """An operator retries the flows that could not tell whether their call took effect, with the
        gateway answering again: each must now name its money."""
        self.sim.admin.clear_faults()
        self.sim.admin.settle_pending()
        for flow in unnamed:
            self.engine.retry(flow.flow_id)
        self.settle()
        assert not self.check_settled(), [self.describe(flow) for flow in unnamed]


def _gone() -> Any:
    raise AssertionError("a flow record vanished")


def simulator_config() -> SimulatorConfig:
    return SimulatorConfig(seed=7, notify_max_attempts=1)


def model_settings(examples: int, steps: int) -> settings:
    """Hypothesis settings of the models' runs: derandomized (a model test is deterministic), no example
    database, no deadline (steps talk to real servers), every health check off (the rules are slow)."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
