"""One chaos run: start the stack, run the flows while the campaign breaks things, wait, reconcile.

Every random choice derives from the seed (the flow mix and its timing, the campaign's events, the
PENDING outcomes, the operator's actions, where an AOF is cut, the simulator's fault draws), each from
its own generator, so that a change in one does not shift the others.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from durapay.config import Settings
from durapay.service.chaos.campaign import (
    FAULT,
    PEND,
    REDIS_RESTART,
    SCHEDULER_KILL,
    WORKER_KILL,
    Campaign,
    plan,
    plan_pending,
)
from durapay.service.chaos.customer import Customer
from durapay.service.chaos.operator import Operator, plan_operator
from durapay.service.chaos.reconcile import Findings, Ledger, check_events, reconcile, reconcile_schedule
from durapay.service.chaos.report import ChaosReport, recovery
from durapay.service.chaos.stack import ChaosStack
from durapay.service.chaos.workload import Planned, Workload
from durapay.workflows.engine import STOPPED, FlowState, NotDurable
from durapay.workflows.engine import NotFound as ScheduleNotFound
from durapay.workflows.schedules import Schedules, ScheduleState

FINAL_SCHEDULE = frozenset({ScheduleState.COMPLETED, ScheduleState.CANCELLED, ScheduleState.NEEDS_ATTENTION})
TRANSIENT = (redis.RedisError, NotDurable, OSError)
#: While the run waits for the flows: a line this often naming what it waits for (a flow or the schedule).
DRAIN_SAY_SECONDS = 10.0


@dataclass(frozen=True)
class ChaosOptions:
    seed: int
    flows: int
    duration: float
    lose_last_writes: bool = False
    redis_url: str | None = None
    #: The AOF fsync policy of the Valkey it runs itself: ``always`` (durapay's embedded default) or ``everysec``.
    appendfsync: str = "always"
    #: How long to wait for the flows to finish once the campaign is over.
    drain: float = 400.0


def run_chaos(settings: Settings, options: ChaosOptions, say: Callable[[str], None]) -> ChaosReport:
    report = ChaosReport(options.seed, options.duration, options.lose_last_writes)
    report.appendfsync = None if options.redis_url else options.appendfsync
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    # The process id too: two runs of one seed started in the same second must not share a folder.
    folder = (Path(settings.data_dir) / "chaos" / f"seed{options.seed}-{stamp}-{os.getpid()}").resolve()
    report.folder = str(folder)
    stack = ChaosStack(
        settings,
        folder,
        seed=options.seed,
        redis_url=options.redis_url,
        lose_last_writes=options.lose_last_writes,
        appendfsync=options.appendfsync,
    )
    try:
        stack.start(say)
        report.waitaof_honest = stack.waitaof_honest
        Run(stack, options, report, say).go()
    finally:
        stack.stop()
    return report


class Run:
    def __init__(self, stack: ChaosStack, options: ChaosOptions, report: ChaosReport, say: Callable[[str], None]) -> None:
        assert stack.runtime is not None
        self.stack, self.options, self.report, self.say = stack, options, report, say
        self.engine = stack.runtime.engine
        self.schedules = Schedules(self.engine)
        self.customer = Customer(self.engine, stack.admin())
        seed = options.seed
        tag = f"c{seed % 100000}"
        self.workload = Workload(self.engine, random.Random(f"{seed}:workload"), tag, options.flows, 0.8 * options.duration)
        self.events = sorted(
            plan(random.Random(f"{seed}:campaign"), options.duration, redis_restarts=stack.owns_redis)
            + plan_pending(random.Random(f"{seed}:pending"), options.duration),
            key=lambda event: event.at,
        )
        actions = plan_operator(random.Random(f"{seed}:operator"), options.duration)
        self.operator = Operator(self.engine, self.workload, self.customer, actions)
        #: Wall-clock time of the last chaos event (the flows' histories are in wall-clock time).
        self._since = 0.0
        self._settled_late = 0
        self.schedule_id = ""
        self._expected = 0
        self.schedule_count = max(1, min(3, int(options.duration // 80)))

    def go(self) -> None:
        began = time.monotonic()
        campaign = Campaign(self.stack, self.events, began, lose_last_writes=self.options.lose_last_writes)
        self.say(
            f"running {self.options.flows} flows for {self.options.duration:g}s under {len(self.events)} chaos events"
            f" and {self.operator.pending} operator actions"
        )
        campaign.start()
        while True:
            elapsed = time.monotonic() - began
            for planned in self.workload.due(elapsed):
                ready = self.workload.reservation_ready(planned)
                if ready is None:  # the reservation set-up has not finished yet: a little later
                    planned.at = elapsed + 1.0
                    self.workload.planned.append(planned)
                elif ready and not self.workload.start(planned):
                    self.report.not_acknowledged += 1
            self._follow_ups()
            self._customers()
            self.operator.act(elapsed, transient=TRANSIENT)
            if elapsed >= self.options.duration and not self.workload.planned and not self.operator.pending:
                break
            if elapsed >= self.options.duration + 60:  # set-up never finished: its reservations are dropped
                self.workload.planned = []
                self.operator.drop()  # Redis away for a minute: reported as a campaign step that did not run
            time.sleep(0.05)
        campaign.stop()
        campaign.join(timeout=120)
        self._close_campaign(campaign)
        self.say("chaos over: waiting for every flow to finish")
        self.report.finished = self._drain(time.monotonic() + self.options.drain)
        self.operator.close()
        self.report.operator = asdict(self.operator.counts)
        self.report.operator_log = [asdict(taken) for taken in self.operator.taken]
        self.report.problems.extend(self.operator.problems)
        self.report.pending["settled_by_run"] = self.report.pending.get("settled_by_run", 0) + self._settled_late
        if self.report.finished:
            self.report.finished_seconds = max(0.0, self._finished_at - campaign.last_at)
            self._times()
        self.say("reconciling every flow against the gateway's ledger")
        self._reconcile()

    def _close_campaign(self, campaign: Campaign) -> None:
        admin = self.stack.admin()
        rules = admin.faults()["rules"]
        admin.clear_faults()
        self.stack.ensure_running()
        done = campaign.done
        self.report.worker_kills = done[WORKER_KILL]
        self.report.scheduler_kills = done[SCHEDULER_KILL]
        self.report.redis_restarts = done[REDIS_RESTART]
        self.report.fault_rules = done[FAULT]
        self.report.faults_fired = sum(int(rule.get("fired", 0)) for rule in rules)
        # PENDING: no rule outlives the campaign, and nothing stays held (as the faults are cleared).
        pend_rules, settled = self.stack.end_pending()
        fired = {final: 0 for final in ("approved", "declined")}
        for rule in pend_rules:
            fired["approved" if rule["final"] == "000" else "declined"] += int(rule.get("fired", 0))
        self.report.pending = {
            "rules": done[PEND],
            "answered": sum(fired.values()),
            **fired,
            "settled_by_run": len(campaign.settled) + len(settled),
        }
        if done[PEND] != len(pend_rules):
            self.report.problems.append(f"{done[PEND]} pend rules armed, the simulator holds {len(pend_rules)}")
        self.report.cuts = [{**vars(cut), "lost_bytes": cut.lost_bytes} for cut in campaign.cuts]
        self.report.problems.extend(campaign.problems)
        campaign.last_at = max(campaign.last_at, time.monotonic())  # the faults were turned off just now
        self._since = time.time()

    def _customers(self) -> None:
        for planned in self.workload.started[self._expected :]:
            self.customer.expect(planned.flow_id, "challenge" if planned.challenge else planned.kind)
        self._expected = len(self.workload.started)
        self.customer.act()

    # -- follow-ups and the schedule ------------------------------------------------------------------------

    def _follow_ups(self) -> None:
        for parent in list(self.workload.waiting_parents):
            try:
                record = self.engine.get(parent.flow_id)
            except TRANSIENT:
                return
            except Exception:  # noqa: BLE001 - a lost parent is reported by the reconcile
                self.workload.waiting_parents.remove(parent)
                continue
            if record.state not in STOPPED:
                continue
            self.workload.waiting_parents.remove(parent)
            if parent.follow == "hotel":
                self.workload.hotel = (record.outcome or False) if record.state is FlowState.SUCCEEDED else False
                continue
            if record.state is not FlowState.SUCCEEDED:
                continue
            if parent.follow == "schedule":
                self._create_schedule(parent)
                continue
            child = self.workload.follow_up(parent, record.outcome or {})
            if child is not None and not self.workload.start(child):
                self.report.not_acknowledged += 1

    def _create_schedule(self, parent: Planned) -> None:
        """Every minute from two seconds on; one occurrence (a short run) is at the start itself, not at
        the next whole minute, which would keep a short run waiting for up to a minute."""
        start = datetime.now(UTC) + timedelta(seconds=2)
        rule = {"cron": "* * * * *"} if self.schedule_count > 1 else {"every": "days"}
        body = {
            "contractId": parent.body["recurrence"]["contractId"],
            "amount": 1990,
            "currency": "EUR",
            "description": "chaos, every minute",
            "rule": rule,
            "timezone": "UTC",
            "start": start.replace(microsecond=0).isoformat(),
            "count": self.schedule_count,
        }
        deadline = time.monotonic() + 60
        while True:
            try:
                self.schedule_id = self.schedules.create(body, key=f"chaos-schedule-{self.options.seed}").id
                return
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    self.report.problems.append(f"the schedule could not be created: {exc}")
                    return
                time.sleep(0.2)

    # -- the end -------------------------------------------------------------------------------------------

    def _drain(self, deadline: float) -> bool:
        self._finished_at = said = time.monotonic()
        while True:
            self._follow_ups()
            self._customers()
            if self.report.pending.get("rules"):  # a request that took a rule as the rules were cleared
                with contextlib.suppress(Exception):
                    self._settled_late += len(self.stack.admin().settle_pending())
            if not self.workload.waiting_parents and self._all_finished():
                self._finished_at = time.monotonic()
                return True
            if time.monotonic() > deadline:
                return False
            if time.monotonic() >= said + DRAIN_SAY_SECONDS:
                said = time.monotonic()
                self.say(f"still waiting after {said - self._finished_at:.0f}s, for {self.report.slowest.get('finished')}")
            time.sleep(0.5)

    def _times(self) -> None:
        """The engine's own recovery and the time spent waiting on customers, from the flows' histories."""
        histories: dict[str, list[dict[str, Any]]] = {}
        parents: dict[str, str] = {}
        for planned in self.workload.started:
            with contextlib.suppress(Exception):  # a lost flow: the reconcile reports it
                histories[planned.flow_id] = self.engine.history(planned.flow_id)
            if planned.parent is not None:
                parents[planned.flow_id] = planned.parent.flow_id
        found = recovery(histories, parents, self._since)
        self.report.recover_seconds = round(found.engine, 2)
        self.report.waiting_seconds = round(found.waiting, 2)
        self.report.slowest |= {"recover": found.engine_flow, "waiting": found.waiting_flow}

    def _all_finished(self) -> bool:
        """Whether every flow and the schedule have finished; what the run still waits for is noted in
        ``slowest["finished"]`` (once they all have: the last to finish, if the run waited for any)."""
        try:
            for planned in self.workload.started:
                record = self.engine.store.get(planned.flow_id)
                if record is not None and record.state not in STOPPED:
                    self.report.slowest["finished"] = f"{planned.kind} {planned.flow_id} ({record.state.value})"
                    return False
            if self.schedule_id and (schedule := self._schedule()) is not None:
                state = schedule.state
                if state not in FINAL_SCHEDULE:
                    self.report.slowest["finished"] = f"schedule {self.schedule_id} ({state.value})"
                    return False
        except TRANSIENT as exc:
            self.report.slowest["finished"] = f"Redis ({type(exc).__name__})"
            return False
        return True

    def _reconcile(self) -> None:
        ledger = Ledger(self.stack.admin().operations())
        findings = Findings()
        reconcile(self.engine, ledger, self.workload.started, findings)
        check_events(self.engine, self.workload.started, findings)
        if self.schedule_id and (record := self._schedule()) is None:
            # Its acknowledged create lost with the AOF's unsynced tail (a server answering WAITAOF before
            # its fsync, under everysec): counted lost, as a flow gone from Redis is.
            findings.lost.append(f"schedule {self.schedule_id}: gone from Redis although its create was acknowledged")
            self.report.schedule = {"state": "lost", "occurrences": self.schedule_count}
        elif self.schedule_id and record is not None:
            summary = reconcile_schedule(self.engine, ledger, self.schedule_id, findings)
            self.report.schedule = {"state": record.state.value, "occurrences": self.schedule_count, **summary}
            if record.state is not ScheduleState.COMPLETED:
                findings.stuck.append(f"schedule {self.schedule_id}: {record.state.value} ({record.reason})")
        elif any(p.follow == "schedule" for p in self.workload.started):
            self.report.schedule = {"state": "not created (its contract payment did not succeed)"}
        for planned in self.workload.started:
            with contextlib.suppress(Exception):
                flow = self.engine.get(planned.flow_id)
                if flow.state not in STOPPED and not self._has_due(planned.flow_id):
                    findings.stuck.append(f"{planned.kind} {planned.flow_id}: unfinished without a due entry")
        self.report.flows = len(self.workload.started)
        for planned in self.workload.started:
            kind = "three_steps (3DS challenge)" if planned.challenge else planned.kind
            self.report.kinds[kind] = self.report.kinds.get(kind, 0) + 1
        self.report.findings = findings

    def _schedule(self) -> Any:
        """The run's schedule, None when it is gone from Redis (a lost write: the reconcile says so)."""
        try:
            return self.schedules.get(self.schedule_id)
        except ScheduleNotFound:
            return None

    def _has_due(self, flow_id: str) -> bool:
        keys = self.engine.keys
        return self.engine.redis.zscore(keys.due_of(flow_id), flow_id) is not None
