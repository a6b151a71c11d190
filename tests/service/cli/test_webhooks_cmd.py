"""``durapay webhooks`` and ``durapay events``: endpoints with the secret printed once, strict options
with exit 2, a test send to a real receiver (exit 1 when it fails), attempts, the feed and a replay."""

from __future__ import annotations

import json

import pytest

from bench._webhook_receiver import WebhookReceiver
from durapay.service.runtime import Runtime
from durapay.workflows.moments import moment_text
from tests.service.cli.conftest import invoke


@pytest.fixture(autouse=True)
def _private_allowed(monkeypatch: pytest.MonkeyPatch, cli_env: dict[str, str]) -> None:
    monkeypatch.setenv("DURAPAY_WEBHOOKS__ALLOW_PRIVATE", "true")


def test_add_ls_test_attempts_rotate_rm(engine_side: Runtime) -> None:
    with WebhookReceiver() as receiver:
        added = invoke("webhooks", "add", receiver.url, "--events", "flow.created,flow.failed", "--json")
        assert added.exit_code == 0, added.output
        endpoint = json.loads(added.stdout)
        assert endpoint["secret"].startswith("whsec_") and endpoint["events"] == ["flow.created", "flow.failed"]
        receiver.secrets = [endpoint["secret"]]
        listed = json.loads(invoke("webhooks", "ls", "--json").stdout)
        assert [e["id"] for e in listed["endpoints"]] == [endpoint["id"]] and "whsec_" not in json.dumps(listed)
        tested = invoke("webhooks", "test", endpoint["id"], "--json")
        assert tested.exit_code == 0 and json.loads(tested.stdout)["status"] == 200
        attempts = json.loads(invoke("webhooks", "attempts", endpoint["id"], "--json").stdout)
        assert attempts[0]["outcome"] == "delivered"
        receiver.answer = lambda body: (500, {})
        assert invoke("webhooks", "test", endpoint["id"]).exit_code == 1
        rotated = json.loads(invoke("webhooks", "rotate", endpoint["id"], "--json").stdout)
        assert rotated["secret"] != endpoint["secret"] and rotated["rotating"]
        assert invoke("webhooks", "rm", endpoint["id"]).exit_code == 0
        missing = invoke("webhooks", "rm", endpoint["id"], "--json")
        assert missing.exit_code == 2 and json.loads(missing.stderr)["error"] == "not_found"


def test_bad_input_exits_2_naming_the_field(engine_side: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    typo = invoke("webhooks", "add", "https://a.example/h", "--events", "flow.succeded", "--json")
    assert typo.exit_code == 2
    error = json.loads(typo.stderr)
    assert error["field"] == "--events" and "did you mean 'flow.succeeded'" in error["reason"]
    monkeypatch.setenv("DURAPAY_WEBHOOKS__ALLOW_PRIVATE", "false")
    private = invoke("webhooks", "add", "https://127.0.0.1/h", "--json")
    assert private.exit_code == 2 and json.loads(private.stderr)["field"] == "url"
    assert invoke("events", "ls", "--after", "p0=x").exit_code == 2
    assert invoke("events", "replay", "--until", "yesterday").exit_code == 2


def test_events_ls_and_replay(engine_side: Runtime) -> None:
    with WebhookReceiver() as receiver:
        endpoint = json.loads(invoke("webhooks", "add", receiver.url, "--json").stdout)
        receiver.secrets = [endpoint["secret"]]
        engine_side.engine.start(
            "moto",
            {
                "order": {"orderId": "cli-wh-1", "amount": "100", "currency": "EUR"},
                "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
            },
        )
        page = json.loads(invoke("events", "ls", "--json").stdout)
        assert [e["type"] for e in page["events"]] == ["flow.created"] and page["next"]
        assert json.loads(invoke("events", "ls", "--after", page["next"], "--json").stdout)["events"] == []
        replayed = invoke("events", "replay", "--endpoint", endpoint["id"], "--json")
        assert replayed.exit_code == 0 and json.loads(replayed.stdout) == {"scheduled": 1}


def test_attempts_say_when_the_next_comes_and_deliver_sends_the_pending_now(engine_side: Runtime) -> None:
    """After a receiver's outage the next attempt came minutes later and nothing said when; an endpoint
    added from the CLI was recorded as added by the API."""
    with WebhookReceiver() as receiver:
        receiver.answer = lambda body: (500, {})
        endpoint = json.loads(invoke("webhooks", "add", receiver.url, "--json").stdout)
        assert [e["source"] for e in json.loads(invoke("webhooks", "ls", "--json").stdout)["endpoints"]] == ["cli"]
        card = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}
        engine_side.engine.start("moto", {"order": {"orderId": "cli-wh-2", "amount": "100", "currency": "EUR"}, "card": card})
        webhooks = engine_side.webhooks
        assert webhooks.fanout() == 1
        [(tag, slot)] = [(tag, slot) for tag, slot in webhooks.slots.items() if engine_side.redis.zcard(slot.due)]
        [member] = [m.decode() for m in engine_side.redis.zrange(slot.due, 0, -1)]
        assert webhooks.deliver(tag, member) is not None  # the first retry comes 5 s later: left as it is
        failed = webhooks.deliver(tag, member)  # the next one, 5 minutes later
        assert failed is not None and not failed["ok"] and failed["nextAt"] > webhooks.now() + 200
        line = invoke("webhooks", "attempts", endpoint["id"]).stdout.splitlines()[0]
        assert line.split("\t")[5] == moment_text(failed["nextAttempt"]), line  # the one rule for times
        moved = invoke("webhooks", "deliver", endpoint["id"], "--json")
        assert moved.exit_code == 0 and json.loads(moved.stdout) == {"due_now": 1}, moved.output
        assert float(engine_side.redis.zscore(slot.due, member)) <= webhooks.now()
        assert json.loads(invoke("webhooks", "deliver", "--json").stdout) == {"due_now": 0}, "nothing left waiting"
