"""One reconciliation run: read the window from the gateway, match, judge, act, keep the report.

``Reconciler(engine).run(since, until)`` is what ``durapay reconcile``, ``POST /reconciliation`` and the
scheduler's daily run (``workflows.reconciliation.daily``) call. It reads through the engine's gateway
client (``Engine.gateway``) with the engine's technical retry policy, and never calls the gateway but
to read. Then, for each mismatch (docs/operations.md, Reconciliation):

* one ``reconciliation.mismatch`` merchant event (once per mismatch within the retention);
* on its flow, when there is one, an attention mark (``report.Reports.mark``), and, for a payment the flow
  does not show, the engine's own late-payment path: the payment is delivered to the flow as the gateway
  reported it (``FlowStore.signal`` with ``paid``, by ``reconcile``), which moves a finished flow to
  ``needs_attention`` (``LatePayment``, with ``payment.late`` and ``flow.needs_attention`` events), where
  a person accepts, keeps or refunds it, exactly as for a late notification. A flow that succeeded
  naming money the gateway does not hold keeps its state: its mark says so (why: docs/operations.md).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from redis.exceptions import RedisError

from durapay.config.settings import ReconcileSettings
from durapay.gateway import GatewayError, reported_payment
from durapay.workflows.engine import STOPPED, Engine, FlowRecord, FlowState, inflight
from durapay.workflows.reconciliation import money
from durapay.workflows.reconciliation.findings import MONEY_NOT_SHOWN, Finding, Lookups, Owners
from durapay.workflows.reconciliation.judge import Judge
from durapay.workflows.reconciliation.lease import Lease
from durapay.workflows.reconciliation.report import Report, Reports, new_report_id
from durapay.workflows.reconciliation.window import CallBudgetSpent, GatewayReads, WindowRead, oldest_of, pages

#: Who the flows' logs name for the moves a reconciliation makes.
BY = "reconcile"
#: Lookups per Redis round trip (commands in one pipeline).
BATCH = 1000
#: The newest flows in each state that may hold a post-operation in flight, read when a post-operation
#: no flow recorded is found (``makers``); past it they are not looked at (the finding says no flow).
MAKERS_LIMIT = 10_000
#: The flows that succeeded are read this far below the window's pages: a payment's time (the gateway's
#: clock) may be this much after its flow's end (durapay's clock) and still be matched without a read.
SKEW_SECONDS = 300.0

T = TypeVar("T")


class Reconciler:
    """Give it the engine (and, in tests, the reconciliation settings and a sleep)."""

    def __init__(
        self,
        engine: Engine,
        settings: ReconcileSettings | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        terminal: str = "default",
    ) -> None:
        self.engine = engine
        self.settings = settings or engine.settings.reconcile
        self.sleep = sleep
        #: The gateway terminal this reconciler reads, with its key and through its gate: the gateway lists
        #: a terminal's operations only, so each terminal is its own run (``UnknownTerminal`` for another).
        self.terminal = engine.terminals.check(terminal)
        self.reports = Reports(
            engine.redis,
            engine.keys,
            self.settings.retention_days * 86400,
            lease_seconds=self.settings.lease_seconds,
            terminal=terminal,
        )

    def begin(self, since: float, until: float | None = None, *, by: str = "cli") -> Report:
        """The report of a run of ``[since, until]`` (POSIX seconds; ``until`` None: now), not yet run.
        Raises ValueError for a window that ends before it starts or in the future, or that starts before
        the finished flows' retention (``DURAPAY_ENGINE__RETENTION``): their records are gone, so every
        payment of those days would read as money without a flow (and a window of years is hundreds of
        calls of nothing)."""
        now = self.engine.clock.now()
        until = now if until is None else until
        if not (math.isfinite(since) and math.isfinite(until)):
            raise ValueError(f"the window's bounds must be finite ({since!r}, {until!r})")
        if until <= since:
            raise ValueError(f"the window ends ({_iso(until)}) before it starts ({_iso(since)})")
        if until > now + 60:
            raise ValueError(f"the window ends in the future ({_iso(until)}; now is {_iso(now)})")
        kept = self.engine.settings.engine.retention
        if since < now - kept:
            raise ValueError(
                f"the window starts ({_iso(since)}) before the finished flows' retention ({kept / 86400:g} days, "
                f"DURAPAY_ENGINE__RETENTION: since {_iso(now - kept)} at the earliest): the flows of older payments are gone"
            )
        return Report(id=new_report_id(now), since=since, until=until, started=now, by=by, terminal=self.terminal)

    def run(self, since: float, until: float | None = None, *, by: str = "cli") -> Report:
        """Reconcile the operations of ``[since, until]`` (:meth:`begin`, then :meth:`complete`)."""
        return self.complete(self.begin(since, until, by=by))

    def complete(self, report: Report, lease: Lease | None = None) -> Report:
        """:meth:`judged` under the report's lease (``lease``: taken already, by ``Reports.hold``): kept as
        running while it goes, read as interrupted if this process dies; a run that raises is kept
        interrupted with its error."""
        lease = lease or self.reports.hold(report)
        try:
            return self.judged(report)
        except Exception as exc:
            report.interrupted = f"its run failed: {type(exc).__name__}: {exc}"
            with contextlib.suppress(RedisError):
                self.reports.save(report, now=self.engine.clock.now())
            raise
        finally:
            lease.end()

    def judged(self, report: Report) -> Report:
        """Run ``report``'s window: read, judge, act; the report kept and returned.

        The window is read a page at a time (``window.pages``: at most ``MAX_RECORDS`` operations) and
        each page judged with the flows its operations name, read for it; the flows that succeeded in
        the window are read from their state index a time slice at a time, just ahead of the pages
        (``Ended``), and held only as the little their check needs until the pages show what they name
        (``judge.Judge``). A run holds a page, its flows, and what is still open (mismatches, the
        in-flight items it hands on, checks waiting): its memory does not grow with the window.

        The operations the previous runs left in flight (``Reports.carried``) are read again by id and
        judged with the window's, so an operation PENDING on its day, or of a flow still going then, is
        judged once it settles, whatever later window holds it."""
        since, until = report.since, report.until
        terminal = report.terminal
        reads = GatewayReads(
            lambda: self.engine.gateway(terminal),  # the terminal's key: its operations, and only those
            self.engine.retry_policy,
            max_calls=self.settings.max_calls,
            sleep=self.sleep,
            gate=self.engine.terminals.gate(terminal),
        )
        carried = self.reports.carried(now=report.started)
        judge = Judge(Lookups(reads.get_operation, reads.get_order, self.makers, self.engine.store.many))
        ended = Ended(self.engine, since, until, terminal)
        in_flight: set[str] = set()
        read = WindowRead()
        unread = set(carried.ids)
        judged: set[str] = set()  # the carried operations this run read again and judged
        try:
            lowest = until
            for page in pages(
                reads.list_operations,
                datetime.fromtimestamp(since, UTC),
                datetime.fromtimestamp(until, UTC),
                max_records=self.settings.max_records,
                span=timedelta(days=self.settings.span_days),
                read=read,
            ):
                listed = {str(op["operationId"]) for op in page}
                unread -= listed
                oldest = oldest_of(page)
                lowest = min(lowest, oldest[0].timestamp() if oldest else lowest)
                report.operations += len(page)
                self._page(page, judge, ended.down_to(lowest - SKEW_SECONDS), lowest, report, in_flight)
                judged |= listed & set(carried.ids)
            report.pages, report.gaps = read.pages, read.gaps
            rest = ended.down_to(since)
            for chunk in _chunks(sorted(unread)):
                found = [op for op in (reads.get_operation(operation_id) for operation_id in chunk) if op is not None]
                report.carried += len(found)
                self._page(found, judge, rest, lowest, report, in_flight)
                judged |= set(chunk)
                rest = iter(())
            self._page([], judge, rest, lowest, report, in_flight)
            report.add(judge.resolve(), in_flight)
        except (GatewayError, CallBudgetSpent) as exc:
            report.pages, report.gaps = read.pages, read.gaps
            report.error = f"the gateway could not be read completely: {exc}"
        report.calls = reads.calls
        for finding in report.mismatches:
            self.act(finding, report.id)
        # What was found in flight is handed on even when the run stopped part way: nothing met on its
        # day may escape every later report. Forgotten are only the carried operations this run judged
        # (a stopped run leaves the rest, and those past the retention, to the next).
        done = judged if report.error else set(carried.ids) | set(carried.expired)
        dropped = self.reports.carry(in_flight, done=done, now=report.started)
        if report.error is None:
            for operation_id in sorted(carried.expired):
                since_then = _iso(carried.expired[operation_id])
                report.gaps.append(
                    f"operation {operation_id}, in flight since {since_then}, is no longer followed (past the retention)"
                )
        report.not_followed(dropped)
        report.finished = self.engine.clock.now()
        self.reports.save(report, now=report.finished)
        return report

    def _page(
        self,
        page: list[dict[str, Any]],
        judge: Judge,
        ended: Iterable[list[tuple[float, str]]],
        moment: float,
        report: Report,
        in_flight: set[str],
    ) -> None:
        """Judge one page: first the flows that succeeded down to its time (to be checked), then its
        operations with the flows they name, then the checks the pages have gone past."""
        for chunk in ended:
            for end, flow_id in chunk:
                report.add(judge.ended(flow_id, end), in_flight)
        operations = {str(op["operationId"]): op for op in page}
        owners = self.owners(operations.values())
        report.flows += len(owners.records)
        report.add(judge.page(operations, owners, moment), in_flight)
        report.add(judge.resolve(moment), in_flight)

    def owners(self, operations: Iterable[Mapping[str, Any]]) -> Owners:
        """The flows the engine's lookups name for these operations (by operation id, then order id), and
        their records. Only money and ``PENDING`` operations are looked up (nothing else is judged).

        An operation's lookup lives in the partition of the flow that recorded it, which only that flow
        knows: it is looked for first in the partition of its order's flow (where a payment's is), then,
        if not there (a refund, a capture or a reservation charge is recorded by a flow of its own), in
        every partition. A day of payments costs about one lookup per operation, not one per partition."""
        owners = Owners()
        ops = [op for op in operations if money.is_money(op) or money.in_flight(op)]
        keys = self.engine.keys
        orders = sorted({str(op.get("orderId") or "") for op in ops} - {""})
        for chunk in _chunks(orders):
            answers = self._pipelined([("hget", keys.order(order_id), "flow") for order_id in chunk])
            owners.by_order.update({order_id: value.decode() for order_id, value in zip(chunk, answers, strict=True) if value})
        first = [(str(op.get("operationId") or ""), owners.by_order.get(str(op.get("orderId") or ""))) for op in ops]
        near = [(operation_id, flow) for operation_id, flow in first if flow]
        for pairs in _chunks(near):
            answers = self._pipelined([("get", keys.operation(keys.partition(flow), op_id)) for op_id, flow in pairs])
            owners.by_operation.update({op_id: value.decode() for (op_id, _), value in zip(pairs, answers, strict=True) if value})
        rest = [operation_id for operation_id, _ in first if operation_id not in owners.by_operation]
        for chunk in _chunks(rest, size=max(1, BATCH // keys.partitions)):
            commands = [("get", keys.operation(p, op_id)) for op_id in chunk for p in range(keys.partitions)]
            answers = self._pipelined(commands)
            for index, operation_id in enumerate(chunk):
                found = [value for value in answers[index * keys.partitions : (index + 1) * keys.partitions] if value]
                if found:
                    owners.by_operation[operation_id] = found[0].decode()
        self._load(owners, {*owners.by_operation.values(), *owners.by_order.values()})
        return owners

    def _pipelined(self, commands: Sequence[tuple[str, ...]]) -> list[Any]:
        pipe = self.engine.redis.pipeline(transaction=False)
        for name, *arguments in commands:
            getattr(pipe, name)(*arguments)
        return list(pipe.execute())

    def _load(self, owners: Owners, flow_ids: Iterable[str]) -> None:
        wanted = sorted(set(flow_ids) - set(owners.records))
        for chunk in _chunks(wanted):
            for record in self.engine.store.many(chunk):
                owners.records[record.id] = record

    def makers(self) -> dict[str, list[FlowRecord]]:
        """The flows that may hold a post-operation in flight (not ended, or needing a person, with money
        in flight by a call of ``money.POST_CALLS``), by the operation id their input acts on and by their
        orders: who may have made a post-operation that no flow recorded (``judge.Lookups.maker``)."""
        found: dict[str, list[FlowRecord]] = {}
        states = [state for state in FlowState if state not in STOPPED or state is FlowState.NEEDS_ATTENTION]
        for state in states:
            ids = [flow_id for _, flow_id in self.engine.store.ids(state=state)[:MAKERS_LIMIT]]
            for chunk in _chunks(ids):
                for record in self.engine.store.many(chunk):
                    if (inflight.in_flight(record) or {}).get("op") not in money.POST_CALLS:
                        continue
                    acted_on = str(record.input.get("operationId") or "")
                    for key in {acted_on, *record.orders} - {""}:
                        found.setdefault(key, []).append(record)
        return found

    def act(self, finding: Finding, report_id: str) -> None:
        """The event, the mark and (for a payment a finished flow does not show) the late-payment path."""
        now = self.engine.clock.now()
        self.reports.announce(finding, report_id, now=now)
        if not finding.flow:
            return
        self.reports.mark(finding, report_id, now=now)
        if finding.category == MONEY_NOT_SHOWN and finding.operation:
            self._late_payment(finding.flow, finding.operation, now)

    def _late_payment(self, flow_id: str, operation: Mapping[str, Any], now: float) -> None:
        body = {"operation": dict(operation)}
        paid = reported_payment(body) if money.is_payment(operation) else None
        if paid is None:
            return  # not a payment of the flow (money given back): the mark and the event say it
        engine = self.engine
        result = engine.store.signal(flow_id, "notification", body, now=now, by=BY, safety=engine.safety, paid=paid)
        if result in ("missing", "finished"):
            return
        engine.store.sync(flow_id, f"reconciliation of flow {flow_id}")
        record = engine.store.get(flow_id) if result == "late_payment" else None
        if record is not None:
            engine.orders.keep([record.lookups])  # alive again: its lookups live until it ends (Engine.signal)


class Ended:
    """The flows that succeeded in ``[since, until]`` (their state index's time is their last change),
    newest first, read a time slice at a time just ahead of the window's pages (:meth:`down_to`): ids and
    times only, :data:`BATCH` per partition and round trip."""

    def __init__(self, engine: Engine, since: float, until: float, terminal: str = "default") -> None:
        self.engine = engine
        #: Only the flows of this terminal (their field read, when there is more than one terminal): another
        #: terminal's payments are in its own listing, not in this one.
        self.terminal = terminal if len(engine.terminals.names) > 1 else None
        self.since = since
        self.upper: float | str = until  # inclusive at first, then exclusive: "(<time>"
        self.left = since < until

    def down_to(self, low: float) -> Iterator[list[tuple[float, str]]]:
        """The flows that succeeded from ``low`` (at least ``since``) up to where the last slice ended."""
        low = max(low, self.since)
        upper = self.upper
        if not self.left or (isinstance(upper, float | int) and low > upper):
            return
        self.upper = f"({low}"
        self.left = low > self.since
        keys = self.engine.keys
        offsets = {partition: 0 for partition in range(keys.partitions)}
        while offsets:
            pipe = self.engine.redis.pipeline(transaction=False)
            for partition, offset in offsets.items():
                index = keys.by_state(partition, FlowState.SUCCEEDED.value)
                pipe.zrevrangebyscore(index, upper, low, start=offset, num=BATCH, withscores=True)
            answers = dict(zip(offsets, pipe.execute(), strict=True))
            rows = [(float(score), member.decode()) for found in answers.values() for member, score in found]
            yield self._of_terminal(rows)
            offsets = {partition: offsets[partition] + BATCH for partition, found in answers.items() if len(found) == BATCH}

    def _of_terminal(self, found: list[tuple[float, str]]) -> list[tuple[float, str]]:
        """``found`` less the flows of other terminals (one more round trip per slice, only with terminals)."""
        if self.terminal is None or not found:
            return found
        pipe = self.engine.redis.pipeline(transaction=False)
        for _, flow_id in found:
            pipe.hget(self.engine.keys.flow(flow_id), "terminal")
        named = [value.decode() if isinstance(value, bytes) else value for value in pipe.execute()]
        return [row for row, name in zip(found, named, strict=True) if (name or "default") == self.terminal]


def exit_status(report: Report) -> int:
    """0 when nothing is wrong (every operation accounted for, the whole window read), 1 otherwise."""
    return 0 if report.ok else 1


def _chunks(items: list[T], size: int = BATCH) -> Iterable[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _iso(moment: float) -> str:
    try:
        return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (ValueError, OverflowError, OSError):
        return f"{moment:g} (POSIX seconds, out of range)"
