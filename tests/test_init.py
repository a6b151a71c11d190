"""``durapay``'s public names load on first use: ``import durapay`` (and with it every ``durapay.x``
import, the CLI's shell completion among them) loads no engine, Celery, Redis client or HTTP client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import durapay

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("durapay.workflows.engine.api", "durapay.client", "celery", "redis", "httpx", "fastapi")


def loaded_after(code: str) -> list[str]:
    probe = f"import sys; {code}; print(' '.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True, cwd=ROOT)
    return done.stdout.split()


def test_import_durapay_loads_nothing_heavy() -> None:
    assert loaded_after("import durapay") == []


def test_a_public_name_loads_its_home_only_when_used() -> None:
    assert loaded_after("import durapay; durapay.verify_webhook") == []
    assert "durapay.workflows.engine.api" in loaded_after("import durapay; durapay.connect")


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in durapay.__all__:
        assert getattr(durapay, name) is not None, name
    assert set(durapay.__all__) <= set(dir(durapay))
    assert durapay.verify_webhook.__name__ == "verify"
