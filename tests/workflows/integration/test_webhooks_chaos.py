"""The short chaos run of webhooks (``bench/webhooks_chaos.py``; the full size is a command): 60 flows,
the endpoint down for a while then answering 500/429 at random, the worker SIGKILLed once. Every
event arrives at least once, the idempotent receiver applies each id once, none lost, none made up."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.webhooks_chaos import run

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_no_event_is_lost_or_made_up_under_chaos(redis_url: str, tmp_path: Path) -> None:
    figures = run(redis_url, flows=60, down=4.0, fail_rate=0.3, seed=11, timeout=180.0, log_dir=tmp_path, say=lambda _: None)
    assert figures["worker_killed"] and figures["finished"] == 60
    assert figures["lost_count"] == 0 and figures["made_up_count"] == 0, figures
    assert figures["refused_signatures"] == 0 and figures["applied"] == figures["events"] >= 120
    assert figures["answers"].get("500", 0) + figures["answers"].get("429", 0) > 0
