"""The crash model of ``--lose-last-writes``: what a completed fsync covered survives the cut, always.

A real Valkey with the fsync recorder preloaded: writes covered by a logged (completed) fsync are
kept however the cut is drawn (here at its lowest point, the most a crash may lose), and what came
after may go. Then a short ``durapay chaos`` run under the model (``--lose-last-writes``, ``everysec``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis

from durapay.service.chaos.aof import FsyncRecorder, crash_model_valkey, current_incr, stop_and_cut, waitaof_waits_for_fsync
from tests.service.chaos.runs import assert_chaos_happened, assert_clean, chaos
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")]


def test_the_cut_never_goes_below_a_completed_fsync(tmp_path: Path) -> None:
    recorder = FsyncRecorder(tmp_path / "model").build()
    server = crash_model_valkey(tmp_path / "valkey", recorder, "everysec")
    server.start()
    try:
        recorder.started(server.data_dir)
        client = redis.Redis.from_url(server.url)
        for n in range(100):
            client.set(f"kept{n}", "x" * 50)
        current = current_incr(server.data_dir)
        assert current is not None
        written = current.stat().st_size
        # The periodic fsync (within about a second under everysec) covers them.
        wait_until(lambda: (recorder.fsynced(current) or 0) >= written, timeout=10, what="an fsync of the first writes")
        for n in range(2000):
            client.set(f"maybe{n}", "y" * 50)
        client.close()
        cut = stop_and_cut(server, recorder, lambda low, high: low)  # the most a crash may lose
        assert cut is not None and cut.floor >= written and cut.cut_at == cut.floor
        server.start()
        client = redis.Redis.from_url(server.url)
        assert all(client.exists(f"kept{n}") for n in range(100)), "an fsynced write was lost"
        assert client.dbsize() <= 2100
        client.close()
    finally:
        server.stop()


def test_a_server_restart_counts_what_it_loaded_as_durable(tmp_path: Path) -> None:
    """After a restart the file's content came from disk: the next cut never goes below it, even before
    any new fsync is logged."""
    recorder = FsyncRecorder(tmp_path / "model").build()
    server = crash_model_valkey(tmp_path / "valkey", recorder, "everysec")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        client.set("before", "1")
        client.close()
        server.stop()  # graceful: the AOF is flushed and fsynced
        server.start()
        recorder.started(server.data_dir)
        current = current_incr(server.data_dir)
        assert current is not None
        loaded = current.stat().st_size
        cut = stop_and_cut(server, recorder, lambda low, high: low)
        assert cut is not None and cut.cut_at >= loaded
        server.start()
        assert redis.Redis.from_url(server.url).get("before") == b"1"
    finally:
        server.stop()


def test_the_server_check_tells_whether_waitaof_waits_for_the_fsync(tmp_path: Path) -> None:
    """The bundled Valkey answers ``WAITAOF 1 0`` under ``everysec`` before any fsync covers the write
    when the last fsync was under a second ago: the recorder sees it. (When a fixed server ships, this
    turns True: then the everysec row of docs/durability.md holds again.)"""
    recorder = FsyncRecorder(tmp_path / "model").build()
    server = crash_model_valkey(tmp_path / "valkey", recorder, "everysec")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        assert waitaof_waits_for_fsync(client, server.data_dir, recorder) is False
        client.close()
    finally:
        server.stop()


@pytest.mark.chaos
@pytest.mark.timeout(900)
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
