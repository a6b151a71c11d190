"""The CLI against the test Valkey: ``DURAPAY_*`` set as an operator would, one key prefix per test.

Celery messages the commands send go to database 1 of the test Valkey, so that no other test's
worker picks them up (the flow records stay in database 0 under the test's prefix).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from durapay.config import load_settings
from durapay.service.cli import build_app
from durapay.service.runtime import Runtime, build_runtime

API_KEY = "cli-test-key-0123456789"
DURAPAY = [sys.executable, "-c", "from durapay.service.cli import main; main()"]


def broker_of(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0] + "/1"


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str, tmp_path: Path) -> dict[str, str]:
    card_keys = os.environ["DURAPAY_CARD__KEYS"]  # the suite's key (tests/conftest.py)
    for name in list(os.environ):
        if name.startswith("DURAPAY_"):
            monkeypatch.delenv(name)
    values = {
        "DURAPAY_CARD__KEYS": card_keys,
        "DURAPAY_REDIS_URL": redis_url,
        "DURAPAY_BROKER_URL": broker_of(redis_url),
        "DURAPAY_ENGINE__KEY_PREFIX": key_prefix,
        "DURAPAY_ENGINE__PARTITIONS": "2",
        "DURAPAY_DATA_DIR": str(tmp_path / "data"),
        "DURAPAY_API__KEY": API_KEY,
        "DURAPAY_RECONCILE__DAILY": "false",  # a scheduler started here runs no reconciliation (tests/conftest.py)
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture
def engine_side(cli_env: dict[str, str]) -> Iterator[Runtime]:
    """The same settings as the commands, for setting flows up; sends nothing to Celery."""
    built = build_runtime(load_settings(), redis_url=cli_env["DURAPAY_REDIS_URL"], rng=random.Random(41))
    built.engine.sender = None
    yield built
    built.close()


def invoke(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(build_app(), list(args), input=stdin, env=env)
