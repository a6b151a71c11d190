"""A short soak (``bench/soak.py``): a mixed load on the chaos stack with every retention at ten seconds,
then a wait past them; every key family must come back to its baseline (issue 29)."""

from __future__ import annotations

from typing import Any

from bench.soak import BOUNDED, family, parser, run

#: What the short run must have seen grow and come back: flows, their logs and lookups, their indexes and
#: events, Celery's queue, schedules and their histories.
SEEN = ("flow", "op", "order", "kind", "state", "events", "whk:attempts", "schedule", "schedule_log", "schedules")


def test_a_short_soak_ends_with_every_family_back_at_its_baseline() -> None:
    args = parser().parse_args(["--duration", "8", "--rate", "5", "--retention", "10s", "--schedules", "2", "--sample", "3"])
    args.patience = 60.0
    result: dict[str, Any] = run(args, lambda _: None)
    families = result["families"]
    assert result["flows"] >= 30
    for name in SEEN:
        assert families[name]["peak"]["entries"] > families[name]["baseline"]["entries"], name
    assert result["failing"] == [], {name: families[name] for name in result["failing"]}
    assert families["flow"]["after"]["keys"] == 0 and families["events"]["after"]["entries"] == 0
    assert set(result["bounded"]) <= set(BOUNDED)
    assert all(memory["end"] > 0 for memory in result["processes"].values()), "every process measured"


def test_keys_are_grouped_by_family_not_by_id() -> None:
    assert family("dp:{p3}:flow:f0123456789abcdef", "dp") == "flow"
    assert family("dp:{s1}:schedule_log:s0123456789ab", "dp") == "schedule_log"
    assert family("dp:{p0}:whk:attempts:ep_1234", "dp") == "whk:attempts"
    assert family("dp:alive:worker:w1@host", "dp") == "alive"
    assert family("celery-task-meta-5f3c1c1e-1b2a-4c9e-9a55-0c1f2e3d4b5a", "dp") == "celery:celery-task-meta"
    assert family("_kombu.binding.durapay", "dp") == "celery:_kombu"
