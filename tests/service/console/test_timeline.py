"""The timeline model and its SVG, from a hand-written history (no Redis)."""

from __future__ import annotations

from durapay.service.console.timeline import build, svg

T = 1_800_000_000.0
HISTORY = [
    {"t": T, "from": None, "to": "ready", "step": "create", "by": "start", "what": "created"},
    {"t": T + 0.1, "from": "ready", "to": "running", "step": "create", "by": "w1", "what": "claimed create"},
    {
        "t": T + 0.4,
        "from": "running",
        "to": "retrying",
        "step": "create",
        "by": "w1",
        "what": "create will be retried in 0.5s",
        "call": {"op": "create_hpp_order", "status": 503, "ms": 300.0},
    },
    {
        "t": T + 0.9,
        "from": "retrying",
        "to": "running",
        "step": "create",
        "by": "w2",
        "what": "claimed create after the lease ran out",
    },
    {
        "t": T + 1.0,
        "from": "running",
        "to": "ready",
        "step": "payment",
        "by": "w2",
        "what": "create done",
        "call": {"op": "create_hpp_order", "status": "ok", "ms": 100.0, "reconcile": True},
    },
    {"t": T + 1.1, "from": "ready", "to": "running", "step": "payment", "by": "w2", "what": "claimed payment"},
    {"t": T + 1.2, "from": "running", "to": "waiting", "step": "payment", "by": "w2", "what": "payment waits"},
    {"t": T + 5.0, "from": "waiting", "to": "ready", "step": "payment", "by": "notification", "what": "signal notification"},
    {"t": T + 5.1, "from": "ready", "to": "running", "step": "payment", "by": "w1", "what": "claimed payment"},
    {"t": T + 5.2, "from": "running", "to": "succeeded", "step": "payment", "by": "w1", "what": "payment done; flow succeeded"},
]


def test_tries_gaps_calls_takeovers_and_marks() -> None:
    timeline = build(HISTORY, now=T + 10, steps=["create", "payment"])
    assert timeline.lanes == ["create", "payment"]
    kinds = [(span.kind, span.step) for span in timeline.spans]
    assert kinds == [
        ("run", "create"),
        ("backoff", "create"),
        ("run", "create"),
        ("run", "payment"),
        ("wait", "payment"),
        ("run", "payment"),
    ]
    calls = timeline.calls
    assert [(c.call["op"], c.call["status"]) for c in calls] == [("create_hpp_order", 503), ("create_hpp_order", "ok")]
    assert calls[1].call["reconcile"] and timeline.spans[2].takeover
    wait = timeline.spans[4]
    assert wait.ended == "signal notification" and abs(wait.seconds - 3.8) < 1e-6
    assert [mark.label for mark in timeline.marks] == ["created", "signal notification", "succeeded"]
    assert timeline.end == T + 5.2


def test_svg_has_a_lane_per_step_and_a_shape_per_call_with_hover_text() -> None:
    drawing = svg(build(HISTORY, now=T + 10, steps=["create", "payment"]))
    assert drawing.startswith("<svg") and drawing.endswith("</svg>")
    assert drawing.count('class="tl-lane"') == 2
    assert drawing.count("data-op=") == 2 and 'data-takeover="1"' in drawing
    assert "reconcile read" in drawing and "lost worker" in drawing
    assert "http" not in drawing.replace("http://www.w3.org/2000/svg", ""), "nothing from another origin"


def test_text_from_the_history_is_escaped() -> None:
    hostile = [*HISTORY[:2], {**HISTORY[2], "what": "<script>alert(1)</script>"}]
    drawing = svg(build(hostile, now=T + 1, steps=["create"]))
    assert "<script>" not in drawing and "&lt;script&gt;" in drawing


def test_an_empty_history_draws_an_empty_axis() -> None:
    drawing = svg(build([], now=T, steps=["pay"]))
    assert "<svg" in drawing and "data-op" not in drawing
