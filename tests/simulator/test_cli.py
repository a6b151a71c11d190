"""``durapay simulator`` serves the simulator in the foreground on the port it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from durapay.config import GatewaySettings
from durapay.config.embedded import free_port
from durapay.gateway import Catalogue, GatewayClient
from tests.simulator.support import card, order
from tests.waiting import wait_until

DURAPAY = str(Path(sys.executable).parent / "durapay")


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/_sim/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_durapay_simulator_serves_on_the_given_port_and_saves_its_state(tmp_path: Path) -> None:
    port, state_file = free_port(), tmp_path / "state.json"
    command = [DURAPAY, "simulator", "--port", str(port), "--api-key", "k-cli", "--seed", "3", "--latency-ms", "5"]
    process = subprocess.Popen([*command, "--state-file", str(state_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _healthy(port), timeout=20, what="durapay simulator to listen")
        base_url = f"http://127.0.0.1:{port}/api/phoenix-0.0/psp/api/v1"
        with GatewayClient(GatewaySettings(base_url=base_url, api_key="k-cli")) as client:
            client.call(Catalogue.create_moto_order, request={"order": order("cli-1"), "card": card()})
            assert client.call(Catalogue.get_order, "cli-1").orderStatus.capturedAmount == 1500
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=20)
    assert f"http://127.0.0.1:{port}/api/phoenix-0.0/psp/api/v1" in out.decode()
    assert "cli-1" in json.loads(state_file.read_text())["orders"]


def test_an_invalid_option_exits_2_with_one_line() -> None:
    result = subprocess.run([DURAPAY, "simulator", "--latency-ms", "-1"], capture_output=True, timeout=30, check=False)
    assert result.returncode == 2
    assert b"latency_ms must not be negative" in result.stderr
