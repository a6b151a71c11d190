"""The demo's helpers: a child process gets exactly the demo's settings; ports fall back when taken."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from durapay.config import load_settings
from durapay.service.demo import _coverage, _run_id
from durapay.service.demo.report import Places, Row, next_steps, summary_table
from durapay.service.demo.stack import DemoStack
from durapay.service.processes import port_or_free, settings_env
from durapay.workflows.engine.cards import new_key
from durapay.workflows.flows import REGISTRY


def test_settings_env_reproduces_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(
        {
            "redis_url": "redis://127.0.0.1:7001/0",
            "redis_cluster": True,
            "broker_url": "redis://127.0.0.1:7002/0",
            "gateway": {"base_url": "http://127.0.0.1:9999/api", "api_key": "k-gw", "timeout": 3.0, "connect_timeout": 2.0},
            "engine": {"lease_seconds": 6.0, "key_prefix": "demo"},
            "reconcile": {"daily": False, "daily_at": "04:15", "time_zone": "Europe/Rome"},
            # Lists, maps and secrets inside them (a copy of this rule once gave a child '**********' as its card key).
            "card": {"keys": [new_key("k1"), new_key("k2")]},
            "api": {"key": "k-api", "port": 1234, "keys": {"k-read-0123456789": "read"}},
            "webhooks": {
                "timeout": 2.0,
                "connect_timeout": 0.5,
                "lease_seconds": 6.0,
                "retry_delays": [0.0, 1.5],
                "endpoints": [{"url": "https://hooks.example/in", "secret": "whsec_" + "A" * 24, "events": ["flow.succeeded"]}],
            },
            "schedules": {"check_seconds": 7.0},
        }
    )
    env = settings_env(settings)
    for name in list(env):
        if name.startswith("DURAPAY_"):
            monkeypatch.setenv(name, env[name])
    assert load_settings() == settings


def test_the_demo_runs_no_daily_reconciliation(monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default (production), off in the demo's settings, which its child processes get too."""
    monkeypatch.delenv("DURAPAY_RECONCILE__DAILY")  # tests/conftest.py turns it off for the tests
    base = load_settings()
    assert base.reconcile.daily
    demo = load_settings(DemoStack(base, "r1").overrides(8780, "http://127.0.0.1:8781/api"))
    assert not demo.reconcile.daily
    assert settings_env(demo)["DURAPAY_RECONCILE__DAILY"] == "False"


def test_a_taken_port_falls_back_to_a_free_one() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert port_or_free(busy) != busy
    free = port_or_free(0)
    assert port_or_free(free) == free


def test_run_ids_are_short_enough_for_gateway_order_ids() -> None:
    run = _run_id()
    assert len(f"{run}-99-2") <= 18 and run.isalnum()


def test_every_kind_left_out_of_the_demo_is_a_failing_row() -> None:
    ran = [Row("x", kind, "f1", ["a"], "succeeded", "succeeded", 0.1) for kind in REGISTRY if kind != "moto"]
    missing = _coverage(ran)
    assert [row.kind for row in missing] == ["moto"] and not missing[0].ok
    assert _coverage([*ran, Row("m", "moto", "f2", [], "succeeded", "succeeded", 0.1)]) == []


def test_the_table_and_the_closing_notes() -> None:
    rows = [
        Row("sale", "moto", "f1", ["pay"], "succeeded", "succeeded", 0.1),
        Row("link", "paybylink", "f2", ["create"], "failed", "succeeded", 0.2, problem="no notification"),
    ]
    assert summary_table(rows).title == "durapay demo: 1/2 flows ended as expected"
    places = Places("http://127.0.0.1:8780", "key", "http://127.0.0.1:8781", "redis://127.0.0.1:1/0", "/d/demo", "/d/demo")
    notes = next_steps(places, keep=True)
    assert "X-Api-Key: key" in notes and "DURAPAY_REDIS_URL=redis://127.0.0.1:1/0 durapay flows ls" in notes
    assert "DURAPAY_DATA_DIR=/d/demo durapay flows ls" in notes, "the demo's own store, not the data folder's"
    assert "Ctrl-C" in notes
    after = next_steps(places, keep=False)
    assert "DURAPAY_DATA_DIR=/d/demo durapay flows ls" in after and "durapay demo --keep" in after
    assert "durapay dev" in after and "X-Api-Key" not in after
    unactivated = next_steps(dataclasses.replace(places, cli=".venv/bin/durapay"), keep=False)
    assert "DURAPAY_DATA_DIR=/d/demo .venv/bin/durapay flows ls" in unactivated
