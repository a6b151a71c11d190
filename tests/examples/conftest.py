"""The example projects (``examples/``) on real processes: their folder on the path of this process and of
the workers it starts, as a merchant's deployment has its own package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durapay.config import Settings
from tests.service.cli.conftest import cli_env  # noqa: F401 - a fixture: the CLI's settings (deploy check)
from tests.workflows.integration.processes import ROOT, WorkerProcess

EXAMPLES = ROOT / "examples"


@pytest.fixture
def shop_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``examples/shop`` importable here (``shop.flows``), its modules forgotten afterwards."""
    import sys

    folder = EXAMPLES / "shop"
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in [name for name in sys.modules if name == "shop" or name.startswith("shop.")]:
        del sys.modules[name]


def worker_of(settings: Settings, redis_url: str, name: str, log_dir: Path, *folders: Path) -> WorkerProcess:
    """A ``durapay worker`` process whose path holds ``folders`` (a build's own modules) before the repository."""
    worker = WorkerProcess(settings, redis_url, name, log_dir)
    worker.env["PYTHONPATH"] = ":".join([*(str(folder) for folder in folders), str(ROOT)])
    return worker
