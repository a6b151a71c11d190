"""What a deploy needs to know: the code's definitions (the manifest) against every flow in flight.

* :func:`manifest` is what a build runs: per kind its versions (current first) and their steps. A deploy
  pipeline prints it from the build about to ship (``durapay flows manifest --json``).
* :func:`in_flight` reads every flow of the store that may run a step again (:data:`COUNTED`: every
  state but succeeded, so failed and cancelled flows too while their record is kept: a person's retry
  restarts a failed one, and a payment the gateway reports late on a failed or cancelled one stops it in
  needs_attention, where accepting it runs its waiting step) and every live schedule, grouped per kind and
  version: how many, in which states, at which steps, the oldest, and the latest business deadline among
  them (a wait's deadline, a link's expiry, a timer, a reservation's check-out: the flow's due time while
  it waits or sleeps; a schedule's next fire). A succeeded flow is not counted: a late payment beside its
  payment is kept or refunded (``workflows.late_payments``), neither of which runs its steps.
* :func:`check` says, per group, whether a manifest (the new build's, or the code installed) can go
  on with it: a flow needs its own kind and version, and its step among that version's, or a migration
  the manifest declares from its version that :func:`versions.may_move` allows (the claim's rule, on
  what the manifest carries: :func:`versions.shape`); a schedule needs its charges' kind (it starts new
  flows on whatever version is current then). ``durapay deploy check`` exits 1 naming the flows and the
  schedules left with no code to run them (:func:`stranded`).

**A consistent read of a live store.** Flows move between the state indexes while the check reads, so
reading those one after another would miss a flow that moved into one already read. The flows are read
instead from their kind's index (``Keys.by_kind``), which a flow is in from its start until Redis drops
its record, whatever its state, with ``ZSCAN``, which returns every member present for the whole scan:
every flow that exists from the start of the check to its end is seen, once (a flow started meanwhile
may or may not be). The kinds are those of the code the check runs with (``engine.registry``); a flow
of a kind this code does not know is found through the state indexes, read once after (such a flow no
process of this code runs, so it does not move on its own).

Reads are bounded: every index is read in pages of :data:`PAGE` (``ZSCAN COUNT``, ``ZRANGE``), the records
in pipelines of as many; the kind indexes hold the succeeded flows of the retention too, so the check
reads every flow record the store keeps (a few fields each), one pipeline per page.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from durapay.workflows.engine import FlowDefinition, FlowState, versions

#: Flows read per round trip.
PAGE = 500
#: Flow (and schedule) ids named per group in a report (the count is always whole).
NAMED = 1000
#: The states of a flow a deploy must keep code for: every one but succeeded. Failed and cancelled count
#: while their record is kept: a person's retry restarts a failed flow, and a late payment reopens a failed
#: or cancelled one, whose acceptance runs its waiting step (module docstring).
COUNTED = tuple(state for state in FlowState if state is not FlowState.SUCCEEDED)
#: What the check counts, in the words its output says it in.
COUNTED_TEXT = (
    "every flow not finished, and failed and cancelled flows while their record is kept "
    "(a person's retry, or a late payment accepted, runs them again)"
)


def manifest(registry: Mapping[str, FlowDefinition]) -> dict[str, Any]:
    """``{"kinds": {kind: [{version, input, steps: [{name, kind, operation?, signals?, output?}], label,
    current, migrates: [{version, input, steps}]}]}}``: per version and per migration what the migration
    rule judges (:func:`versions.shape`: the input and output schemas as digests)."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for kind, definition in sorted(registry.items()):
        kinds[kind] = [
            {
                **versions.shape(held),
                "label": held.label,
                "current": held is definition,
                "migrates": [versions.shape(old) for old in held.migrates],
            }
            for held in definition.versions().values()
        ]
    return {"kinds": kinds}


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
    #: Per position (the step a flow is at, and the step of its money in flight or ""): what the
    #: migration rule judges, counted for every flow of the group, the flows there named up to
    #: :data:`NAMED` per position (a position refused is never left unnamed).
    positions: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    at_position: dict[tuple[str, str], int] = field(default_factory=dict)
    schedules: int = 0
    #: The schedules named (as many as :data:`NAMED`).
    schedule_ids: list[str] = field(default_factory=list)
    #: The flows a migration cannot move (None: every flow of the group, when it is not runnable).
    left: list[str] | None = None
    #: Filled by :func:`check`: whether the manifest can go on with every flow of the group, and why not.
    runnable: bool = True
    reason: str = ""

    def add(self, flow_id: str, step: str, state: str, created: float, deadline: float | None, unsettled: str = "") -> None:
        self.count += 1
        self.steps[step] = self.steps.get(step, 0) + 1
        self.states[state] = self.states.get(state, 0) + 1
        self.oldest = created if self.oldest is None else min(self.oldest, created)
        self.later(deadline)
        if len(self.flows) < NAMED:
            self.flows.append(flow_id)
        position = (step, unsettled)
        self.at_position[position] = self.at_position.get(position, 0) + 1
        named = self.positions.setdefault(position, [])
        if len(named) < NAMED:
            named.append(flow_id)

    def add_schedule(self, schedule_id: str, next_at: float | None) -> None:
        self.schedules += 1
        self.later(next_at)
        if len(self.schedule_ids) < NAMED:
            self.schedule_ids.append(schedule_id)

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
            "schedule_ids": list(self.schedule_ids),
        }


def _flow_ids(engine: Any) -> Iterator[list[str]]:
    """Every flow id of the store, in pages, each once: per partition, every kind index of the code's kinds
    (``ZSCAN``: a flow present for the whole scan is returned whatever states it moves through), then the
    state indexes of :data:`COUNTED` for the flows not seen there (a kind this code does not know).
    Bounded: each index is read to its end once, in pages of :data:`PAGE`."""
    keys, client = engine.keys, engine.redis
    for partition in range(keys.partitions):
        seen: set[str] = set()  # one partition's ids: ZSCAN may return a member twice
        for kind in sorted(engine.registry):
            cursor = None
            while cursor != 0:
                cursor, members = client.zscan(keys.by_kind(partition, kind), cursor or 0, count=PAGE)
                page = [flow_id for member, _score in members if (flow_id := member.decode()) not in seen]
                seen.update(page)
                if page:
                    yield page
        for state in COUNTED:
            index, start = keys.by_state(partition, state.value), 0
            while True:
                members = client.zrange(index, start, start + PAGE - 1)
                page = [flow_id for member in members if (flow_id := member.decode()) not in seen]
                seen.update(page)
                if page:
                    yield page
                if len(members) < PAGE:
                    break
                start += PAGE


FIELDS = ("kind", "state", "step", "created", "due", "definition", "unsettled", "z")


def _records(engine: Any, ids: list[str]) -> Iterator[tuple[str, dict[str, str]]]:
    """(id, fields of :data:`FIELDS`) of each of ``ids`` whose record exists, in a pipeline or two: a
    packed record (a finished flow, ``workflows.engine.compact``) keeps its step and definition in its packed
    value, so it is read whole and unpacked."""
    from durapay.workflows.engine import FlowRecord

    pipe = engine.redis.pipeline(transaction=False)
    for flow_id in ids:
        pipe.hmget(engine.keys.flow(flow_id), FIELDS)
    packed: list[str] = []
    for flow_id, values in zip(ids, pipe.execute(), strict=True):
        *plain, blob = values  # the packed value is zlib's bytes, never text
        fields = {name: value.decode() for name, value in zip(FIELDS[:-1], plain, strict=True) if value is not None}
        if blob is not None:
            packed.append(flow_id)
        elif fields.get("kind"):  # else: dropped between the index and the read
            yield flow_id, fields
    if packed:
        pipe = engine.redis.pipeline(transaction=False)
        for flow_id in packed:
            pipe.hgetall(engine.keys.flow(flow_id))
        for flow_id, raw in zip(packed, pipe.execute(), strict=True):
            if raw:
                yield flow_id, {name: value for name, value in FlowRecord.parse(raw).fields.items() if name in FIELDS}


def in_flight(engine: Any, *, schedules: Any = None) -> dict[tuple[str, str], Group]:
    """Every flow that may run a step again (:data:`COUNTED`) and, given the scheduler's store, every live
    schedule, per (kind, version). A record with no ``definition`` field is on its kind's first version as
    ``engine.registry`` has it."""
    groups: dict[tuple[str, str], Group] = {}
    counted = {state.value for state in COUNTED}
    for ids in _flow_ids(engine):
        for flow_id, fields in _records(engine, ids):
            kind, state, step = fields["kind"], fields.get("state", ""), fields.get("step", "")
            if state not in counted:
                continue
            definition = fields.get("definition")
            named = versions.recorded(kind, {"definition": definition} if definition else {}, engine.registry)
            group = groups.setdefault(named, Group(*named))
            waits = state in (FlowState.WAITING.value, FlowState.SLEEPING.value)
            due = fields.get("due")
            unsettled = _unsettled_step(fields.get("unsettled"))
            group.add(flow_id, step, state, float(fields.get("created") or 0), float(due) if waits and due else None, unsettled)
    if schedules is not None:
        kind = schedules.flow_kind
        current = engine.registry.get(kind)
        for schedule in _live_schedules(schedules):
            groups.setdefault((kind, "*"), Group(kind, "*")).add_schedule(schedule.id, schedule.next_at)
        if (kind, "*") in groups and current is None:
            groups[(kind, "*")].reason = f"no {kind} kind in this code"
    return groups


def _unsettled_step(text: str | None) -> str:
    """The step of a flow's money in flight (its ``unsettled`` field, JSON), "" when none."""
    if not text:
        return ""
    try:
        found = json.loads(text)
    except ValueError:
        return ""
    return str(found.get("step") or "") if isinstance(found, dict) else ""


def _live_schedules(schedules: Any) -> Iterator[Any]:
    """Every schedule that may still fire, each once however it moves during the check
    (``schedules.store.live_schedules``, the one home of that read)."""
    from durapay.workflows.schedules.store import live_schedules

    store = schedules.store
    return live_schedules(store.redis, store.keys.keys, page=PAGE)


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
    """A migration the manifest declares from ``version``: the flows of ``group`` it cannot move, by why
    (:func:`versions.may_move`, the claim's rule, on the manifest's shapes of both versions); None when no
    version of the manifest migrates from it."""
    for entry in held:
        old = next((item for item in entry.get("migrates") or () if item["version"] == version), None)
        if old is None:
            continue
        refused: dict[str, str] = {}
        for (step, unsettled), named in group.positions.items():
            why = versions.may_move(old, entry, step, unsettled or None)
            if why is not None:
                count = group.at_position[(step, unsettled)]
                refused |= dict.fromkeys(named, f"no migration to {entry['version']}: {why} ({count} flow(s) at {step})")
        return refused
    return None


def stranded(groups: list[Group]) -> list[str]:
    """The flows, then the schedules, a deploy of that code would leave with nothing to run them: what
    ``durapay deploy check`` exits 1 on."""
    refused = [group for group in groups if not group.runnable]
    flows = [flow_id for group in refused for flow_id in (group.flows if group.left is None else group.left)]
    return flows + [schedule_id for group in refused for schedule_id in group.schedule_ids]


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
        row.pop("schedule_ids")
        shown.append(row)
    return shown
