"""From the money review of issue 38 (versions, migrations, parked flows): each test failed on the main it
was written against and names the invariant it broke; the roots are fixed (claim.lua's money marks by
the flow's own definition, a refused migration's park settling its own claim's mark, a signal for a
version not held left to the store)."""

from __future__ import annotations

from typing import Any

from durapay.flows import Final, Flow, StepInput, call, step
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows._adopt import adopt_order_payment
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary, wait_step


def charge_call(*args: Any, **kwargs: Any) -> Any:
    """A MOTO charge step, with the read-back a money call must declare (``durapay.flows.call``)."""
    return call("charge", "create_moto_order", *args, adopt=adopt_order_payment, **kwargs)


def out_of_stock(given: StepInput) -> dict[str, Any]:
    raise Final("out of stock")


def build(*steps: Any, previous: tuple[Flow, ...] = (), migrates: tuple[Flow, ...] = ()) -> Flow:
    return Flow("demo", DemoInput, tuple(steps), summary, previous=previous, migrates=migrates)


def test_a_previous_versions_own_step_is_not_marked_as_money_by_the_current_versions_step_of_that_name(
    make_engine: Any, clock: ManualClock
) -> None:
    """Finding 1: claim.lua marked money in flight per *kind*, not per the flow's own version.

    Build 1's ``charge`` is the merchant's own step (its own code, no gateway call); build 2 moves the charge
    to durapay (``charge`` is now a MOTO payment) and keeps build 1 as a previous version. A build-1 flow
    claimed by build 2 at ``charge`` gets an ``unsettled`` mark naming create_moto_order (StepProtocol.money_ops
    takes the op of the current version's step of that name), though no call can be made. Its Final
    refusal must end it ``failed``; the mark instead makes transition.lua owe the failure to a gateway
    read, and the flow stops for a person over money that never could move (invariant: money in flight is
    recorded only for a call the flow's own step makes; a refusal ends the flow with its reason)."""
    first = build(ScriptedStep("check"), step(out_of_stock, name="charge"))
    second = build(ScriptedStep("check"), charge_call(), previous=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "check") == "ready"
    claim = new.claim(record.id, "charge")
    assert not isinstance(claim, str)
    marked = claim.record.unsettled  # claim.lua's mark (None when judged by the flow's own version)
    new.protocol.finish(claim, new.protocol.run(claim))
    for _ in range(5):  # whatever the engine does next on its own
        now = new.get(record.id)
        if now.state in (FlowState.FAILED, FlowState.NEEDS_ATTENTION):
            break
        clock.advance(60)
        new.dispatch_due()
        new.run_step(record.id, now.step)
    ended = new.get(record.id)
    assert ended.state is FlowState.FAILED and ended.unsettled is None, (
        f"build 1's merchant step 'charge' raised Final, and the flow ended {ended.state} with "
        f"unsettled={ended.unsettled} (claimed with {marked}): build 2's payment step of that name made claim.lua "
        "mark money in flight where no call was made (money ops per kind, not per the flow's version)"
    )


def fraud(given: StepInput) -> dict[str, Any]:
    return {"score": 1}


def test_a_migration_refused_at_a_money_step_parks_the_flow_without_money_in_flight(make_engine: Any) -> None:
    """Finding 6: a refused migration parked the flow with the money mark its claim just wrote.

    Build 2 renames build 1's fraud step and declares ``migrates=(build 1,)``; a build-1 flow at ``charge``
    (a MOTO payment in both) is past the change. Build 2's claim runs claim.lua, which marks ``unsettled``
    for ``charge`` (build 2's step of that name moves money) *before* Python's ``versions.migration``
    refuses and ``StepProtocol._park`` parks it, keeping the mark: no call was sent, yet the parked flow
    says money may be in flight, so a cancel cannot end it (transition.lua turns it into a gateway read,
    which only a process holding build 1 can run) (invariant: money in flight is recorded only from a
    claim that may call; a parked flow never ran, so a cancel ends it at once)."""
    first = build(step(fraud), charge_call())
    second = build(step(fraud, name="risk"), charge_call(), migrates=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = old.start("demo", {"amount": 3})
    assert old.run_step(record.id, "fraud") == "ready"
    assert new.run_step(record.id, "charge") == "parked"
    parked = new.get(record.id)
    cancelled = new.cancel(record.id, "customer changed their mind")
    again = new.run_step(record.id, "charge") if cancelled.state is not FlowState.CANCELLED else "cancelled"
    assert parked.unsettled is None and cancelled.state is FlowState.CANCELLED, (
        f"a flow parked by a refused migration before any call kept unsettled={parked.unsettled}; "
        f"the cancel left it {cancelled.state} (cancel_requested={cancelled.cancel_requested}) instead of cancelled, "
        f"and build 2's next claim of it: {again}"
    )


def test_a_signal_for_a_flow_of_a_version_this_process_does_not_hold_is_not_judged_by_the_current_one(
    make_engine: Any,
) -> None:
    """Finding 7: during a rolling deploy, a process of build 1 judged a build-2 flow's signal by build 1's steps.

    ``Engine._signal`` admits with ``definition_for(flow) or registry.get(kind)``: a flow of a version this
    process does not hold is judged by the process's *current* definition. Build 2 adds a wait for the
    customer (and keeps build 1 as previous, so deploy check passes); while build 1's API processes still
    serve, the customer's signal to a waiting build-2 flow reaches one of them and is refused with "takes
    no signal", and the flow waits to its deadline, which fails it though the customer did what it waited
    for (invariant: a signal is judged by the flow's own version, b6fede7; a version not held here is the
    store's to keep, as ``signals.admit`` does for a kind not held)."""
    first = build(step(fraud), ScriptedStep("charge"))
    second = build(step(fraud), wait_step("customer"), ScriptedStep("charge"), previous=(first,))
    old, _ = make_engine(first)
    new, _ = make_engine(second)
    record = new.start("demo", {"amount": 3})
    assert new.run_step(record.id, "fraud") == "ready"
    assert new.run_step(record.id, "customer") == "waiting"
    try:
        told = old.signal(record.id, "paid", {"ok": True})
    except Exception as exc:  # noqa: BLE001 - what the merchant's API call is answered
        told = f"{type(exc).__name__}: {exc}"
    assert told in ("resumed", "stored"), f"build 1's API answered a build-2 flow's awaited signal with {told!r}"
    assert new.run_step(record.id, "customer") == "ready", "build 2's worker takes the signal"
