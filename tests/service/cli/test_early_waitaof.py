"""A server whose ``WAITAOF`` answers before its fsync (the bundled Valkey under ``appendfsync everysec``):
``durapay worker``, ``scheduler`` and ``api`` and the commands that write flows refuse to start on it,
unless ``DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF=true`` says the operator accepts losing acknowledged writes
(then they warn). Under ``always`` nothing is refused. Processes run as an operator starts them; the
tests wait on conditions, never on a bare sleep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from durapay.config.embedded import EmbeddedValkey
from tests.service.cli.conftest import DURAPAY, broker_of, invoke
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

MOTO = {
    "order": {"orderId": "early-1", "amount": "1500", "currency": "EUR"},
    "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
}
PROCESSES = [["worker", "--pool", "solo"], ["scheduler"], ["api", "--port", "0"]]


@pytest.fixture(scope="module")
def early_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    with EmbeddedValkey(Path(tmp_path_factory.mktemp("early")), appendfsync="everysec") as server:
        client = redis.Redis.from_url(server.url)
        yield client
        client.close()


@pytest.fixture
def early(cli_env: dict[str, str], early_server: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI's settings pointed at the everysec Valkey; its URL."""
    early_server.config_set("appendfsync", "everysec")
    kwargs = early_server.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}/0"
    monkeypatch.setenv("DURAPAY_REDIS_URL", url)
    monkeypatch.setenv("DURAPAY_BROKER_URL", broker_of(url))
    return url


def keys_written(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(f"{prefix}:*"))


def scheduler_starts(tmp_path: Path) -> str:
    """Start ``durapay scheduler``, wait for its start line, stop it (SIGTERM, exit 0); its output."""
    log_path = tmp_path / "scheduler.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([*DURAPAY, "scheduler"], env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "durapay scheduler: every" in log_path.read_text() or process.poll() is not None, 60, "start")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return log_path.read_text()


@pytest.mark.parametrize("command", PROCESSES, ids=[command[0] for command in PROCESSES])
def test_a_process_refuses_to_start_on_it(early: str, early_server: redis.Redis, command: list[str]) -> None:
    version = early_server.info("server")["valkey_version"]
    done = subprocess.run([*DURAPAY, *command], env=dict(os.environ), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"durapay: Valkey {version} at {early} confirms WAITAOF before its fsync")
    assert "under appendfsync everysec" in lines[0] and "set `appendfsync always`" in lines[0]
    assert "DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF=true" in lines[0]


def test_a_command_writing_flows_refuses_and_writes_nothing(
    early: str, early_server: redis.Redis, cli_env: dict[str, str]
) -> None:
    refused = invoke("start", "moto", "--json", stdin=json.dumps(MOTO))
    assert refused.exit_code == 2, refused.output
    error = json.loads(refused.stderr.strip())
    assert error["error"] == "configuration" and error["field"] == "DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF"
    assert f"Valkey {early_server.info('server')['valkey_version']} at {early}" in error["reason"]
    assert keys_written(early_server, cli_env["DURAPAY_ENGINE__KEY_PREFIX"]) == []
    for command in (["cancel", "f123"], ["retry", "f123"], ["signal", "f123", "3ds_result"]):
        assert invoke("flows", *command).exit_code == 2
    assert invoke("flows", "ls").exit_code == 0, "reading is not refused"


def test_accepted_it_starts_and_warns(early: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF", "true")
    output = scheduler_starts(tmp_path)
    assert "answers WAITAOF before its fsync" in output and "Traceback" not in output
    started = invoke("start", "moto", "--json", stdin=json.dumps(MOTO))
    assert started.exit_code == 0, started.output
    assert json.loads(started.stdout)["state"] in {"ready", "running"}


def test_under_appendfsync_always_nothing_is_refused(early: str, early_server: redis.Redis, tmp_path: Path) -> None:
    early_server.config_set("appendfsync", "always")
    try:
        output = scheduler_starts(tmp_path)
        assert "WAITAOF" not in output
        started = invoke("start", "moto", "--json", stdin=json.dumps(MOTO))
        assert started.exit_code == 0, started.output
    finally:
        early_server.config_set("appendfsync", "everysec")
