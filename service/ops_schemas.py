"""The shapes of ``/kinds`` (pause and resume a flow kind), ``/pauses`` and ``/bulk`` (bulk retry and
cancel): their requests and answers (``service.api_kinds``, ``service.api_bulk``).

Kept apart from ``service.schemas`` (a flow's and a schedule's answers): these are an operator's actions
over many flows. Pydantic only (no FastAPI): ``durapay.client`` reads its answers into these models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from durapay.gateway import StrictModel
from durapay.service.timeparse import SINCE_FORMS, SINCE_PATTERN
from durapay.workflows.engine import FlowState


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- pauses ------------------------------------------------------------------------------------------


class PauseRequest(StrictModel):
    reason: str = Field(min_length=1, max_length=500, description="why (shown in the audit list and each held flow's history)")
    by: str | None = Field(default=None, min_length=1, max_length=80, description="who asks (recorded beside `api`)")


class ResumeRequest(StrictModel):
    by: str | None = Field(default=None, min_length=1, max_length=80, description="who asks (recorded beside `api`)")


class PauseView(_Answer):
    """A pause in force: who, when (POSIX seconds), why."""

    kind: str
    by: str
    at: float
    reason: str


class KindView(_Answer):
    """A flow kind: whether it is paused (and by whom, when, why) and how many flows the pause holds."""

    kind: str
    description: str = ""
    paused: bool
    pause: PauseView | None = None
    held: int = Field(default=0, description="flows the pause holds (listed to be released at the resume)")
    released: int | None = Field(default=None, description="flows the resume released (its answer only)")


class KindList(_Answer):
    kinds: list[KindView]


class PauseEntry(_Answer):
    """One line of the audit list of pauses."""

    action: Literal["pause", "resume"] | str
    kind: str
    by: str
    at: float
    reason: str
    released: int | None = None


class PauseLog(_Answer):
    pauses: list[PauseEntry]


# -- bulk actions ------------------------------------------------------------------------------------


class BulkRequest(StrictModel):
    """The action and the filter: every flow of the kind, in the state, with the error code, created in
    the window (at least one of them)."""

    action: Literal["retry", "cancel"]
    kind: str | None = Field(default=None, min_length=1, max_length=100)
    state: FlowState | None = None
    error: str | None = Field(
        default=None, min_length=1, max_length=100, description="an error's type, ISO response code or gateway error code"
    )
    since: str | None = Field(default=None, pattern=SINCE_PATTERN, description=f"created since: {SINCE_FORMS}")
    until: str | None = Field(default=None, pattern=SINCE_PATTERN, description=f"created until: {SINCE_FORMS}")
    terminal: str | None = Field(
        default=None, min_length=1, max_length=32, description="flows of this gateway terminal (DURAPAY_TERMINALS)"
    )
    by: str | None = Field(default=None, min_length=1, max_length=80, description="who asks (named in each flow's history)")
    plan: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}$",
        description="`POST /bulk`: the `plan` of the dry run this action confirms; the same again is the same action",
    )


class BulkFlow(_Answer):
    """A flow a dry run listed, as it was shown: its state and version, and its money."""

    id: str
    kind: str
    state: str
    version: int = Field(default=0, description="the flow's version when shown: a flow changed since is skipped")
    created: float
    error: dict[str, Any] | None = None
    amount: int | None = Field(
        default=None, description="minor units: of the operation its outcome names, else of its request (null: none)"
    )
    currency: str | None = None


class BulkPlan(_Answer):
    """A dry run: how many flows match, how many the action would skip and why, the money at stake, and a
    sample. Kept (its flows, each as shown) for its confirmation."""

    plan: str = Field(description="this dry run's token: the action confirming it carries it (`POST /bulk`'s `plan`)")
    action: str
    filter: dict[str, Any] = Field(description="the filter as resolved at the dry run (POSIX seconds: relative times fixed then)")
    asked: dict[str, str] = Field(default_factory=dict, description="the filter as asked: the confirmation repeats it")
    created: float = 0.0
    kept_until: float = Field(default=0.0, description="when the dry run is no longer kept (then: a new dry run)")
    count: int
    would_skip: int
    skips: dict[str, int]
    totals: dict[str, int] = Field(
        default_factory=dict,
        description="the money of the flows the action would act on (not those it would skip): minor units by "
        'currency (`""`: flows whose request names no currency)',
    )
    sample: list[BulkFlow]


class SkippedFlow(_Answer):
    id: str
    reason: str


class BulkView(_Answer):
    """A bulk action and its progress: ``done`` + ``skipped`` of ``total``."""

    id: str
    action: str
    filter: dict[str, Any]
    by: str
    created: float
    updated: float
    status: Literal["running", "done"] | str
    total: int
    done: int
    skipped: int
    changed: int = Field(default=0, description="of `skipped`: flows that changed since the dry run (not acted on)")
    skips: dict[str, int] = Field(description="skipped flows by the engine's reason")
    skipped_sample: list[SkippedFlow]


class BulkList(_Answer):
    bulk: list[BulkView]
