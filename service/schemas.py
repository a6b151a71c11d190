"""The shapes of the control API's answers, declared so that the OpenAPI document types them.

Why separate models: the routes build their answers from records (``service.views``,
``ScheduleRecord.summary``); these models say what a client may rely on. They are also what
``durapay.client`` reads the answers into, so they are lenient as the gateway's models are
(``durapay.gateway``): each keeps any further field (``extra="allow"``: a field a newer server adds
reaches ``model_extra``, never an error), and a flow's state this version does not know is kept as
:class:`~durapay.gateway.Unknown` (a ``str``), never passed off as a known one. The OpenAPI document
is unchanged by that: it lists the known states.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, ValidationError
from pydantic_core import core_schema

from durapay.gateway import Unknown
from durapay.workflows.engine import FlowState


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class KeepUnknown:
    """Field metadata: ``Annotated[FlowState | Unknown, KeepUnknown()]`` reads a known value as the
    enum's member and any other string as :class:`~durapay.gateway.Unknown`; its JSON schema is the
    enum's own (the server only ever answers known values)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(
            _known_or_kept,
            handler.generate_schema(FlowState),
            serialization=core_schema.plain_serializer_function_ser_schema(_plain, when_used="json"),
        )


def _known_or_kept(value: Any, known: core_schema.ValidatorFunctionWrapHandler) -> Any:
    try:
        return known(value)
    except ValidationError:
        if isinstance(value, str):
            return Unknown(value)
        raise


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else str(value)


#: A flow's state in an answer: a :class:`FlowState`, or :class:`~durapay.gateway.Unknown` when a newer
#: server answers a state this version does not know.
AnsweredState = Annotated[FlowState | Unknown, KeepUnknown()]


class FlowBrief(_Answer):
    """One flow in a list: no input or outputs."""

    id: str
    kind: str
    state: AnsweredState
    step: str
    order_id: str | None = None
    customer_url: str | None = None
    created: float
    updated: float
    result: str | None = Field(default=None, description="succeeded or failed once the flow ended")
    error: dict[str, Any] | None = None
    terminal: str = Field(default="default", description="the gateway terminal whose key and gate its calls use")


class DefinitionRef(_Answer):
    """The definition a flow runs on: its kind and the version it started on (docs/deploys.md)."""

    kind: str
    version: str | None = Field(description="the definition's version (null: a kind this process does not know)")


class FlowView(_Answer):
    """One flow: where it stands, what its steps answered (secrets masked), how it ended."""

    id: str
    kind: str
    state: AnsweredState
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
    unsettled: dict[str, Any] | None = Field(
        default=None,
        description="money in flight: the money call a step may have sent ({step, op, t, operationId}), until a read "
        "of the gateway settles it; no cancel or failure ends the flow before",
    )
    start_key: str | None = None
    terminal: str = Field(
        default="default", description="the gateway terminal whose key and gate its calls use (DURAPAY_TERMINALS)"
    )
    steps_done: list[str] = []
    definition: DefinitionRef | None = Field(
        default=None, description="the definition the flow runs on: kind and version (docs/deploys.md, Versions)"
    )
    tenant: str | None = Field(
        default=None,
        description="the merchant a platform started it for (?tenant= on the start): with the terminal, the key its steps "
        "are dispatched fairly by (docs/operations.md, Fairness); null when none was named",
    )
    attention: list[dict[str, Any]] = Field(
        default=[],
        description="the reconciliation's marks on this flow (GET /flows/{id}; docs/operations.md, Reconciliation): "
        "a mismatch for a person, with its category, report and operation; the flow's state is its own",
    )
    actions: list[str] = Field(
        default=[],
        description="what an operator may do now (retry, cancel, accept, refund, keep: the engine's own rule, "
        "workflows/engine/operator_actions.py); anything else is refused with 409",
    )


class FlowList(_Answer):
    """A page of flows, newest first, and the cursor of the next page (as ``EventPage``)."""

    flows: list[FlowBrief]
    limit: int
    next: str | None = Field(description="the cursor to pass as after= for the next page (null: this was the last)")


class History(_Answer):
    """Every transition (flows) or event (schedules), oldest first."""

    id: str
    history: list[dict[str, Any]]


class SignalAnswer(_Answer):
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
    terminal: str = Field(default="default", description="the gateway terminal its charges run on")
    nextRun: str | None = None
    nextRunLocal: str | None = None
    occurrences: int
    counts: dict[str, int]
    open: list[dict[str, Any]]


class ScheduleList(_Answer):
    schedules: list[ScheduleView]
    limit: int
    offset: int
    next_offset: int | None


class Health(_Answer):
    status: str


class Readiness(_Answer):
    ready: bool
    checks: dict[str, bool]


class EndpointView(_Answer):
    """A webhook endpoint (its secret is shown only by a create and a rotation)."""

    id: str
    url: str
    events: list[str] = Field(description="types sent; empty: all")
    description: str
    created: float
    enabled: bool
    disabledReason: str | None = Field(default=None, description="why it was disabled (410 Gone, failing for days...)")
    disabledAt: float | None = None
    rotating: bool = Field(description="the previous secret is still valid (both signatures sent)")
    previousSecretUntil: float | None = None
    source: str = Field(description="api, or config (DURAPAY_WEBHOOKS__ENDPOINTS)")


class EndpointWithSecret(EndpointView):
    """An endpoint as a create or a rotation answers it: with its (new) secret, shown this once."""

    secret: str = Field(description="whsec_ + base64: the key of the signatures")


class EndpointList(_Answer):
    endpoints: list[EndpointView]
    pending: int = Field(description="deliveries not yet made, every endpoint")


class AttemptView(_Answer):
    """One delivery attempt: its answer (or error), latency, and what followed."""

    event: str
    endpoint: str
    at: str
    status: int | None = Field(default=None, description="HTTP status; null when no answer came")
    ok: bool
    outcome: str = Field(description="delivered, retry, given up, dropped, endpoint disabled (...), test failed")
    attempt: int = Field(description="1 for the first attempt of this delivery")
    latencyMs: float | None = None
    response: str | None = Field(default=None, description="the answer's first bytes")
    error: str | None = None
    nextAttempt: str | None = None


class AttemptList(_Answer):
    attempts: list[AttemptView]


class TestAnswer(AttemptView):
    """The attempt of a ``webhook.test`` send."""


class WebhookDueNow(_Answer):
    """What ``POST /webhooks/{id}/deliver-now`` made due: the endpoint's pending deliveries that were
    waiting for a later retry (those due within a lease are left: one may be in flight)."""

    due_now: int = Field(ge=0, description="deliveries made due now (at most 10,000); the workers send them within a tick")


class EventView(_Answer):
    """A merchant event (docs/events.md has each type's ``data``), with the cursor to resume after it."""

    id: str
    type: str
    timestamp: str
    orderId: str | None = None
    operationId: str | None = None
    data: dict[str, Any]
    cursor: str


class EventPage(_Answer):
    events: list[EventView]
    next: str | None = Field(description="the cursor to pass as after= next time (null: nothing read yet)")


class ReplayAnswer(_Answer):
    scheduled: int = Field(description="deliveries scheduled (events x endpoints)")
