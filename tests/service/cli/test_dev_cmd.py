"""``durapay dev`` as a newcomer runs it: a fresh folder, no setting at all, then README's first curl flow.

One run (it starts five processes): README's curl starts a MOTO payment against it with the printed
key, the flow succeeds and ``durapay flows ls`` in the same folder finds it (the dev's Valkey through
the data folder); the console signs in with the key in Chromium and shows it. Then dev's Valkey is
SIGKILLed: dev starts it again on the same port with its data, and the api, the worker and the
scheduler carry on (a flow started after it, and one on a durable timer, succeed; ``/readyz`` is green
again). Ctrl-C (SIGINT) stops everything, Valkey included, and exits 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.service.cli.conftest import DURAPAY
from tests.service.console.conftest import browser  # noqa: F401 - the fixture, one Chromium for the module
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_first_curl() -> str:
    """The first ``sh`` block of README that runs curl: the newcomer's first flow."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return next(block for block in blocks if "curl " in block)


def test_dev_runs_everything_readme_s_first_flow_the_console_and_survives_valkey(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    # A newcomer's shell: no durapay setting at all (dev's daily reconciliation stays on, as theirs would;
    # should its hour come during the test, it reads the dev store and changes no flow).
    env = {name: value for name, value in os.environ.items() if not name.startswith("DURAPAY_")}
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        dev = subprocess.Popen([*DURAPAY, "dev"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _running(dev, log_path), timeout=180, what="durapay dev to say everything runs")
        output = log_path.read_text()
        key = re.search(r"export KEY=(\S+)", output)
        api = re.search(r"API\s+(http://127\.0\.0\.1:\d+)", output)
        console = re.search(r"Console\s+(\S+/console)", output)
        assert key and api and console, output
        base = api.group(1)

        curl = readme_first_curl().replace("http://127.0.0.1:8780", base)  # another port if 8780 was taken
        ran = subprocess.run(
            ["bash", "-c", curl], env={**env, "KEY": key.group(1)}, capture_output=True, text=True, check=False, timeout=60
        )
        assert ran.returncode == 0, ran.stderr
        started = json.loads(ran.stdout)
        with httpx.Client(base_url=base, headers={"X-Api-Key": key.group(1)}, timeout=10) as http:
            _succeeds(http, started["id"])
            listed = subprocess.run(
                [*DURAPAY, "flows", "ls", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
            )
            assert listed.returncode == 0, listed.stderr
            assert [flow["id"] for flow in json.loads(listed.stdout)["flows"]] == [started["id"]]

            _console_shows(browser, console.group(1), key.group(1), started["id"])

            server_file = tmp_path / ".durapay" / "valkey" / "server.json"
            before = json.loads(server_file.read_text())
            os.kill(before["pid"], signal.SIGKILL)

            def restarted() -> bool:
                now = json.loads(server_file.read_text())
                return bool(now["pid"] != before["pid"] and now["url"] == before["url"] and _answers(now["url"]))

            wait_until(restarted, timeout=60, what="dev to start Valkey again on the same port")
            assert "valkey exited" in log_path.read_text()
            assert http.get(f"/flows/{started['id']}").json()["state"] == "succeeded", "its data came back"
            after = _start(http, "after-kill")
            timed = _start(http, "on-a-timer", params={"run_at": "in 1s"})
            _succeeds(http, after)
            _succeeds(http, timed)
            wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60, what="/readyz green again")
    finally:
        dev.send_signal(signal.SIGINT)
        code = dev.wait(timeout=120)
    output = log_path.read_text()
    assert code == 0, output
    assert "dev      | stopped" in output
    assert not (tmp_path / ".durapay" / "valkey" / "server.json").exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(before["url"], socket_connect_timeout=1).ping()


def _running(dev: subprocess.Popen[bytes], log_path: Path) -> bool:
    assert dev.poll() is None, log_path.read_text()
    return "Press Ctrl-C to stop everything." in log_path.read_text()


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _start(http: httpx.Client, order_id: str, params: dict[str, str] | None = None) -> str:
    """Start a MOTO sale; the API may answer 503 for a moment while it reconnects."""
    body = {
        "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
    }
    answers: list[httpx.Response] = []

    def started() -> bool:
        answers.append(http.post("/flows/moto", json=body, params=params, headers={"Idempotency-Key": order_id}))
        return answers[-1].status_code == 201

    wait_until(started, timeout=30, what=f"the API to start {order_id}")
    return str(answers[-1].json()["id"])


def _succeeds(http: httpx.Client, flow_id: str) -> None:
    wait_until(lambda: http.get(f"/flows/{flow_id}").json()["state"] == "succeeded", timeout=60, what=f"{flow_id} to succeed")


def _console_shows(driver: Any, console_url: str, key: str, flow_id: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{console_url}/login")
    driver.find_element(By.NAME, "name").send_keys("Ada")
    driver.find_element(By.NAME, "key").send_keys(key)
    driver.find_element(By.ID, "sign-in").click()
    wait_until(lambda: driver.find_elements(By.ID, "sign-out"), 15, "the signed-in page")
    driver.get(f"{console_url}/flows")
    wait_until(lambda: flow_id in driver.page_source, 15, "the console's flow list to show the flow")
