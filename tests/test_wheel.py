"""durapay as a user installs it: the built wheel, in a fresh virtual environment, beside a project of its own.

The wheel is built with ``python -m build`` from a copy of this checkout's source (never its
``build/`` folder), holds only files of the source, and is installed with pip into a new environment.
Its dependencies are this test environment's (a path entry to its site-packages, which holds durapay
only as an editable-install hook that such an entry never runs): installing them from the registry
again would make the test slow and dependent on the network, and says nothing about durapay.

The project beside it has ``config/__init__.py`` and ``tasks.py`` on ``sys.path`` first, as
cookiecutter-django and most Celery projects do. Everything durapay runs there (a worker, the API, and
README's "From Python" example as written) must use durapay's own modules, and the project's modules
stay the project's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from durapay.config.embedded import EmbeddedValkey, free_port
from durapay.simulator import SimulatorConfig, SimulatorServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("config", "gateway", "tasks", "workflows", "service", "simulator")
#: What a build reads: the project's metadata and the package (durapay/ and the folders it links).
SOURCE = ("pyproject.toml", "README.md", "durapay", *PACKAGES)
DATA = (".lua", ".html", ".zdict", ".js", ".css", ".svg")
API_KEY = "wheel-test-key-0123456789"
README_API = "http://127.0.0.1:8780"


@dataclass
class Installed:
    python: Path
    durapay: Path
    added: set[str]
    scripts: set[str]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the source alone (SOURCE, caches left out): built in the checkout, setuptools
    reuses its ``build/lib``, and a module deleted or renamed since the last build shipped still."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCE:
        if (ROOT / name).is_dir():  # the symlinks in durapay/ stay links, to the copied folders
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("durapay-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    home = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True, timeout=120)
    python = home / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()
    )  # fmt: skip
    (site / "durapay_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    before, scripts_before = set(os.listdir(site)), set(os.listdir(home / "bin"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    added = set(os.listdir(site)) - before - {"__pycache__"}
    return Installed(python, home / "bin" / "durapay", added, set(os.listdir(home / "bin")) - scripts_before)


def test_the_wheel_holds_the_package_and_its_data_alone(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = wheel.name.split("-py3")[0] + ".dist-info"
    assert {name.split("/", 1)[0] for name in names} == {"durapay", dist_info}
    shipped = [name for name in names if not name.startswith(f"{dist_info}/")]
    assert [name for name in shipped if not (ROOT / name).is_file()] == [], "files of no source file (a stale build?)"
    assert not [name for name in names if "/tests/" in name or "/bench/" in name or "__pycache__" in name]
    assert "durapay/py.typed" in names and "durapay/__init__.py" in names
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", *DATA) and "__pycache__" not in path.parts:
                assert f"durapay/{path.relative_to(ROOT).as_posix()}" in names, f"{path} is not in the wheel"


def test_pip_install_adds_only_durapay(installed: Installed) -> None:
    assert {re.sub(r"-[^-]+\.dist-info$", ".dist-info", name) for name in installed.added} == {"durapay", "durapay.dist-info"}
    assert installed.scripts == {"durapay"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A merchant's project: a ``config`` package and a ``tasks`` module of its own."""
    folder = tmp_path / "shop"
    (folder / "config").mkdir(parents=True)
    (folder / "config" / "__init__.py").write_text('WHOSE = "the shop"\n')
    (folder / "tasks.py").write_text('WHOSE = "the shop"\n')
    return folder


def readme_block(heading: str) -> str:
    """The first ``python`` block of README's section ``heading``, as written."""
    section = (ROOT / "README.md").read_text().split(f"\n{heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


@pytest.fixture
def stack(installed: Installed, project: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A Valkey, the simulator, and the installed ``durapay worker`` and ``durapay api`` run from the
    project's folder with the project first on ``sys.path``."""
    valkey = EmbeddedValkey(tmp_path / "valkey")
    valkey.start()
    port = free_port()
    env = {
        "PATH": f"{installed.durapay.parent}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(project),
        "DURAPAY_REDIS_URL": valkey.url,
        "DURAPAY_DATA_DIR": str(tmp_path / "data"),
        "DURAPAY_API__KEY": API_KEY,
        "KEY": API_KEY,  # README's client reads the key durapay dev prints (export KEY=...)
        "SHOP_DURAPAY_URL": f"http://127.0.0.1:{port}",
        "DURAPAY_ENGINE__LEASE_SECONDS": "10",
        "DURAPAY_GATEWAY__TIMEOUT": "5",
        "DURAPAY_CARD__KEYS": os.environ["DURAPAY_CARD__KEYS"],  # a deployment's card key (docs/security.md)
    }
    running: list[subprocess.Popen[bytes]] = []
    try:
        with SimulatorServer(SimulatorConfig(seed=24)) as sim:
            env["DURAPAY_GATEWAY__BASE_URL"] = sim.base_url
            env["DURAPAY_RECEIVER__PUBLIC_URL"] = f"{env['SHOP_DURAPAY_URL']}/notifications"
            commands = {"worker": ["worker", "--pool", "threads", "--loglevel", "warning"], "api": ["api", "--port", str(port)]}
            for name, args in commands.items():
                log = (tmp_path / f"{name}.log").open("wb")
                running.append(
                    subprocess.Popen([str(installed.durapay), *args], cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT)
                )
            wait_until(lambda: _answers(f"{env['SHOP_DURAPAY_URL']}/healthz"), 60, "the installed durapay api to listen")
            yield env
    finally:
        for process in running:
            process.terminate()
        for process in running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        valkey.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def run_in_project(installed: Installed, project: Path, env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(installed.python), "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_beside_a_project_with_its_own_config_and_tasks(installed: Installed, project: Path, stack: dict[str, str]) -> None:
    imports = run_in_project(
        installed, project, stack,
        "import config, tasks, durapay, durapay.config, durapay.tasks\n"
        "print(config.WHOSE, tasks.WHOSE, durapay.config.__file__, durapay.tasks.__file__, sorted(durapay.__all__))\n",
    )  # fmt: skip
    assert imports.stdout.startswith("the shop the shop ")
    assert str(installed.python.parents[1]) in imports.stdout.split()[4], "durapay.config from the installed wheel"
    assert str(ROOT) not in imports.stdout, "nothing from the checkout"

    example = run_in_project(installed, project, stack, readme_block("### From Python"))
    assert example.stdout.startswith("succeeded "), example.stdout + example.stderr

    # README's client example as written, but for the port of this test's API.
    client = readme_block("### From another service: the HTTP client")
    assert README_API in client
    answered = run_in_project(installed, project, stack, client.replace(README_API, stack["SHOP_DURAPAY_URL"]))
    lines = answered.stdout.splitlines()
    assert lines[0].startswith("succeeded "), answered.stdout + answered.stderr
    assert "409 conflict" in answered.stdout, "the cancel of an ended flow is an ApiError"
    assert any(line.startswith("flow.succeeded ") for line in lines), "the event feed read through the client"
