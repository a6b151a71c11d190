"""README and docs/ run as written against ``durapay dev`` (issue 41): one ``durapay dev`` for the module,
started as a newcomer starts it (a fresh folder, no setting but ``DURAPAY_WEBHOOKS__ALLOW_PRIVATE=true``,
for a receiver on this machine), then, in the same folder and a shell with no ``DURAPAY_*`` variable at
all (only ``KEY``, pasted from dev's ``export KEY=...``, and the project's ``.venv/bin`` first on ``PATH``):

* every ``sh`` and ``python`` block of README.md and docs/*.md, in order, each in a process of its own;
  a block that cannot run against dev says why on the line before it
  (``<!-- snippet: not run against dev: <why> -->``); dev's ports replace 8780 and 8781 should it have
  taken others (finding 2: README's HTTP client read ``DURAPAY_API__KEY`` where dev prints ``KEY``);
* every flow kind's example (``workflows.flows.examples``) started as is (finding 8);
* ``durapay webhooks add`` of a loopback URL without the variable exported again (dev shares it),
  ``durapay listen --forward-to`` forwarding events signed, and ``durapay events ls --follow`` (finding 7).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows import REGISTRY
from durapay.workflows.flows.examples import example
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent
MARKER = re.compile(r"^<!-- snippet: not run against dev: (.+\S) -->$")
#: The kinds whose example needs no earlier object: they succeed, or wait for their customer.
STANDALONE = frozenset(
    {"hpp", "paybylink", "three_steps", "svs", "build", "moto", "card_verification", "wallet", "reservation_setup"}
)


@dataclass(frozen=True)
class Snippet:
    where: str
    language: str
    text: str
    skipped: str  # why it is not run, or ""


def snippets() -> list[Snippet]:
    """Every fenced block of README.md, then docs/*.md, with its language and its marker's reason."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        number = 0
        while number < len(lines):
            opened = re.match(r"^```(\w*)$", lines[number])
            if not opened:
                number += 1
                continue
            end = lines.index("```", number + 1)
            marker = MARKER.match(lines[number - 1]) if number else None
            where = f"{path.relative_to(ROOT)}:{number + 1}"
            found.append(
                Snippet(where, opened.group(1), "\n".join(lines[number + 1 : end]) + "\n", marker.group(1) if marker else "")
            )
            number = end + 1
    return found


@dataclass(frozen=True)
class Dev:
    folder: Path
    env: dict[str, str]  # the newcomer's shell: no DURAPAY_* variable, KEY, .venv/bin on PATH
    api: str
    simulator: str

    @property
    def key(self) -> str:
        return self.env["KEY"]

    def run(self, *command: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=self.folder, env=self.env, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )

    def spawn(self, *command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(command, cwd=self.folder, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def shell_without_durapay() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DURAPAY_")}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    """``durapay dev`` in a fresh folder holding the project's ``.venv`` (as a clone would)."""
    folder = tmp_path_factory.mktemp("clone")
    (folder / ".venv").symlink_to(VENV)
    shell = shell_without_durapay()
    log_path = folder / "dev.log"
    with log_path.open("wb") as log:
        started = subprocess.Popen(
            [str(VENV / "bin" / "durapay"), "dev"],
            cwd=folder,
            env={**shell, "DURAPAY_WEBHOOKS__ALLOW_PRIVATE": "true"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def running() -> bool:
            assert started.poll() is None, log_path.read_text()
            return "Press Ctrl-C to stop everything." in log_path.read_text()

        wait_until(running, timeout=180, what="durapay dev to say everything runs")
        banner = log_path.read_text()
        key = re.search(r"export KEY=(\S+)", banner)
        api = re.search(r"API\s+(http://127\.0\.0\.1:\d+)", banner)
        simulator = re.search(r"Simulator\s+(http://127\.0\.0\.1:\d+)", banner)
        assert key and api and simulator, banner
        yield Dev(folder, {**shell, "KEY": key.group(1)}, api.group(1), simulator.group(1))
    finally:
        started.send_signal(signal.SIGINT)
        code = started.wait(timeout=120)
    assert code == 0, log_path.read_text()


def test_every_snippet_of_readme_and_docs_runs_as_written_against_dev(dev: Dev) -> None:
    found = snippets()
    runnable = [snippet for snippet in found if snippet.language in ("sh", "python") and not snippet.skipped]
    assert len(runnable) >= 12, [snippet.where for snippet in runnable]
    marked = [snippet for snippet in found if snippet.skipped]
    assert all(snippet.language in ("sh", "python") for snippet in marked), "a marker stands before a block it skips"
    failures = []
    for snippet in runnable:
        text = snippet.text.replace("http://127.0.0.1:8780", dev.api).replace("http://127.0.0.1:8781", dev.simulator)
        if snippet.language == "sh":
            ran = dev.run("bash", "-e", "-o", "pipefail", "-c", text)
        else:
            ran = dev.run(str(VENV / "bin" / "python"), "-c", text)
        if ran.returncode != 0:
            failures.append(
                f"{snippet.where} ({snippet.language}) exited {ran.returncode}:\n{ran.stdout[-1500:]}{ran.stderr[-3000:]}"
            )
    assert not failures, "\n\n".join(failures)


def test_every_kind_s_example_starts_as_is_against_dev(dev: Dev) -> None:
    with httpx.Client(base_url=dev.api, headers={"X-Api-Key": dev.key}, timeout=30) as http:
        started = {}
        for kind in sorted(REGISTRY):
            answer = http.post(f"/flows/{kind}", json=example(kind).data, params={"wait": 0})
            assert answer.status_code == 201, (kind, answer.text)
            started[kind] = answer.json()["id"]

        def settled() -> dict[str, str] | None:
            """Each example's state once none moves on by itself (the next test listens to the feed)."""
            states = {kind: http.get(f"/flows/{flow_id}").json()["state"] for kind, flow_id in started.items()}
            moving = {FlowState.READY.value, FlowState.RUNNING.value, FlowState.RETRYING.value}
            return states if not set(states.values()) & moving else None

        states = wait_until(settled, timeout=120, what="the examples to stop moving")
    standalone = {kind: state for kind, state in states.items() if kind in STANDALONE}
    assert set(standalone.values()) <= {"succeeded", "waiting"}, standalone


def _line(stream: IO[str] | None) -> dict[str, Any]:
    assert stream is not None
    text = stream.readline()
    assert text, "the process ended without a line"
    return dict(json.loads(text))


def test_a_local_webhook_loop_without_exporting_a_variable_again(dev: Dev) -> None:
    """dev was started with DURAPAY_WEBHOOKS__ALLOW_PRIVATE=true; the CLI's shell does not have it, and a
    loopback endpoint was refused (the variable had to be exported again). dev shares it; ``listen``
    forwards every new event signed (the receiver checks with the independent standardwebhooks package)."""
    with WebhookReceiver() as receiver:
        added = dev.run("durapay", "webhooks", "add", receiver.url, "--json")
        assert added.returncode == 0, added.stderr
        assert dev.run("durapay", "webhooks", "rm", json.loads(added.stdout)["id"]).returncode == 0

        types = "flow.created,flow.succeeded"
        listening = dev.spawn("durapay", "listen", "--forward-to", receiver.url, "--events", types, "--limit", "2", "--json")
        following = dev.spawn("durapay", "events", "ls", "--follow", "--types", types, "--json")
        try:
            ready = _line(listening.stdout)
            assert ready["ready"] and ready["secret"].startswith("whsec_") and ready["forwardTo"] == receiver.url
            receiver.secrets = [ready["secret"]]
            assert "following events after" in (following.stderr.readline() if following.stderr else "")
            body = example("moto").data
            with httpx.Client(base_url=dev.api, headers={"X-Api-Key": dev.key}, timeout=30) as http:
                flow = http.post("/flows/moto", json=body).json()["id"]
            deliveries = [_line(listening.stdout), _line(listening.stdout)]
            assert [d["status"] for d in deliveries] == [200, 200], deliveries
            assert listening.wait(timeout=30) == 0
            shown = [_line(following.stdout) for _ in range(2)]
            assert {event["flow"] for event in shown} == {flow} and shown[0]["type"] == "flow.created", shown
        finally:
            for process in (listening, following):
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)
                process.wait(timeout=30)
        assert following.returncode == 0
        received = [event for event in receiver.received if event.status == 200]
        assert [event.body["flow"] for event in received] == [flow, flow], receiver.received
