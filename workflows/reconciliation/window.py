"""Every operation of a time window, read from the gateway's ``GET /operations`` within its limits.

The public material (docs/gateway.md, Times) gives the list no cursor: answers are newest first, at most
``maxRecords`` (500) of them, over a ``fromTime``-``toTime`` span of at most a month, and "for the next
page set toTime equal to the lastOperationTime value of the last record". So a window is read

* span by span, newest first, each at most ``span_days`` long (``DURAPAY_RECONCILE__SPAN_DAYS``,
  28 by default: the shortest month);
* within a span, page by page: a full page (``maxRecords`` records) is followed by one whose ``toTime``
  is the oldest record's ``operationTime``, exactly as the gateway wrote it. Bounds are inclusive, so
  the boundary records come again and are dropped by operation id; a page short of ``maxRecords`` ends
  the span. Every operation the gateway answers for a query is kept, whatever time it writes: its own
  filter decides what a span holds, and a time without an offset may be in another zone than durapay
  reads it in (docs/gateway.md, Times), so a filter of durapay's own would drop what no other window
  reads again. An operation two windows both answer is judged by both, to the same finding.

Every loop has a limit: ``max_calls`` calls per run, retries included. A full page that brings nothing
new (more than ``maxRecords`` operations in the same millisecond) cannot be paged past by time: the
reader steps one millisecond back and says so in :attr:`WindowRead.gaps`, so that a report never claims
a window it did not read. A call that fails with a retryable error (a timeout, 429, 5xx) is tried again
after the engine's technical backoff (``RetryPolicy``, honouring the gateway's ``Retry-After``), as a
step's call is; reads are safe to repeat. A call that still fails ends the read with that error.

Every call passes the gateway's gate first (``workflows.engine.gate``), like any step's: the shared rate limit,
a 429's hold, the circuit breaker. What a call meets is told to the gate (a timeout or 5xx counts toward
opening the breaker, a 429 holds every worker), as the runner does for steps. A run is not a flow with a
due time to come back at, so it waits where it is: for its slot, the hold, or the breaker's end, using
no attempt and no call of its budget, for at most ``held_seconds`` in all (``HELD_SECONDS``); past that
it ends with :class:`GatewayHeld`, a gateway error, so the report says the window was not read and why
(never a silently partial report).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from durapay.gateway import Catalogue, GatewayError, NotFound, RateLimited, ServerError, TransportError, parse_gateway_time
from durapay.tasks.retry import RetryPolicy
from durapay.workflows.engine import Gate

#: One GET /operations: the query (the gateway's names) -> the operations of the answer, as JSON.
ListCall = Callable[[Mapping[str, Any]], list[dict[str, Any]]]
#: One GET /operations/{operationId}: the operation as JSON, or None when the gateway has none (404).
GetCall = Callable[[str], dict[str, Any] | None]


#: The longest a run waits in all while the gate keeps its reads from the gateway (an outage past it
#: ends the run naming it: the next run reads the window again).
HELD_SECONDS = 300.0


class CallBudgetSpent(Exception):
    """The run used up its ``max_calls`` gateway calls."""


class GatewayHeld(GatewayError):
    """The gateway's gate kept the run's reads from the gateway past ``held_seconds`` (the breaker open, or a
    429's hold): no call was sent. A gateway error, so that the run ends with it, as with a read that
    failed: its report is not clean and says why."""


def gateway_iso(moment: datetime) -> str:
    """The documented form of a query time: ISO 8601 in UTC with milliseconds (``2022-09-01T01:20:00.001Z``)."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def moment_of(op: Mapping[str, Any]) -> datetime | None:
    try:
        return parse_gateway_time(str(op.get("operationTime") or ""))
    except (ValueError, IndexError):
        return None


@dataclass
class WindowRead:
    """What a read found: the operations by id, how many calls it took, and what it could not read."""

    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    pages: int = 0
    gaps: list[str] = field(default_factory=list)


class GatewayReads:
    """The gateway calls of one reconciliation, counted, bounded and retried (module docstring)."""

    def __init__(
        self,
        client: Callable[[], Any],
        policy: RetryPolicy,
        *,
        max_calls: int,
        sleep: Callable[[float], None] = time.sleep,
        gate: Gate | None = None,
        held_seconds: float = HELD_SECONDS,
    ) -> None:
        self.client = client
        self.policy = policy
        self.max_calls = max_calls
        self.sleep = sleep
        self.gate = gate
        self.held_seconds = held_seconds
        self.calls = 0
        #: Seconds the gate kept this run's reads waiting so far (bounded by ``held_seconds``).
        self.held = 0.0
        self._slot: float | None = None  # the limiter slot reserved for the next call
        self._slot_after = 0.0  # seconds until it, when a 429 reserved it (waited before asking again)

    def _retried(self, action: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            if self.calls >= self.max_calls:
                raise CallBudgetSpent(f"the run used its {self.max_calls} gateway calls (DURAPAY_RECONCILE__MAX_CALLS)")
            report = self._admit()
            self.calls += 1
            attempt += 1
            try:
                answer = action()
            except GatewayError as exc:
                held = self._judge(exc, report)
                if held:
                    attempt -= 1  # the gate holds every caller: the gateway's state, not this read's try
                if not exc.retryable or attempt >= self.policy.max_attempts:
                    raise
                if not held:
                    self.sleep(self.policy.delay(attempt, getattr(exc, "retry_after", None)))
                continue
            if report and self.gate is not None:
                self.gate.succeeded()
            return answer

    def _admit(self) -> bool:
        """Wait until the gate lets a call go (module docstring); whether to tell it the outcome. Raises
        GatewayHeld once the run has waited ``held_seconds`` in all."""
        if self.gate is None:
            return False
        limited = "a 429's Retry-After (or the gateway's rate limit) holds every caller"
        if self._slot_after > 0:
            self._wait(self._slot_after, limited)
            self._slot_after = 0.0
        while True:
            reservation, self._slot = self._slot, None
            admission = self.gate.take(reservation)
            if admission.verdict == "go":
                return admission.report
            if admission.verdict == "open":
                why = "the gateway's circuit breaker is open (gateway unavailable)"
            elif admission.verdict == "unreachable":
                why = "Redis could not be asked before the call"
            else:
                why = limited
                self._slot = admission.slot
            self._wait(admission.after, why)

    def _wait(self, seconds: float, why: str) -> None:
        pause = max(seconds, 0.05)  # the loop's bound: every turn counts toward held_seconds
        if self.held + pause > self.held_seconds:
            raise GatewayHeld(f"{why}; no read sent after waiting {self.held:.0f}s of {self.held_seconds:.0f}s")
        self.held += pause
        self.sleep(pause)

    def _judge(self, error: GatewayError, report: bool) -> bool:
        """Tell the gate what a call met (as ``tasks.runner`` does for steps); True when the gate now holds
        every caller (the breaker opened, or a 429's hold), so the next turn waits for it instead."""
        gate = self.gate
        if gate is None:
            return False
        if isinstance(error, TransportError | ServerError):
            return gate.failed(error) is not None
        if report:
            gate.succeeded()  # an answer: the gateway is up
        if isinstance(error, RateLimited):
            fresh = gate.limited(error)
            if fresh is not None:
                self._slot, self._slot_after = fresh.slot, fresh.after
                return True
        return False

    def list_operations(self, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        answer = self._retried(lambda: self.client().call(Catalogue.list_operations, request=dict(query)))
        return [op.model_dump(mode="json") for op in answer.operations]

    def get_order(self, order_id: str) -> list[dict[str, Any]]:
        """The operations of one order (``GET /orders/{orderId}``); none when the gateway has no such order."""
        try:
            answer = self._retried(lambda: self.client().call(Catalogue.get_order, order_id))
        except NotFound:
            return []
        return [op.model_dump(mode="json") for op in answer.operations]

    def get_operation(self, operation_id: str) -> dict[str, Any] | None:
        try:
            answer = self._retried(lambda: self.client().call(Catalogue.get_operation, operation_id))
        except NotFound:
            return None
        return dict(answer.model_dump(mode="json"))


def read_window(list_call: ListCall, since: datetime, until: datetime, *, max_records: int, span: timedelta) -> WindowRead:
    """Every operation with ``since <= operationTime <= until``, held together (module docstring): for a
    short window and the tests; a run reads :func:`pages` and holds one at a time."""
    read = WindowRead()
    for page in pages(list_call, since, until, max_records=max_records, span=span, read=read):
        for op in page:
            read.operations[str(op.get("operationId") or "")] = op
    return read


def pages(
    list_call: ListCall, since: datetime, until: datetime, *, max_records: int, span: timedelta, read: WindowRead
) -> Iterator[list[dict[str, Any]]]:
    """The window's operations page by page, newest first, each operation once (module docstring); what
    was read and what could not be is counted in ``read`` (its ``operations`` are left empty).

    The bounds of consecutive queries are inclusive, so an operation at a boundary comes in two pages
    that follow each other (never further apart: a page all at one instant is stepped past), and is
    dropped from the second by the ids of the page before: what a read holds is one page, not the window."""
    before: set[str] = set()
    end = until
    while end > since:
        start = max(since, end - span)
        for page in _read_span(list_call, start, end, max_records, read):
            fresh = [op for op in page if str(op.get("operationId") or "") not in before]
            before = {str(op.get("operationId") or "") for op in page}
            yield [op for op in fresh if op.get("operationId")]
        end = start


def _read_span(
    list_call: ListCall, start: datetime, end: datetime, max_records: int, read: WindowRead
) -> Iterator[list[dict[str, Any]]]:
    to_time = gateway_iso(end)
    to_moment = end
    while True:
        page = list_call({"fromTime": gateway_iso(start), "toTime": to_time, "maxRecords": max_records})
        read.pages += 1
        yield page
        oldest = oldest_of(page)
        if len(page) < max_records:
            return
        if oldest is None:
            read.gaps.append(f"a full page of {max_records} operations, none with a readable operationTime, before {to_time}")
            return
        if oldest[0] < to_moment:
            to_time, to_moment = oldest[1], oldest[0]  # "toTime = lastOperationTime of the last record"
            continue
        # A full page all at the boundary's millisecond, nothing older: more than maxRecords operations at
        # one instant cannot be paged past by time. Step back a millisecond and say what may be missing.
        step = oldest[0] - timedelta(milliseconds=1)
        read.gaps.append(f"more than {max_records} operations at {oldest[1]}: those past the first {max_records} may be missing")
        if step < start:
            return
        to_time, to_moment = gateway_iso(step), step


def oldest_of(page: list[dict[str, Any]]) -> tuple[datetime, str] | None:
    """The oldest readable ``operationTime`` of a page, and the text the gateway wrote for it."""
    oldest: tuple[datetime, str] | None = None
    for op in page:
        moment = moment_of(op)
        if moment is not None and (oldest is None or moment < oldest[0]):
            oldest = (moment, str(op.get("operationTime")))
    return oldest
