"""``durapay demo`` as a new user runs it: nothing configured, a data folder, the demo's own Valkey.

One run with ``--keep``: every flow kind ends as expected (exit status 0), and while it keeps running
another ``durapay`` command finds the demo's embedded Valkey through the demo's folder. The data
folder's own store, holding a flow of the user's, gets none of the demo's flows nor an event dated by
the demo's clock (months ahead), during the run and after it. SIGTERM then stops everything, Valkey
included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis

import durapay
from durapay.config import load_settings
from durapay.service.runtime import embedded_folder, start_embedded, stop_embedded
from durapay.workflows.flows import REGISTRY
from tests.service.cli.conftest import DURAPAY
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_the_demo_runs_every_kind_keeps_running_and_stops(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DURAPAY_")}
    env["DURAPAY_DATA_DIR"] = str(tmp_path / "data")
    mine = _a_flow_of_mine(tmp_path / "data")
    log_path = tmp_path / "demo.log"
    with log_path.open("wb") as log:
        demo = subprocess.Popen(
            [*DURAPAY, "demo", "--keep", "--api-port", "0", "--simulator-port", "0"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def keeps_running() -> bool:
            assert demo.poll() is None, log_path.read_text()
            return "press Ctrl-C to stop" in log_path.read_text()

        try:
            wait_until(keeps_running, timeout=240, what="the demo to end its flows and keep running")
        except AssertionError as failed:
            raise AssertionError(f"{failed}\n{log_path.read_text()}") from None
        output = log_path.read_text()
        assert "UNEXPECTED" not in output, output
        assert "durapay demo: " in output and "flows ended as expected" in output
        for kind in REGISTRY:
            assert f" {kind} " in output, f"{kind} is not in the demo"
        assert "killed demo-" in output

        demo_env = {**env, "DURAPAY_DATA_DIR": str(tmp_path / "data" / "demo")}
        assert f"DURAPAY_DATA_DIR={tmp_path / 'data' / 'demo'} " in output, "the notes name the demo's own store"
        flows = _flows(demo_env)
        assert {flow["kind"] for flow in flows} == set(REGISTRY)
        _only_mine(env, mine)
        server = json.loads((tmp_path / "data" / "demo" / "valkey" / "server.json").read_text())
    finally:
        demo.send_signal(signal.SIGTERM)
        code = demo.wait(timeout=60)
    assert code == 0, log_path.read_text()
    assert (tmp_path / "data" / "demo" / "valkey" / "appendonlydir").is_dir(), "AOF on"
    assert not (tmp_path / "data" / "demo" / "valkey" / "server.json").exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server["url"], socket_connect_timeout=1).ping()
    _only_mine(env, mine)


def _a_flow_of_mine(data_dir: Path) -> str:
    """A flow in the data folder's own store (no worker runs: it stays ready), as a user's would be. The
    store's Valkey is started here, as ``durapay worker`` would: ``durapay.connect`` starts none."""
    settings = load_settings({"data_dir": str(data_dir), "redis_url": ""})
    _, server = start_embedded(embedded_folder(settings))
    try:
        with durapay.connect(settings) as engine:
            body = {
                "order": {"orderId": "mine-1", "amount": "990", "currency": "EUR"},
                "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
            }
            return engine.start("moto", body).id
    finally:
        if server is not None:
            stop_embedded(server)


def _flows(env: dict[str, str]) -> list[dict[str, object]]:
    listed = subprocess.run(
        [*DURAPAY, "flows", "ls", "--limit", "500", "--json"], env=env, capture_output=True, text=True, check=False
    )
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["flows"])


def _only_mine(env: dict[str, str], mine: str) -> None:
    """The data folder's store: the user's flow alone, and no event dated after now."""
    assert [flow["id"] for flow in _flows(env)] == [mine]
    events = subprocess.run(
        [*DURAPAY, "events", "ls", "--limit", "1000", "--json"], env=env, capture_output=True, text=True, check=False
    )
    assert events.returncode == 0, events.stderr
    latest = time.time() + 60
    future = [e for e in json.loads(events.stdout)["events"] if datetime.fromisoformat(e["timestamp"]).timestamp() > latest]
    assert future == [], future
