"""The shapes of the control API's answers, declared so that the OpenAPI document types them.

Why separate models: the routes build their answers from records (``service.views``,
``ScheduleRecord.summary``); these models say what a client may rely on. Each keeps any further field
(``extra="allow"``): a field added to a record's summary reaches clients without a change here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workflows.states import FlowState


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class FlowBrief(_Answer):
    """One flow in a list: no input or outputs."""

    id: str
    kind: str
    state: FlowState
    step: str
    order_id: str | None = None
    customer_url: str | None = None
    created: float
    updated: float
    result: str | None = Field(default=None, description="succeeded or failed once the flow ended")
    error: dict[str, Any] | None = None


class FlowView(_Answer):
    """One flow: where it stands, what its steps answered (secrets masked), how it ended."""

    id: str
    kind: str
    state: FlowState
    step: str
    version: int
    attempt: int
    created: float
    updated: float
    due: float | None = None
    order_id: str | None = None
    customer_url: str | None = Field(default=None, description="where the customer pays or authenticates")
    input: dict[str, Any] = {}
    outputs: dict[str, dict[str, Any]] = {}
    error: dict[str, Any] | None = None
    wait: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    cancel_requested: bool = False
    start_key: str | None = None
    steps_done: list[str] = []


class FlowList(BaseModel):
    flows: list[FlowBrief]
    limit: int
    offset: int
    next_offset: int | None


class History(BaseModel):
    """Every transition (flows) or event (schedules), oldest first."""

    id: str
    history: list[dict[str, Any]]


class SignalAnswer(BaseModel):
    result: str = Field(description="resumed (the flow was waiting for it) or stored (kept until it waits)")
    flow: FlowView


class ScheduleView(_Answer):
    """One schedule: its rule, next run, counters, last outcome and open attempts."""

    id: str
    state: str
    contractId: str
    amount: int
    currency: str
    description: str
    rule: dict[str, Any]
    timezone: str
    nextRun: str | None = None
    nextRunLocal: str | None = None
    occurrences: int
    counts: dict[str, int]
    open: list[dict[str, Any]]


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]
    limit: int
    offset: int
    next_offset: int | None


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, bool]
