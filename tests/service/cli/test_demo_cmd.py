"""``durapay demo`` as a new user runs it: nothing configured, a fresh data folder, its own Valkey.

One run with ``--keep``: every flow kind ends as expected (exit status 0), and while it keeps running
another ``durapay`` command with nothing configured finds the demo's embedded Valkey through the data
folder. SIGTERM then stops everything, Valkey included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from durapay.workflows.flows import REGISTRY
from tests.service.cli.conftest import DURAPAY
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_the_demo_runs_every_kind_keeps_running_and_stops(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DURAPAY_")}
    env["DURAPAY_DATA_DIR"] = str(tmp_path / "data")
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

        listed = subprocess.run(
            [*DURAPAY, "flows", "ls", "--limit", "500", "--json"], env=env, capture_output=True, text=True, check=False
        )
        assert listed.returncode == 0, listed.stderr
        flows = json.loads(listed.stdout)["flows"]
        assert {flow["kind"] for flow in flows} == set(REGISTRY)
        server = json.loads((tmp_path / "data" / "valkey" / "server.json").read_text())
    finally:
        demo.send_signal(signal.SIGTERM)
        code = demo.wait(timeout=60)
    assert code == 0, log_path.read_text()
    assert (tmp_path / "data" / "valkey" / "appendonlydir").is_dir(), "AOF on"
    assert not (tmp_path / "data" / "valkey" / "server.json").exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server["url"], socket_connect_timeout=1).ping()
