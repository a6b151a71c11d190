"""``durapay chaos``, a short run of each kind: the report is clean AND the chaos really happened.

A clean report from a run where nothing was killed, restarted or faulted would prove nothing, so each
run also asserts that workers and the scheduler were SIGKILLed, Redis restarted (its AOF cut with
``--lose-last-writes``), gateway faults fired, the operator acted on flows and money calls were answered
PENDING. Seeds are fixed; the flows, the campaign, the PENDING outcomes, the operator's actions and the
cut points derive from them (each seed here has a PENDING rule aimed early at a call the mix makes
often, a MOTO payment, a refund or a capture, so that one fires in 30 seconds).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.service.cli.conftest import DURAPAY

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def chaos(tmp_path: Path, *args: str, timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DURAPAY_")}
    done = subprocess.run(
        [*DURAPAY, "chaos", "--json", "--data-dir", str(tmp_path / "data"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    return done.returncode, report, done.stderr


def assert_chaos_happened(report: dict[str, Any]) -> None:
    assert report["worker_kills"] >= 2, report
    assert report["scheduler_kills"] >= 1, report
    assert report["redis_restarts"] >= 1, report
    assert report["faults_fired"] >= 1, report
    operator = report["operator"]
    acted = operator["cancels"] + operator["retries"] + operator["late_refunded"] + operator["late_kept"]
    assert acted + operator["refused"] >= 1, report["operator_log"]
    assert report["pending"]["rules"] >= 2 and report["pending"]["answered"] >= 1, report["pending"]
    # The two times after the last chaos event: the engine's own, and the wait on customers, apart.
    assert report["recover_seconds"] is not None and report["waiting_seconds"] is not None, report
    assert report["recover_seconds"] <= report["finished_seconds"] + 1, report


def assert_clean(code: int, report: dict[str, Any], stderr: str, *, may_lose: bool = False) -> None:
    """Nothing wrong; with ``may_lose``, acknowledged flows lost are the one finding allowed (see below)."""
    assert report, stderr[-3000:]
    findings = report["findings"]
    names = ("charged_twice", "not_reflected", "unpaid", "stuck", "events_lost", "events_made_up")
    wrong = {name: findings[name] for name in (*names, *(() if may_lose else ("lost",)))}
    assert all(not lines for lines in wrong.values()), (wrong, report["problems"])
    assert report["finished"] and not report["problems"], report
    assert code == 0 or (may_lose and findings["lost"]), stderr[-3000:]
    # 30 planned; a parent the operator cancelled or a PENDING declined has no follow-up.
    assert report["flows"] >= 25, report
    assert report["schedule"].get("state") == "completed", report["schedule"]


@pytest.mark.timeout(900)
def test_a_short_run_with_kills_restarts_and_faults_is_clean(tmp_path: Path) -> None:
    code, report, stderr = chaos(tmp_path, "--seed", "37", "--flows", "30", "--duration", "30")
    assert_clean(code, report, stderr)
    assert_chaos_happened(report)
    assert report["appendfsync"] == "always", "durapay's own default"
    assert report["cuts"] == [], "without --lose-last-writes the AOF is kept whole"


@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("cc") is None, reason="--lose-last-writes builds its fsync recorder with cc")
def test_a_short_run_losing_the_last_second_of_writes_under_everysec(tmp_path: Path) -> None:
    """Under ``always`` a crash can only lose writes nobody was told of (an fsync precedes each answer),
    so the crash model is exercised under ``everysec``: each restart cuts the AOF's unsynced tail.
    Nothing may be charged twice, charged unreported, stuck, or its events lost. An acknowledged flow
    may be lost only on a server shown to confirm ``WAITAOF`` before its fsync (the bundled Valkey
    does: the report says so), which is why durapay's embedded Valkey runs ``always``."""
    code, report, stderr = chaos(
        tmp_path, "--seed", "38", "--flows", "30", "--duration", "30", "--lose-last-writes", "--appendfsync", "everysec"
    )
    assert report, stderr[-3000:]
    assert report["appendfsync"] == "everysec" and report["waitaof_honest"] is not None, report
    assert_clean(code, report, stderr, may_lose=report["waitaof_honest"] is False)
    assert_chaos_happened(report)
    cuts = report["cuts"]
    assert len(cuts) == report["redis_restarts"] and all(cut["cut_at"] >= cut["floor"] for cut in cuts), cuts
    assert sum(cut["lost_bytes"] for cut in cuts) > 0, "the crash lost nothing: the model was not exercised"


def test_losing_writes_of_a_redis_it_does_not_run_is_refused(tmp_path: Path) -> None:
    code, _, stderr = chaos(tmp_path, "--lose-last-writes", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2
    error = json.loads(stderr.strip().splitlines()[-1])
    assert error["field"] == "--lose-last-writes" and "--redis-url" in error["reason"]
    code, _, stderr = chaos(tmp_path, "--appendfsync", "everysec", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2
    assert json.loads(stderr.strip().splitlines()[-1])["field"] == "--appendfsync"
