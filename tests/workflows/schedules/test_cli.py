"""``durapay schedules``: add, ls, show, pause, resume, amount, cancel, on a real Valkey through the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from durapay.service.cli import build_app


@pytest.fixture
def env(redis_url: str, key_prefix: str) -> dict[str, str]:
    return {"DURAPAY_REDIS_URL": redis_url, "DURAPAY_ENGINE__KEY_PREFIX": key_prefix}


def run(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(build_app(), ["schedules", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


ADD = ("add", "--contract", "ctr-1", "--amount", "1990", "--description", "Gym", "--timezone", "Europe/Rome")


def test_add_list_show_and_steer_a_schedule(env: dict[str, str]) -> None:
    code, out, _ = run(env, *ADD, "--every", "month", "--day", "31", "--start", "2030-01-01T09:00:00", "--key", "gym", "--json")
    assert code == 0
    created = json.loads(out)
    assert created["rule"] == {"every": "month", "day": 31} and created["nextRunLocal"] == "2030-01-31T09:00:00+01:00"
    assert json.loads(run(env, "ls", "--json")[1])[0]["id"] == created["id"]
    assert run(env, "pause", created["id"]) == (0, f"schedule {created['id']}: paused\n", "")
    assert json.loads(run(env, "ls", "--state", "paused", "--json")[1])[0]["state"] == "paused"
    assert json.loads(run(env, "amount", created["id"], "2500", "--json")[1])["amount"] == 2500
    assert run(env, "resume", created["id"])[0] == 0
    code, out, _ = run(env, "show", created["id"], "--history", "--json")
    assert [event["event"] for event in json.loads(out)["history"]][:4] == ["created", "paused", "amount changed", "resumed"]
    code, out, _ = run(env, "show", created["id"])
    assert code == 0 and "next run" in out and "25.00 EUR" in out, "a person reads major units"
    assert run(env, "cancel", created["id"], "--reason", "moved away")[1] == f"schedule {created['id']}: cancelled\n"


def test_refusals_are_one_line_with_status_2(env: dict[str, str]) -> None:
    code, _, err = run(env, *ADD, "--every", "month", "--day", "40")
    assert code == 2 and err.startswith("durapay: schedule: rule.monthly.day:") and err.count("\n") == 1
    code, _, err = run(env, *ADD)
    assert code == 2 and "give --every" in err
    code, _, err = run(env, "pause", "s000000000000")
    assert code == 2 and err == "durapay: no schedule 's000000000000'\n"
    code, out, _ = run(env, *ADD, "--cron", "0 9 * * 1-5", "--json")
    assert code == 0
    schedule_id = json.loads(out)["id"]
    run(env, "cancel", schedule_id)
    code, _, err = run(env, "pause", schedule_id)
    assert code == 2 and "only an active or dunning schedule can be paused" in err
