"""Scripted steps and small flows for the engine's tests on a real Valkey (no Celery, a manual clock).

Scripted steps stand in for gateway calls so each path of the claim/complete protocol can be hit
exactly; the fixtures that build an engine around them are in ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from durapay.gateway import Catalogue, GatewayModel, GatewayOperation, Operation
from durapay.tasks.outcomes import Advance, Finish, Outcome
from durapay.tasks.runner import NOT_COMMITTED, ReconcileResult, StepContext
from durapay.workflows.engine.steps import FlowDefinition, WaitStep

T0 = 1_800_000_000.0


class DemoInput(GatewayModel):
    amount: int = Field(ge=1)
    sleepUntil: float | None = None


class HeldGateway:
    """A gateway client that shows every payment still held: what an operator's accept, keep or refund of a
    late payment reads first (``LatePayments.undone``) in tests whose steps are scripted."""

    def call(self, op: GatewayOperation[Any], *path: str, **_: Any) -> Any:
        assert op is Catalogue.get_operation, f"only the late payment's read is answered here, not {op.name}"
        return Operation(operationId=path[0], operationResult="AUTHORIZED")

    def close(self) -> None:
        pass


@dataclass
class ScriptedStep:
    """A step whose answers are scripted; it records every execute and reconcile."""

    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    reconciles: list[ReconcileResult] = field(default_factory=list)
    op: GatewayOperation[Any] | None = Catalogue.create_moto_order
    runs: list[int] = field(default_factory=list)
    reconciled: list[int] = field(default_factory=list)
    during: Callable[[StepContext], None] | None = None
    when: Any = None
    customer_url: Any = None

    @property
    def operation(self) -> GatewayOperation[Any] | None:
        return self.op

    @property
    def task_name(self) -> str:
        return "test.step"

    def execute(self, ctx: StepContext) -> Outcome:
        self.runs.append(ctx.attempt)
        if self.during:
            self.during(ctx)
        return self.outcomes.pop(0) if self.outcomes else Advance({"step": self.name, "key": ctx.idempotency_key})

    def reconcile(self, ctx: StepContext) -> ReconcileResult:
        self.reconciled.append(ctx.attempt)
        return self.reconciles.pop(0) if self.reconciles else NOT_COMMITTED


def summary(data: Any, outputs: Any) -> dict[str, Any]:
    return {"steps": sorted(outputs)}


class Sent:
    def __init__(self) -> None:
        self.chains: list[tuple[str, list[tuple[str, str]]]] = []

    def send(self, task_name: str, flow_id: str, step: str) -> None:
        self.chains.append((flow_id, [(task_name, step)]))

    def send_chain(self, flow_id: str, links: list[tuple[str, str]]) -> None:
        self.chains.append((flow_id, list(links)))


def flow(*steps: Any) -> FlowDefinition:
    return FlowDefinition("demo", DemoInput, tuple(steps), summary)


def wait_step(name: str = "customer") -> WaitStep:
    return WaitStep(
        name,
        ("paid",),
        on_signal=lambda ctx, signal, payload: Advance({"signal": signal, **payload}),
        on_deadline=lambda ctx: Finish(False, "expired"),
        timeout=lambda ctx: 100.0,
    )
