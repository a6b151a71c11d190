"""docker-compose.yml and the Dockerfile stay in step with the code (Docker itself cannot run here;
``.ci/run`` validates the compose file with ``docker-compose config -q``)."""

from __future__ import annotations

import re
from pathlib import Path

from durapay.config import load_settings
from durapay.service.app import create_app
from durapay.service.cli.config_cmd import effective
from durapay.service.runtime import Runtime
from durapay.workflows.engine.signals import accepted
from durapay.workflows.flows import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def test_every_durapay_variable_in_compose_is_a_setting() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    names = set(re.findall(r"\b(DURAPAY_[A-Z_]+)\s*:", compose))
    assert {"DURAPAY_REDIS_URL", "DURAPAY_API__KEY", "DURAPAY_GATEWAY__BASE_URL", "DURAPAY_RECEIVER__PUBLIC_URL"} <= names
    assert names <= set(effective(load_settings())), names - set(effective(load_settings()))


def test_compose_runs_every_process_type_with_health_checks_and_aof() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    services = re.findall(r"^  ([a-z]+):\n", compose.split("\nservices:\n", 1)[1], re.M)
    assert set(services) == {"valkey", "worker", "webhooks", "scheduler", "api", "simulator", "flower"}
    assert compose.count("healthcheck:") == len(services)
    assert "--appendonly" in compose and "--appendfsync" in compose
    for command in ('"worker"', '"scheduler"', '"api"', '"simulator"'):
        assert f"command: [{command}" in compose
    # Webhook deliveries run on workers of their own (issue 37): a slow endpoint never holds a step's thread.
    assert 'command: ["worker", "--webhooks"' in compose and '"alive", "webhooks"' in compose


def test_the_image_installs_every_package_and_runs_durapay() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("durapay", "config", "gateway", "tasks", "workflows", "service", "simulator"):
        assert f"COPY {package} {package}" in dockerfile
    assert 'ENTRYPOINT ["durapay"]' in dockerfile
    assert "USER durapay" in dockerfile


def test_the_api_reference_lists_every_route_of_the_app(runtime: Runtime) -> None:
    section = (ROOT / "docs" / "api.md").read_text()
    documented = {re.sub(r"\{[^}]*\}", "{}", path) for path in re.findall(r"`(?:[A-Z]+ )?(/[a-z0-9{}_/-]*)", section)}
    kinds = {f"/flows/{kind}" for kind in runtime.engine.registry}
    product_signals = {name for definition in REGISTRY.values() for name in accepted(definition)}
    for path in create_app(runtime).openapi()["paths"]:
        if path in kinds or ("/signals/" in path and path.rsplit("/", 1)[1] not in product_signals):
            continue  # each kind's start route; the test flow's own signals
        assert re.sub(r"\{[^}]*\}", "{}", path) in documented, f"{path} is not in docs/api.md"
