"""The console's test parts: a whole stack (Valkey, a Celery worker, a dispatcher, the simulator over
HTTP, the API server with the console) and, for the browser tests, the system's Chromium driven by
Selenium (Debian ``chromium`` + ``chromium-driver``; the tests are skipped, saying why, without them).

Screenshots go to ``artifacts/console/`` at the repository root (git-ignored), where CI collects them.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery.contrib.testing.worker import start_worker

from durapay.service.app import create_app
from durapay.service.runtime import Runtime, build_runtime
from durapay.service.server import ApiServer
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import Engine
from durapay.workflows.engine.dispatcher import Dispatcher
from tests.workflows.integration.conftest import stack_settings

OPERATOR_KEY = "console-operator-key-0123456789"
READ_KEY = "console-reader-key-0123456789"
ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts" / "console"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
#: The flags every browser test runs Chromium with: headless, nothing fetched in the background.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


@dataclass
class ConsoleStack:
    runtime: Runtime
    simulator: SimulatorServer
    server: ApiServer
    http: httpx.Client

    @property
    def engine(self) -> Engine:
        return self.runtime.engine

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def console_simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(seed=23)) as sim:
        yield sim


@pytest.fixture
def console_stack(redis_url: str, key_prefix: str, console_simulator: SimulatorServer) -> Iterator[ConsoleStack]:
    console_simulator.admin.clear_faults()
    settings = stack_settings(
        key_prefix,
        console_simulator.base_url,
        api={"key": OPERATOR_KEY, "keys": {READ_KEY: "read"}, "start_wait_seconds": 2.0},
        bulk={"rate": 5000},  # a bulk action of 1,000 flows in a second or so (test_ops_pages.py)
        terminals={"it": {"api_key": "console-key-of-it"}},  # a second terminal (test_gateway_banner.py)
    )
    runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(5))
    dispatcher = Dispatcher(runtime.engine, interval=0.05)
    with ExitStack() as stack:
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=2, perform_ping_check=False))
        dispatcher.start()
        stack.callback(dispatcher.stop)
        server = stack.enter_context(ApiServer(create_app(runtime)))
        http = stack.enter_context(httpx.Client(base_url=server.url, timeout=10.0, headers={"X-Api-Key": OPERATOR_KEY}))
        yield ConsoleStack(runtime, console_simulator, server, http)
    console_simulator.admin.clear_faults()
    runtime.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per module, with a fresh profile."""
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("Chromium is not installed: apt-get install -y chromium chromium-driver (as .ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="durapay-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: Any, name: str) -> Path:
    """Save the page as ``artifacts/console/<name>.png`` (the whole page's height)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
