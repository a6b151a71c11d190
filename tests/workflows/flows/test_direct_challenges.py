"""Three-step flows with a 3DS challenge (issue 22, item 5): whose challenge a ``3ds_result`` is, and what
the payment sends after a validation whose answer was lost.

The engine runs the real ``three_steps`` flow step by step on a manual clock against the simulator over
HTTP (its ACS page gives the PaRes), with a gateway client that records what each call sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from durapay.config import load_settings
from durapay.gateway import Catalogue, GatewayClient, GatewayOperation
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.clock import ManualClock
from durapay.workflows.engine.errors import OperatorError
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import FlowRecord
from durapay.workflows.flows import REGISTRY

CHALLENGE = "5186151650005008"  # approving MC that the issuer challenges


class RecordingClient(GatewayClient):
    """The engine's gateway client, real HTTP, keeping (operation, body) of every call it makes."""

    sent: list[tuple[str, dict[str, Any]]]

    def call(self, op: GatewayOperation[Any], *path_args: str, request: Any = None, idempotency_key: str | None = None) -> Any:
        body = request.model_dump(mode="json") if isinstance(request, BaseModel) else dict(request or {})
        self.sent.append((op.name, body))
        return super().call(op, *path_args, request=request, idempotency_key=idempotency_key)


class Rig:
    def __init__(self, engine: Engine, sim: SimulatorServer, client: RecordingClient) -> None:
        self.engine = engine
        self.sim = sim
        self.client = client

    @property
    def clock(self) -> ManualClock:
        assert isinstance(self.engine.clock, ManualClock)
        return self.engine.clock

    def start(self, order_id: str, **extra: Any) -> FlowRecord:
        data = {
            "order": {"orderId": order_id, "amount": "4200", "currency": "EUR"},
            "card": {"pan": CHALLENGE, "expiryDate": "1230", "cvv": "123"},
            "challengeTimeoutSeconds": 120,
            **extra,
        }
        return self.engine.start("three_steps", data)

    def step_until(self, flow_id: str, states: set[FlowState], limit: int = 12) -> FlowRecord:
        """Run the flow's due steps on the manual clock until it reaches one of ``states``."""
        for _ in range(limit):
            record = self.engine.get(flow_id)
            if record.state in states:
                return record
            if record.due is not None and record.due > self.clock.now():
                self.clock.advance(record.due - self.clock.now() + 0.001)
            self.engine.run_step(flow_id, record.step)
        raise AssertionError(f"flow {flow_id} did not reach {states}: {self.engine.get(flow_id).summary()}")

    def pares(self, record: FlowRecord) -> str:
        """The customer passes the challenge the flow shows at the simulator's ACS; the PaRes it returns."""
        init = record.outputs["init"]
        return self.sim.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"])

    def bodies(self, operation: str) -> list[dict[str, Any]]:
        return [body for name, body in self.client.sent if name == operation]


@pytest.fixture
def rig(redis_client: redis.Redis, key_prefix: str) -> Iterator[Rig]:
    with SimulatorServer(SimulatorConfig(seed=5)) as sim:
        settings = load_settings(
            {
                "gateway": {"base_url": sim.base_url, "timeout": 3.0, "connect_timeout": 1.0},
                "engine": {"key_prefix": key_prefix, "partitions": 2},
                "retry": {"base_seconds": 1, "cap_seconds": 4, "max_attempts": 3, "reconcile_attempts": 3},
                "receiver": {"public_url": "http://127.0.0.1:9/notifications"},
            }
        )
        clients: list[RecordingClient] = []

        def factory() -> GatewayClient:
            client = RecordingClient(settings.gateway)
            client.sent = []
            clients.append(client)
            return client

        engine = Engine(settings, redis_client, REGISTRY, clock=ManualClock(sim.admin.now().timestamp()), client_factory=factory)
        engine.gateway()
        yield Rig(engine, sim, clients[0])
        engine.gateway().close()


def operations_of(rig: Rig, order_id: str) -> list[dict[str, Any]]:
    return list(rig.sim.admin.operations(order_id=order_id))


def history_text(rig: Rig, flow_id: str) -> str:
    return "\n".join(str(entry.get("what", "")) for entry in rig.engine.history(flow_id))


# -- (b) a validation whose answer was lost, read back ------------------------------------------------


def test_a_lost_validation_answer_read_back_never_pays_without_the_3ds_data(rig: Rig) -> None:
    """The validation acts at the gateway (the customer authenticated) and its answer is lost (a 500
    after the gateway acted). The step reads the operation back: THREEDS_VALIDATED, but a read carries
    no ``threeDSAuthResult``. The payment must not go out without the ``threeDSAuthData`` it sends after
    an answered validation: the flow stops for a person, nothing is charged."""
    started = rig.start("ch-lost-validation")
    waiting = rig.step_until(started.id, {FlowState.WAITING})
    operation_id = waiting.outputs["init"]["operation"]["operationId"]
    assert rig.engine.signal(started.id, "3ds_result", {"threeDSAuthResponse": rig.pares(waiting)}) == "resumed"
    rig.sim.admin.set_faults(mode="commit_then_fail", operation="three_steps_validation", count=1)

    stopped = rig.step_until(started.id, {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION})

    payments = rig.bodies("three_steps_payment")
    assert all(body.get("threeDSAuthData") for body in payments), f"a payment was sent without threeDSAuthData: {payments}"
    assert stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    assert stopped.error is not None and stopped.error.get("type") == "ThreeDSDataLost", stopped.error
    assert stopped.error.get("operationId") == operation_id
    assert "no threeDSAuthResult" in history_text(rig, started.id)
    (operation,) = operations_of(rig, waiting.order_id)
    assert operation["operationResult"] == "THREEDS_VALIDATED", "authenticated, never paid"
    assert stopped.unsettled is None, "no money call was made: nothing in flight"

    # A person's retry reads the gateway again and stops again: it never pays without the data.
    rig.engine.retry(started.id)
    again = rig.step_until(started.id, {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION})
    assert again.state is FlowState.NEEDS_ATTENTION and (again.error or {}).get("type") == "ThreeDSDataLost"
    assert rig.bodies("three_steps_payment") == []
    # The way out the message names: cancel (nothing in flight, so at once), and start a new flow.
    cancelled = rig.engine.cancel(started.id, "customer to authenticate again")
    assert cancelled.state is FlowState.CANCELLED, cancelled.summary()
    (operation,) = operations_of(rig, waiting.order_id)
    assert operation["operationResult"] == "THREEDS_VALIDATED", "still never paid"


def test_an_answered_validation_sends_its_3ds_data_with_the_payment(rig: Rig) -> None:
    """The path the read-back must not shortcut: the validation's ``threeDSAuthResult`` goes with the
    payment as ``threeDSAuthData`` (authenticationValue, eci, xid)."""
    started = rig.start("ch-answered")
    waiting = rig.step_until(started.id, {FlowState.WAITING})
    operation_id = waiting.outputs["init"]["operation"]["operationId"]
    rig.engine.signal(started.id, "3ds_result", {"threeDSAuthResponse": rig.pares(waiting)})
    done = rig.step_until(started.id, {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION})
    assert done.state is FlowState.SUCCEEDED, done.summary()
    result = done.outputs["validation"]["threeDSAuthResult"]
    (payment,) = rig.bodies("three_steps_payment")
    assert payment["threeDSAuthData"] == {key: result[key] for key in ("authenticationValue", "eci", "xid")}
    assert payment["threeDSAuthData"]["authenticationValue"] and payment["operationId"] == operation_id


def test_an_operation_found_validated_at_the_challenge_deadline_is_not_paid_without_3ds_data(rig: Rig) -> None:
    """The same rule on the deadline's read: no ``3ds_result`` came, yet the gateway shows the challenge's
    operation THREEDS_VALIDATED (validated outside this flow: here the test calls the gateway itself).
    Before, the flow skipped its validation and paid without ``threeDSAuthData``; now it stops for a
    person."""
    started = rig.start("ch-dl-validated")
    waiting = rig.step_until(started.id, {FlowState.WAITING})
    operation_id = waiting.outputs["init"]["operation"]["operationId"]
    with GatewayClient(rig.engine.settings.gateway) as outside:
        outside.call(
            Catalogue.three_steps_validation,
            request={"operationId": operation_id, "threeDSAuthResponse": rig.pares(waiting)},
        )
    assert waiting.wait is not None
    rig.clock.advance(float(waiting.wait["deadline"]) - rig.clock.now() + 1)

    stopped = rig.step_until(started.id, {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION})

    assert rig.bodies("three_steps_payment") == [], "no payment without the validation's 3DS data"
    assert stopped.state is FlowState.NEEDS_ATTENTION, stopped.summary()
    assert (stopped.error or {}).get("type") == "ThreeDSDataLost" and stopped.error["operationId"] == operation_id
    (operation,) = operations_of(rig, waiting.order_id)
    assert operation["operationResult"] == "THREEDS_VALIDATED"


# -- (a) a stale 3ds_result and an operator's retry -------------------------------------------------
#
# Refuted: an operator's retry never gives a three-step flow a second challenge. A failed flow's card
# was erased when it ended, so ``retry`` refuses it (a new challenge needs a new flow, which has its own
# flow id and takes no signal of this one); a ``needs_attention`` flow resumes its own step on the same
# operation, so a result it kept is its own challenge's.


@pytest.mark.parametrize("ending", ["expired", "3ds_failed"])
def test_a_failed_challenge_flow_is_never_restarted_so_no_second_challenge_takes_its_result(rig: Rig, ending: str) -> None:
    """The first challenge ends the flow ``failed``: its deadline passed before the result came, or the
    result came and the issuer refused the customer. The customer's result arriving after that (late, or
    posted again) is not kept, and the operator's retry is refused (card erased): no new order, no new
    challenge, nothing that could take the stale result."""
    started = rig.start(f"ch-st-{ending}")
    waiting = rig.step_until(started.id, {FlowState.WAITING})
    init = waiting.outputs["init"]
    if ending == "expired":
        pares = rig.pares(waiting)  # the customer passed the ACS; the merchant's signal comes too late
        assert waiting.wait is not None
        rig.clock.advance(float(waiting.wait["deadline"]) - rig.clock.now() + 1)
    else:
        pares = rig.sim.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"], approve=False)
        assert rig.engine.signal(started.id, "3ds_result", {"threeDSAuthResponse": pares}) == "resumed"
    failed = rig.step_until(started.id, {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION})
    assert failed.state is FlowState.FAILED, failed.summary()
    assert (failed.error or {}).get("type") == ("ChallengeExpired" if ending == "expired" else "ThreeDSFailed")

    assert rig.engine.signal(started.id, "3ds_result", {"threeDSAuthResponse": pares}) == "finished"
    assert rig.engine.get(started.id).signals == [], "a result for a finished flow is not kept"
    with pytest.raises(OperatorError, match="card data was erased"):
        rig.engine.retry(started.id)

    after = rig.engine.get(started.id)
    assert (after.state, after.generation, after.orders) == (FlowState.FAILED, 0, [waiting.order_id])
    assert [op["operationId"] for op in operations_of(rig, f"{waiting.order_id}-2")] == [], "no second order"
    assert len(rig.bodies("three_steps_init")) == 1, "one init, one challenge"
    assert rig.bodies("three_steps_payment") == []


def test_a_retry_after_a_stop_during_the_challenge_resumes_that_challenge_with_its_own_result(rig: Rig) -> None:
    """The challenge's deadline read is refused (401: the flow stops for a person) and the customer's
    result arrives meanwhile (kept). The operator's retry resumes the same step on the same operation,
    same generation and order: the kept result is that challenge's, and it is validated and paid there."""
    started = rig.start("ch-resume")
    waiting = rig.step_until(started.id, {FlowState.WAITING})
    operation_id = waiting.outputs["init"]["operation"]["operationId"]
    assert waiting.wait is not None
    rig.sim.admin.set_faults(mode="error", operation="get_operation", status=401, count=1)
    rig.clock.advance(float(waiting.wait["deadline"]) - rig.clock.now() + 1)
    stopped = rig.step_until(started.id, {FlowState.NEEDS_ATTENTION, FlowState.FAILED, FlowState.SUCCEEDED})
    assert stopped.state is FlowState.NEEDS_ATTENTION and stopped.step == "challenge", stopped.summary()
    assert rig.engine.signal(started.id, "3ds_result", {"threeDSAuthResponse": rig.pares(waiting)}) == "stored"

    rig.engine.retry(started.id)
    done = rig.step_until(started.id, {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION})

    assert done.state is FlowState.SUCCEEDED, done.summary()
    assert (done.generation, done.orders) == (0, [waiting.order_id]), "no new generation, no new order"
    (validation,) = rig.bodies("three_steps_validation")
    (payment,) = rig.bodies("three_steps_payment")
    assert validation["operationId"] == payment["operationId"] == operation_id
    assert payment["threeDSAuthData"]["authenticationValue"]
    (operation,) = operations_of(rig, waiting.order_id)
    assert operation["operationId"] == operation_id and operation["operationResult"] in {"EXECUTED", "AUTHORIZED"}
    assert done.signals == [], "the result was consumed by its challenge"


def test_a_3ds_result_naming_another_operation_is_dropped_not_taken_as_this_challenges(rig: Rig) -> None:
    """A challenge answer names its operation (``paymentId``, as the issuer's page returns it): one for
    another challenge of the flow (a first one, before a lost init answer moved the flow to a new order)
    is dropped; the flow waits on for its own, which it validates and pays."""
    started = rig.start("ch-named")
    waiting = rig.step_until(started.id, {FlowState.WAITING})
    operation_id = waiting.outputs["init"]["operation"]["operationId"]
    pares = rig.pares(waiting)
    assert rig.engine.signal(started.id, "3ds_result", {"PaRes": pares, "paymentId": "800000000000999999"}) == "resumed"
    rig.engine.run_step(started.id, "challenge")
    still = rig.engine.get(started.id)
    assert still.state is FlowState.WAITING and still.step == "challenge", still.summary()
    assert rig.bodies("three_steps_validation") == [], "nothing validated with another challenge's answer"
    assert rig.engine.signal(started.id, "3ds_result", {"PaRes": pares, "paymentId": operation_id}) == "resumed"
    done = rig.step_until(started.id, {FlowState.SUCCEEDED, FlowState.FAILED, FlowState.NEEDS_ATTENTION})
    assert done.state is FlowState.SUCCEEDED, done.summary()
