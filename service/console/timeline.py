"""A flow's history as a timeline: what ran when, which gateway calls it made, what it waited for.

Why from the log and not from the record: the record is the flow now; the log (``FlowStore.history``)
has every transition with its time. A step's try is the span from its claim (``to: running``) to the
next entry; its completion entry carries the gateway call (``call``: operation, status, latency, and
whether the try only read back what an earlier one did: a reconcile). Between tries: a backoff
(``retrying``), a wait (``waiting``, ended by the next entry: a signal, the deadline) or a sleep. A
claim ``after the lease ran out`` is a lease takeover from a lost worker. A stop for a person
(``needs_attention``) lasts until the operator's action that ended it.

:func:`build` makes the model (tested on its own), :func:`svg` draws it: one lane per step on a shared
time axis, bars for tries (coloured by how they ended), hatched spans for backoffs, light spans for
waits, diamonds for signals and operator actions (only those: the start and the end are small circles, so
that a flow no person or signal touched shows no diamond). Every shape has a ``<title>`` (the hover text) and
``data-`` attributes that the browser tests read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

GAPS = {"retrying": "backoff", "waiting": "wait", "sleeping": "sleep", "needs_attention": "person"}
#: Who acts for a person (an operator's retry or cancel shows as a mark): the surface, before any
#: ``:<name>`` (``console:alice``, ``api:ops-bot``; ``service.api_kinds.who``).
PEOPLE = frozenset({"api", "cli", "console"})


def by_a_person(by: str) -> bool:
    return by.partition(":")[0] in PEOPLE


@dataclass
class Span:
    """A try of a step (``kind`` = ``run``) or the time between tries (``backoff``, ``wait``, ``sleep``)."""

    kind: str
    step: str
    start: float
    end: float
    ended: str = ""  # the state the span ended in (a try) or what ended it (a gap)
    call: dict[str, Any] = field(default_factory=dict)
    takeover: bool = False
    note: str = ""

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class Mark:
    """A moment: a signal delivered or an operator's action (``act``), or the start or the end (``edge``)."""

    t: float
    label: str
    by: str = ""
    kind: str = "act"


@dataclass
class Timeline:
    start: float
    end: float
    lanes: list[str]
    spans: list[Span]
    marks: list[Mark]

    @property
    def calls(self) -> list[Span]:
        return [span for span in self.spans if span.call]

    @property
    def acts(self) -> list[Mark]:
        """The signals and operators' actions (the legend's diamond is shown only when there is one)."""
        return [mark for mark in self.marks if mark.kind == "act"]


def build(history: Sequence[Mapping[str, Any]], *, now: float, steps: Sequence[str] = ()) -> Timeline:
    """The timeline of ``history`` (oldest first). ``steps``: the flow kind's steps, for the lane order;
    ``now`` ends a span still open (a step running, a wait going on)."""
    # A reconciliation's mark (FlowStore.history's ``attention`` entries) is no transition: not drawn.
    entries = sorted((entry for entry in history if "attention" not in entry), key=lambda entry: float(entry.get("t") or 0))
    if not entries:
        return Timeline(now, now, list(steps), [], [])
    spans: list[Span] = []
    marks: list[Mark] = [Mark(float(entries[0]["t"]), "created", str(entries[0].get("by") or ""), "edge")]
    lanes: list[str] = []
    for index, entry in enumerate(entries):
        t = float(entry.get("t") or 0)
        following = entries[index + 1] if index + 1 < len(entries) else None
        end = float(following["t"]) if following else now
        step = str(entry.get("step") or "")
        to = str(entry.get("to") or "")
        what = str(entry.get("what") or "")
        if step and step not in lanes and (to == "running" or entry.get("call")):
            lanes.append(step)
        if to == "running":
            done = following or {}
            spans.append(
                Span(
                    "run",
                    step,
                    t,
                    end,
                    ended=str(done.get("to") or "running"),
                    call=dict(done.get("call") or {}),
                    takeover="lease ran out" in what,
                    note=str(done.get("what") or "still running"),
                )
            )
        elif to in GAPS:
            ended_by = str((following or {}).get("what") or "going on")
            spans.append(Span(GAPS[to], step, t, end, ended=ended_by, note=what))
        by = str(entry.get("by") or "")
        if index and to != "running" and (what.startswith("signal ") or by_a_person(by)):
            marks.append(Mark(t, what, by))
    if entries[-1].get("to") in {"succeeded", "failed", "cancelled", "needs_attention"}:
        marks.append(Mark(float(entries[-1]["t"]), str(entries[-1]["to"]), str(entries[-1].get("by") or ""), "edge"))
    ordered = [step for step in steps if step in lanes] + [step for step in lanes if step not in steps]
    for span in spans:
        if span.step and span.step not in ordered:
            ordered.append(span.step)
    last = max([now if spans and spans[-1].end == now else float(entries[-1]["t"])] + [s.end for s in spans])
    return Timeline(float(entries[0]["t"]), last, ordered, spans, marks)


# -- drawing -----------------------------------------------------------------------------------

WIDTH = 960
LEFT = 170
RIGHT = 20
LANE = 34
TOP = 26


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _span_class(span: Span) -> str:
    if span.kind != "run":
        return f"tl-{span.kind}"
    if span.ended in {"succeeded", "ready", "waiting", "sleeping"}:
        return "tl-run tl-ok"
    if span.ended == "retrying":
        return "tl-run tl-retry"
    if span.ended in {"failed", "cancelled", "needs_attention"}:
        return f"tl-run tl-{span.ended.replace('_', '-')}"
    return "tl-run"


def _label(span: Span) -> str:
    if span.kind == "run":
        call = span.call
        text = f"{span.step}: {span.ended}"
        if call:
            text = f"{call.get('op')} -> {call.get('status')} in {call.get('ms')} ms"
            if call.get("reconcile"):
                text += " (reconcile read)"
        if span.takeover:
            text += "; taken over after the lease ran out (lost worker)"
        return f"{text}; {_seconds(span.seconds)}; {span.note}"
    return f"{span.kind} {_seconds(span.seconds)}: {span.note}; ended by: {span.ended}"


def svg(timeline: Timeline) -> str:
    """The timeline as an inline SVG (no script, no external reference; styled by console.css)."""
    lanes = timeline.lanes or ["(no step ran)"]
    height = TOP + LANE * len(lanes) + 40
    span_seconds = max(timeline.end - timeline.start, 0.001)
    inner = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + (t - timeline.start) / span_seconds * inner

    out = [
        f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" role="img" aria-labelledby="tl-title" '
        f'xmlns="http://www.w3.org/2000/svg" data-steps="{escape(",".join(timeline.lanes))}">',
        '<title id="tl-title">Timeline of the flow: steps on a time axis</title>',
    ]
    for row, lane in enumerate(lanes):
        y = TOP + row * LANE
        out.append(f'<g class="tl-lane" data-step="{escape(lane)}">')
        out.append(f'<rect class="tl-lane-bg" x="{LEFT}" y="{y}" width="{inner}" height="{LANE - 6}"/>')
        out.append(f'<text class="tl-lane-name" x="{LEFT - 8}" y="{y + LANE / 2}" text-anchor="end">{escape(lane)}</text>')
        out.append("</g>")
    for span in timeline.spans:
        row = lanes.index(span.step) if span.step in lanes else 0
        y = TOP + row * LANE
        left = x(span.start)
        width = max(x(span.end) - left, 4.0)
        pad = 4 if span.kind == "run" else 10
        attrs = f'data-kind="{span.kind}" data-step="{escape(span.step)}"'
        if span.call:
            attrs += f' data-op="{escape(str(span.call.get("op")))}" data-status="{escape(str(span.call.get("status")))}"'
        if span.takeover:
            attrs += ' data-takeover="1"'
        out.append(
            f'<rect class="{_span_class(span)}" {attrs} x="{left:.1f}" y="{y + pad / 2:.1f}" width="{width:.1f}" '
            f'height="{LANE - 6 - pad}"><title>{escape(_label(span))}</title></rect>'
        )
    base = TOP + LANE * len(lanes)
    out.append(f'<line class="tl-axis" x1="{LEFT}" y1="{base}" x2="{LEFT + inner}" y2="{base}"/>')
    for tick in range(5):
        t = timeline.start + span_seconds * tick / 4
        anchor = "start" if tick == 0 else "end" if tick == 4 else "middle"
        label = f"+{_seconds(t - timeline.start)}"
        out.append(f'<text class="tl-tick" x="{x(t):.1f}" y="{base + 16}" text-anchor="{anchor}">{label}</text>')
    for mark in timeline.marks:
        mx = x(mark.t)
        label = escape(mark.label[:40])
        title = f"<title>{escape(mark.label)}{' by ' + escape(mark.by) if mark.by else ''}</title>"
        if mark.kind == "act":
            shape = f'<path class="tl-mark" data-mark="{label}" d="M{mx:.1f} {TOP - 14} l5 5 l-5 5 l-5 -5 z">'
            out.append(f"{shape}{title}</path>")
        else:
            out.append(f'<circle class="tl-edge" data-edge="{label}" cx="{mx:.1f}" cy="{TOP - 9}" r="3">{title}</circle>')
    out.append("</svg>")
    return "".join(out)
