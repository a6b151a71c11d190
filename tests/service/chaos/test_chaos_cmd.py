"""``durapay chaos``, a short run: the report is clean AND the chaos really happened (the run under the
crash model, ``--lose-last-writes``, is in test_aof.py: a file of its own, so the two run side by side).

A clean report from a run where nothing was killed, restarted or faulted would prove nothing, so each
run also asserts that workers and the scheduler were SIGKILLed, Redis restarted (its AOF cut with
``--lose-last-writes``), gateway faults fired, the operator acted on flows and money calls were answered
PENDING. Seeds are fixed; the flows, the campaign, the PENDING outcomes, the operator's actions and the
cut points derive from them (each seed here has a PENDING rule aimed early at a call the mix makes
often, a MOTO payment, a refund or a capture, so that one fires in 30 seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.service.chaos.runs import assert_chaos_happened, assert_clean, chaos

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.timeout(900)
def test_a_short_run_with_kills_restarts_and_faults_is_clean(tmp_path: Path) -> None:
    code, report, stderr = chaos(tmp_path, "--seed", "37", "--flows", "30", "--duration", "30")
    assert_clean(code, report, stderr)
    assert_chaos_happened(report)
    assert report["appendfsync"] == "always", "durapay's own default"
    assert report["cuts"] == [], "without --lose-last-writes the AOF is kept whole"


def test_losing_writes_of_a_redis_it_does_not_run_is_refused(tmp_path: Path) -> None:
    code, _, stderr = chaos(tmp_path, "--lose-last-writes", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2
    error = json.loads(stderr.strip().splitlines()[-1])
    assert error["field"] == "--lose-last-writes" and "--redis-url" in error["reason"]
    code, _, stderr = chaos(tmp_path, "--appendfsync", "everysec", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2
    assert json.loads(stderr.strip().splitlines()[-1])["field"] == "--appendfsync"
