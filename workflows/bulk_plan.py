"""A bulk action's dry run: which flows a filter matches, and what the action would do to each.

The filter (kind, state, error code, creation window) is walked through the flow listing
(``workflows.listing``: cursor pages, each within its read budget), at most ``max_flows`` matches and
:data:`READ_FACTOR` times as many index entries read; each match is judged by the rule the engine asks
before it acts (``workflows.engine.operator_actions``), so the dry run's skips are the action's. The action
itself, its record and runner, are ``workflows.bulk``'s.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from durapay.workflows.engine import FlowRecord, FlowState, Seen, UnknownTerminal, mask, mask_text, operator_actions
from durapay.workflows.flow_money import minor_money, totals
from durapay.workflows.listing import READ_BUDGET, Cursor, FlowListing

if TYPE_CHECKING:
    from durapay.workflows.engine import Engine

Action = Literal["retry", "cancel"]
ACTIONS: tuple[Action, ...] = ("retry", "cancel")
#: The filter's names, in the order the action's id is derived from the filter as given.
FILTERS = ("kind", "state", "error", "since", "until", "terminal")
#: Flows shown by a dry run, and skipped flows kept with their reason in a record.
SAMPLE = 20
#: Seconds a dry run is kept for its confirmation (then: make a new one); once confirmed, its flows are
#: kept with the action's record, for the action's retention.
KEPT_SECONDS = 3600
#: Index entries a walk may read per flow it may match: past ``max_flows * READ_FACTOR`` it stops.
READ_FACTOR = 20
#: Rows a page of the walk asks for.
PAGE = 500


class TooMany(ValueError):
    """The filter matches more flows than one bulk action may act on."""


@dataclass(frozen=True)
class BulkFilter:
    """Which flows: of a kind, in a state, with an error code, created within a window (POSIX seconds)."""

    kind: str | None = None
    state: FlowState | None = None
    error: str | None = None
    since: float | None = None
    until: float | None = None
    #: Only the flows of this gateway terminal (``workflows.engine.terminals``): a terminal's outage, retried alone.
    terminal: str | None = None

    def __post_init__(self) -> None:
        # The error code is free text as given: a card number typed there is masked where the filter is
        # made, so no record, dry run or answer repeats it (workflows.engine.sensitive). No code is such a number.
        if self.error is not None:
            object.__setattr__(self, "error", mask_text(self.error))

    def matches(self, record: FlowRecord) -> bool:
        if self.kind is not None and record.kind != self.kind:
            return False
        if self.state is not None and record.state is not self.state:
            return False
        if self.error is not None and self.error not in error_codes(record.error):
            return False
        if self.since is not None and record.created < self.since:
            return False
        if self.terminal is not None and record.terminal != self.terminal:
            return False
        return not (self.until is not None and record.created > self.until)

    def view(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "state": self.state.value if self.state is not None else None,
            "error": self.error,
            "since": self.since,
            "until": self.until,
            "terminal": self.terminal,
        }

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> BulkFilter:
        state = data.get("state")
        return cls(
            data.get("kind"),
            FlowState(state) if state else None,
            data.get("error"),
            data.get("since"),
            data.get("until"),
            data.get("terminal"),
        )


def error_codes(error: Mapping[str, Any] | None) -> set[str]:
    """The codes a flow's error answers to: its type (``PaymentDeclined``, ``GatewayUnavailable``), the
    ISO response code of a decline, and the gateway's own error codes (``PS0026``)."""
    if not error:
        return set()
    codes = {str(error.get("type") or "")}
    if error.get("responseCode"):
        codes.add(str(error["responseCode"]))
    for item in error.get("errors") or []:
        if isinstance(item, Mapping) and item.get("code"):
            codes.add(str(item["code"]))
    return codes - {""}


def plan_token() -> str:
    """A fresh dry run's token: the action it confirms carries it (``workflows.bulk``)."""
    return uuid.uuid4().hex


def asked_of(wanted: BulkFilter) -> dict[str, str]:
    """The filter as text, when its caller gave none (a Python caller's :class:`BulkFilter`)."""
    return {name: str(value) for name, value in wanted.view().items() if value is not None}


def entry(flow_id: str, seen: Seen) -> str:
    """A kept flow, as a dry run keeps it (``<id> <version>[p] <state>``: about 36 bytes)."""
    return f"{flow_id} {seen.text()}"


def parse_entry(text: str) -> tuple[str, Seen | None]:
    """:func:`entry` read back; a bare id (a list posted by a version before dry runs kept what they
    showed) has no ``Seen``: it is acted on as it is then."""
    flow_id, _, seen = text.partition(" ")
    return flow_id, Seen.parse(seen) if seen else None


@dataclass
class Plan:
    """A dry run: the flows that match (newest first), each with what it was shown at (``Seen``: its state
    and version), a sample of them (:func:`brief`: with their money), what the action would skip by
    reason, and the money of the flows it would act on, by currency (minor units). ``token``: this dry
    run's own, which the action confirming it carries; ``asked``: the filter as its caller wrote it
    (``since=1h``), which a confirmation must repeat, while ``filter`` holds it resolved at the dry run
    (relative times fixed then)."""

    action: Action
    filter: BulkFilter
    flows: list[tuple[str, Seen | None]]
    sample: list[dict[str, Any]]
    skips: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    asked: dict[str, str] = field(default_factory=dict)
    token: str = field(default_factory=plan_token)
    created: float = 0.0

    @property
    def ids(self) -> list[str]:
        return [flow_id for flow_id, _ in self.flows]

    def view(self) -> dict[str, Any]:
        return {
            "plan": self.token,
            "action": self.action,
            "filter": self.filter.view(),
            "asked": dict(self.asked),
            "created": self.created,
            "kept_until": self.created + KEPT_SECONDS,
            "count": len(self.flows),
            "would_skip": sum(self.skips.values()),
            "skips": dict(self.skips),
            "totals": dict(self.totals),
            "sample": list(self.sample),
        }

    @classmethod
    def kept(cls, view: Mapping[str, Any], entries: list[str]) -> Plan:
        """A dry run as kept (``workflows.bulk``): its view and its flows' entries."""
        return cls(
            view["action"],
            BulkFilter.parse(view["filter"]),
            [parse_entry(text) for text in entries],
            list(view["sample"]),
            dict(view["skips"]),
            dict(view["totals"]),
            dict(view["asked"]),
            view["plan"],
            float(view["created"]),
        )


def brief(record: FlowRecord) -> dict[str, Any]:
    """A listed flow as a dry run shows it: what it is, what it was shown at, and its money (the outcome's
    when it names one, else the request's: ``workflows.flow_money``; minor units, as on the wire)."""
    money = minor_money(record.outcome, record.input)
    return {
        "id": record.id,
        "kind": record.kind,
        "state": record.state.value,
        "version": record.version,
        "created": record.created,
        "error": mask(record.error, record.identifiers),  # its operation ids whole
        "amount": money[0] if money else None,  # minor units, as on the wire
        "currency": (money[1] or None) if money else None,
    }


def reason_class(reason: str, flow_id: str) -> str:
    """A refusal's reason without its flow id, to count skips by reason."""
    return re.sub(r"\s+", " ", reason.replace(f"flow {flow_id} ", "flow ").replace(flow_id, "<flow>")).strip()[:200]


def plan_flows(
    engine: Engine, action: Action, wanted: BulkFilter, max_flows: int, asked: Mapping[str, str] | None = None
) -> Plan:
    """Walk the filter (``workflows.listing``, bounded) and judge each match as the action would
    (``workflows.engine.operator_actions``, the rule the engine asks): :class:`TooMany` past ``max_flows``.
    ``asked``: the filter as its caller wrote it (default: :func:`asked_of`)."""
    # The filter as asked is kept with the dry run and shown: its text masked where it is written.
    asked = mask(dict(asked)) if asked is not None else asked_of(wanted)
    if wanted.kind is not None:
        engine.definition(wanted.kind)  # an unknown kind: InputError naming the known ones
    if wanted.terminal is not None and wanted.terminal not in engine.terminals.names:
        from durapay.workflows.engine import InputError  # (the engine imports nothing of bulk actions)

        raise InputError("bulk", "terminal", str(UnknownTerminal(wanted.terminal, engine.terminals.names)))
    listing = FlowListing(engine.store, engine.registry)
    states = [wanted.state] if wanted.state is not None else []
    flows: list[tuple[str, Seen | None]] = []
    sample: list[dict[str, Any]] = []
    skips: dict[str, int] = {}
    moneys: list[tuple[int, str] | None] = []
    after: Cursor | None = None
    budget = max(READ_BUDGET, max_flows * READ_FACTOR)
    while True:
        page = listing.page(
            states=states,
            kind=wanted.kind,
            since=wanted.since,
            until=wanted.until,
            limit=PAGE,
            after=after,
            budget=READ_BUDGET,
            terminal=wanted.terminal,
        )
        budget -= max(len(page.records), PAGE)
        for record in page.records:
            if not wanted.matches(record):
                continue
            flows.append((record.id, Seen.of(record)))
            if len(flows) > max_flows:
                raise TooMany(
                    f"more than {max_flows} flows match: a dry run keeps each flow it lists, for its confirmation "
                    f"to act on exactly those, and keeps at most {max_flows} (DURAPAY_BULK__MAX_FLOWS); narrow the "
                    "filter (a kind, a state, a time window) and make a dry run of each part"
                )
            if len(sample) < SAMPLE:
                sample.append(brief(record))
            refused = operator_actions.refusal(record, action)
            if refused is not None:
                reason = reason_class(refused, record.id)
                skips[reason] = skips.get(reason, 0) + 1
            else:
                moneys.append(minor_money(record.outcome, record.input))
        if page.next is None:
            return Plan(action, wanted, flows, sample, skips, totals(moneys), asked, created=engine.clock.now())
        if budget <= 0:
            raise TooMany("the filter steps over too many flows to walk: narrow it (a kind, a state, a time window)")
        after = page.next
