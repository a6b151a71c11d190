"""Two terminals on one durapay (issue 40's first acceptance point, short): real Valkey, a Celery worker,
the simulator over HTTP checking each terminal's key (``SimulatorConfig.terminal_keys``).

Terminal ``it`` meets an outage (every call 503, then every call hanging past the client's timeout) while
``default`` runs mixed flows. What must hold, with no time asserted: every flow of the healthy terminal
succeeds with no attempt used and none deferred, held or rate limited by the other's gate; the outage
terminal's flows, started before and during it, all succeed once it is over (the outage is shorter than the
bound: none failed, none for a person); nobody is charged twice; the simulator recorded every order with
the flow's own terminal and refused no call as another terminal's (each flow's calls used its key), a
refund of an ``it`` payment included. The full run (150 s, 500 flows, with its latency ratio) is
``bench/outage.py --terminals 2``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from durapay.service.metrics import render
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import InputError
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import STOPPED, FlowState
from tests.waiting import wait_until
from tests.workflows.integration.conftest import Stack, stack_settings
from tests.workflows.integration.test_flows import APPROVE, card, order

pytestmark = pytest.mark.integration

IT_KEY = "simulator-key-of-it"
HEALTH = {"failures": 3, "window_seconds": 30, "open_seconds": 2, "rate_per_second": 40, "burst": 20}
#: Log entries of a flow kept or failed by a gate (its own or, were gates shared, another terminal's).
GATED = ("gateway unavailable", "gateway rate limit", "Redis unreachable before")


@pytest.fixture(scope="module")
def terminal_simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=40, terminal_keys={IT_KEY: "it"})) as sim:
        yield sim


@pytest.fixture
def two_terminals(redis_url: str, key_prefix: str, terminal_simulator: SimulatorServer) -> Iterator[Stack]:
    terminal_simulator.admin.clear_faults()
    settings = stack_settings(
        key_prefix,
        terminal_simulator.base_url,
        gateway={"timeout": 1.0, "connect_timeout": 0.5},
        retry={"max_attempts": 4, "reconcile_attempts": 4},
        gateway_health=HEALTH,
        terminals={"it": {"api_key": IT_KEY}},
    )
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(40))
    dispatcher = Dispatcher(runtime.engine, interval=0.05)
    with ExitStack() as stack:
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=8, perform_ping_check=False))
        dispatcher.start()
        stack.callback(dispatcher.stop)
        yield Stack(runtime, terminal_simulator, dispatcher)
    terminal_simulator.admin.clear_faults()
    runtime.close()


def start(stack: Stack, number: int, terminal: str) -> str:
    kind = ("moto", "card_verification", "wallet")[number % 3]
    if kind == "moto":
        data: dict[str, Any] = {"order": order(), "card": card()}
    elif kind == "card_verification":
        data = {"order": order(0), "card": card()}
    else:
        data = {"order": order(), "walletPaymentData": {"pan": APPROVE}}
    return stack.engine.start(kind, data, terminal=terminal).id


def test_an_outage_of_one_terminal_holds_defers_and_fails_none_of_the_others_flows(two_terminals: Stack) -> None:
    engine, admin, state = two_terminals.engine, two_terminals.simulator.admin, two_terminals.simulator.simulator.state
    outage = [start(two_terminals, n, "it") for n in range(10)]
    admin.set_faults(mode="error", status=503, terminal="it")
    healthy = [start(two_terminals, n, "default") for n in range(30)]
    outage += [start(two_terminals, n, "it") for n in range(10, 20)]
    wait_until(lambda: engine.terminals.gate("it").status().state != "closed", timeout=20, what="it's breaker to open")
    healthy += [start(two_terminals, n, "default") for n in range(30, 45)]
    admin.clear_faults()
    admin.set_faults(mode="hang", seconds=3, terminal="it")
    outage += [start(two_terminals, n, "it") for n in range(20, 30)]
    healthy += [start(two_terminals, n, "default") for n in range(45, 60)]
    wait_until(lambda: all(engine.get(f).state in STOPPED for f in healthy) or None, timeout=120, what="the healthy flows")
    admin.clear_faults()
    wait_until(lambda: all(engine.get(f).state in STOPPED for f in outage) or None, timeout=120, what="the outage's flows")

    records = {f: engine.get(f) for f in healthy + outage}
    states = Counter((r.terminal, r.state) for r in records.values())
    assert states == {("default", FlowState.SUCCEEDED): 60, ("it", FlowState.SUCCEEDED): 30}, states
    histories = {f: engine.history(f) for f in records}
    kept = {f: [e["what"] for e in histories[f] if any(g in (e.get("what") or "") for g in GATED)] for f in healthy}
    assert not any(kept.values()), {f: w for f, w in kept.items() if w}  # none deferred or held by it's gate
    retried = [sum("will be retried" in (e.get("what") or "") for e in histories[f]) for f in healthy]
    assert retried == [0] * 60, retried  # no attempt used on the healthy terminal
    assert sum(any("gateway unavailable" in (e.get("what") or "") for e in histories[f]) for f in outage) > 0
    assert engine.terminals.gate("default").status().counters["opened_total"] == 0
    assert engine.terminals.gate("it").status().counters["opened_total"] >= 1

    # A refund of an outage terminal's payment goes with that terminal's key (another's would be a 404): its
    # start names none, and the engine takes the payment's flow's; naming another is refused.
    paid = next(r for f, r in records.items() if r.terminal == "it" and r.kind == "moto")
    operation_id = (paid.outcome or {})["operation"]["operationId"]
    refund_input = {"operationId": operation_id, "amount": 500, "currency": "EUR"}
    with pytest.raises(InputError, match=f"operation {operation_id} is flow {paid.id}'s, on terminal 'it'"):
        engine.start("refund", refund_input, terminal="default")
    refund = engine.wait(engine.start("refund", refund_input).id, 30)
    assert refund.state is FlowState.SUCCEEDED and refund.terminal == "it", refund.summary()

    ours = {r.order_id: r.terminal for r in records.values()}
    operations = [op for op in admin.operations() if op["orderId"] in ours]
    assert {op["orderId"]: op["terminal"] for op in operations} == ours, "each order made with its flow's terminal's key"
    assert state.terminal_refusals == 0, "no call named another terminal's order"
    executed = Counter(
        op["orderId"] for op in operations if op.get("operationResult") == "EXECUTED" and op.get("operationType") != "REFUND"
    )
    assert executed and all(n == 1 for n in executed.values()), [o for o, n in executed.items() if n > 1]
    metrics = render(engine)
    assert 'durapay_gateway_breaker{terminal="default",state="closed"} 1' in metrics
    assert 'durapay_gateway_breaker{terminal="it",state="closed"} 1' in metrics
