"""What a deploy needs to know: the code's definitions (the manifest) against every flow in flight.

* :func:`manifest` is what a build runs: per kind its versions (current first) and their steps. A deploy
  pipeline prints it from the build about to ship (``durapay flows manifest --json``).
* :func:`in_flight` reads every unfinished flow of the store (every state but the finished ones: a flow
  a person may retry needs its code too) and every live schedule, grouped per kind and version: how
  many, at which steps, the oldest, and the latest business deadline among them (a wait's deadline, a
  link's expiry, a timer, a reservation's check-out: the flow's due time while it waits or sleeps; a
  schedule's next fire).
* :func:`check` says, per group, whether a manifest (the new build's, or the code installed) can go
  on with it: a flow needs its own kind and version, and its step among that version's; a schedule
  needs its charges' kind (it starts new flows on whatever version is current then). ``durapay deploy
  check`` exits 1 naming the flows left with no code to run them.

Reads are bounded: the state indexes are read in pages of :data:`PAGE`, the records in pipelines of as many.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from durapay.workflows import versions
from durapay.workflows.states import TERMINAL, FlowState
from durapay.workflows.steps import FlowDefinition

#: Flows read per round trip.
PAGE = 500
#: Flow ids named per group in a report (the count is always whole).
NAMED = 1000
#: The states of a flow in flight: every one but the finished.
IN_FLIGHT = tuple(state for state in FlowState if state not in TERMINAL)


def manifest(registry: Mapping[str, FlowDefinition]) -> dict[str, Any]:
    """``{"kinds": {kind: [{version, label, current, steps: [{name, kind, operation?, signals?}]}]}}``."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for kind, definition in sorted(registry.items()):
        kinds[kind] = [
            {
                "version": version,
                "label": held.label,
                "current": held is definition,
                "steps": [_step(step) for step in held.steps],
                "migrates": [{"version": old.version, "steps": [_step(step) for step in old.steps]} for old in held.migrates],
            }
            for version, held in definition.versions().items()
        ]
    return {"kinds": kinds}


def _step(step: Any) -> dict[str, Any]:
    shown = versions.describe_step(step)
    return {name: value for name, value in shown.items() if name != "output"}  # schemas: in the version's hash


@dataclass
class Group:
    """The flows (or schedules) of one kind and version in flight."""

    kind: str
    version: str
    count: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    oldest: float | None = None
    latest_deadline: float | None = None
    flows: list[str] = field(default_factory=list)
    #: The step each named flow is at (a migration is judged per flow).
    at: dict[str, str] = field(default_factory=dict)
    schedules: int = 0
    #: The flows a migration cannot move (None: every flow of the group, when it is not runnable).
    left: list[str] | None = None
    #: Filled by :func:`check`: whether the manifest can go on with every flow of the group, and why not.
    runnable: bool = True
    reason: str = ""

    def add(self, flow_id: str, step: str, state: str, created: float, deadline: float | None) -> None:
        self.count += 1
        self.steps[step] = self.steps.get(step, 0) + 1
        self.states[state] = self.states.get(state, 0) + 1
        self.oldest = created if self.oldest is None else min(self.oldest, created)
        self.later(deadline)
        if len(self.flows) < NAMED:
            self.flows.append(flow_id)
            self.at[flow_id] = step

    def later(self, deadline: float | None) -> None:
        if deadline is not None:
            self.latest_deadline = deadline if self.latest_deadline is None else max(self.latest_deadline, deadline)

    def shown(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version or None,
            "count": self.count,
            "schedules": self.schedules,
            "steps": dict(sorted(self.steps.items())),
            "states": dict(sorted(self.states.items())),
            "oldest": self.oldest,
            "latest_deadline": self.latest_deadline,
            "can_continue": self.runnable,
            "reason": self.reason or None,
            "drained": self.count == 0 and self.schedules == 0,
            "flows": list(self.flows),
        }


def _flow_ids(engine: Any) -> Iterator[list[str]]:
    """Every id in a flow-in-flight state index, in pages."""
    keys = engine.keys
    for partition in range(keys.partitions):
        for state in IN_FLIGHT:
            index = keys.by_state(partition, state.value)
            start = 0
            while True:
                page = engine.redis.zrange(index, start, start + PAGE - 1)
                if not page:
                    break
                yield [member.decode() for member in page]
                if len(page) < PAGE:
                    break
                start += PAGE


FIELDS = ("kind", "state", "step", "created", "due", "definition")


def in_flight(engine: Any, *, schedules: Any = None) -> dict[tuple[str, str], Group]:
    """Every unfinished flow (and, given the scheduler's store, every live schedule), per (kind, version).
    A record with no ``definition`` field is on its kind's first version as ``engine.registry`` has it."""
    groups: dict[tuple[str, str], Group] = {}
    for ids in _flow_ids(engine):
        pipe = engine.redis.pipeline(transaction=False)
        for flow_id in ids:
            pipe.hmget(engine.keys.flow(flow_id), FIELDS)
        for flow_id, values in zip(ids, pipe.execute(), strict=True):
            kind, state, step, created, due, definition = (value.decode() if value is not None else "" for value in values)
            if not kind:
                continue  # expired between the index and the read
            named = versions.recorded(kind, {"definition": definition} if definition else {}, engine.registry)
            group = groups.setdefault(named, Group(*named))
            waits = state in (FlowState.WAITING.value, FlowState.SLEEPING.value)
            group.add(flow_id, step, state, float(created or 0), float(due) if waits and due else None)
    if schedules is not None:
        kind = schedules.flow_kind
        current = engine.registry.get(kind)
        for schedule in _live_schedules(schedules):
            group = groups.setdefault((kind, "*"), Group(kind, "*"))
            group.schedules += 1
            group.later(schedule.next_at)
        if (kind, "*") in groups and current is None:
            groups[(kind, "*")].reason = f"no {kind} kind in this code"
    return groups


def _live_schedules(schedules: Any) -> Iterator[Any]:
    from durapay.workflows.schedules.model import ScheduleState

    for state in (ScheduleState.ACTIVE, ScheduleState.DUNNING, ScheduleState.PAUSED, ScheduleState.NEEDS_ATTENTION):
        offset = 0
        while True:
            ids = schedules.store.ids(state=state, limit=PAGE, offset=offset)
            if not ids:
                break
            yield from schedules.store.many(ids)
            if len(ids) < PAGE:
                break
            offset += PAGE


def check(groups: Mapping[tuple[str, str], Group], kinds: Mapping[str, Any]) -> list[Group]:
    """Judge each group against a manifest's ``kinds`` (:func:`manifest`'s): the groups, runnable or not."""
    for (kind, version), group in groups.items():
        held = kinds.get(kind)
        if held is None:
            group.runnable, group.reason = False, f"the code has no kind {kind!r}"
            continue
        if version == "*":  # a schedule: its next charges start on the version current then
            continue
        found = next((entry for entry in held if entry["version"] == version), None)
        if found is None and (moved := _migration(held, version, group)) is not None:
            group.runnable, group.reason, group.left = not moved, "; ".join(sorted(set(moved.values()))), sorted(moved)
            continue
        if found is None:
            group.runnable, group.reason = (
                False,
                f"the code does not hold version {version} of {kind} (it holds {', '.join(e['version'] for e in held)})",
            )
            continue
        names = {step["name"] for step in found["steps"]}
        missing = sorted(step for step in group.steps if step not in names)
        if missing:
            group.runnable, group.reason = False, f"version {version} of {kind} has no step {', '.join(missing)}"
    return sorted(groups.values(), key=lambda group: (group.kind, group.version))


def _migration(held: list[dict[str, Any]], version: str, group: Group) -> dict[str, str] | None:
    """A migration the manifest declares from ``version``: the flows of ``group`` it cannot move (those
    past a step that changed: ``versions.migration``'s rule on the manifest's steps), by why; None when
    no version of the manifest migrates from it."""
    for entry in held:
        old = next((item for item in entry.get("migrates") or () if item["version"] == version), None)
        if old is None:
            continue
        old_names = [step["name"] for step in old["steps"]]
        new_names = [step["name"] for step in entry["steps"]]
        refused: dict[str, str] = {}
        for flow_id, step in group.at.items():
            same = step in old_names and step in new_names
            same = same and old["steps"][: old_names.index(step) + 1] == entry["steps"][: new_names.index(step) + 1]
            if not same:
                refused[flow_id] = f"past a step that changed: no migration to {entry['version']}"
        return refused
    return None


def stranded(groups: list[Group]) -> list[str]:
    """The flows a deploy of that code would leave with nothing to run them."""
    return [flow_id for group in groups if not group.runnable for flow_id in (group.flows if group.left is None else group.left)]


def versions_report(engine: Any, *, schedules: Any = None) -> list[dict[str, Any]]:
    """Per kind and version this code holds, and per version found in the store: in flight, oldest,
    latest deadline, drained (``durapay flows versions``, the console's Versions page)."""
    groups = in_flight(engine, schedules=schedules)
    for (kind, version), _definition in engine.held.items():
        groups.setdefault((kind, version), Group(kind, version))
    rows = check(groups, manifest(engine.registry)["kinds"])
    shown = []
    for group in rows:
        row = group.shown()
        row["held"] = (group.kind, group.version) in engine.held or group.version == "*"
        definition = engine.registry.get(group.kind)
        row["current"] = definition is not None and definition.version == group.version
        row.pop("flows")
        shown.append(row)
    return shown
