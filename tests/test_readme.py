"""README and the reference stay true: the endpoint table (docs/gateway.md) is the catalogue's, CI runs the
README's test command, every setting is in the settings table (docs/configuration.md), README's and the
reference's Python examples use only the public API, and README stays the short door it is meant to be."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from durapay.service.cli.endpoints import markdown_table

ROOT = Path(__file__).resolve().parents[1]


def test_endpoint_table_is_generated_from_the_catalogue() -> None:
    text = (ROOT / "docs" / "gateway.md").read_text()
    block = text.split("<!-- endpoints:start -->\n", 1)[1].split("\n<!-- endpoints:end -->", 1)[0]
    assert block == markdown_table(), "run `durapay endpoints --markdown` and paste it into docs/gateway.md"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    test_command = commands[1].strip()  # README's second command runs the tests
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def documented_settings(readme: str) -> set[str]:
    """The variables the README's settings table names: a row's first cell, where ``__NAME`` after a full
    name is that name's group (``DURAPAY_RETRY__BASE_SECONDS``, ``__CAP_SECONDS``)."""
    found = set()
    for line in readme.split("# Configuration", 1)[1].splitlines():
        if not line.startswith("| `DURAPAY_"):
            continue
        group = ""
        for name in re.findall(r"`((?:DURAPAY_)?\w+)`", line.split(" | ", 1)[0]):
            if name.startswith("DURAPAY_"):
                group = name.rsplit("__", 1)[0] if "__" in name else ""
                found.add(name)
            elif name.startswith("__") and group:
                found.add(group + name)
    return found


def test_every_setting_is_in_the_readme() -> None:
    from pydantic import BaseModel

    from durapay.config.settings import ENV_NESTED_DELIMITER, ENV_PREFIX, Settings

    expected = set()
    for name, field in Settings.model_fields.items():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            expected |= {f"{ENV_PREFIX}{name.upper()}{ENV_NESTED_DELIMITER}{sub.upper()}" for sub in group.model_fields}
        else:
            expected.add(f"{ENV_PREFIX}{name.upper()}")
    assert expected - documented_settings((ROOT / "docs" / "configuration.md").read_text()) == set()


#: What README may import: the package's names and its two public subpackages (durapay/__init__.py).
PUBLIC = ("durapay", "durapay.flows", "durapay.gateway", "durapay.simulator")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)\n```", text, re.S)


def test_readme_examples_use_only_the_public_api() -> None:
    """Every ``python`` block of README and of docs/ imports durapay's names only from ``durapay`` (its
    ``__all__``) or the public subpackages (theirs), and uses ``durapay.<name>`` only for names in
    ``__all__``."""
    readme = python_blocks((ROOT / "README.md").read_text())
    assert len(readme) >= 2  # From Python, the HTTP client
    reference = [block for path in sorted((ROOT / "docs").glob("*.md")) for block in python_blocks(path.read_text())]
    assert len(reference) >= 5  # schedules, the gateway client, receivers...
    for block in readme + reference:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "durapay":
                assert node.module in PUBLIC, f"README imports from {node.module}: {ast.unparse(node)}"
                exported = importlib.import_module(node.module).__all__
                assert {alias.name for alias in node.names} <= set(exported), ast.unparse(node)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] != "durapay" or alias.name in PUBLIC, ast.unparse(node)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "durapay":
                assert node.attr in importlib.import_module("durapay").__all__, f"durapay.{node.attr} is not public"


def test_readme_is_the_door_not_the_reference() -> None:
    """Issue 27: README gets a newcomer from a clone to a running flow in a few hundred lines (quick
    start, ``durapay dev``, a first flow from curl and from Python, where to go next); the reference
    (commands, routes, settings, flows, guarantees, deployment, performance) lives in docs/."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400
    headings = re.findall(r"^#+ (.*)$", re.sub(r"```.*?```", "", readme, flags=re.S), re.M)
    for wanted in (
        "Quick start",
        "`durapay dev`: everything on your machine",
        "A first flow",
        "From curl",
        "From Python",
        "From another service: the HTTP client",
        "Where to go next",
    ):
        assert wanted in headings
    for moved in ("Performance", "Scaling out", "Guarantees", "Deployment with docker-compose", "Endpoints"):
        assert moved not in headings


def test_the_kinds_readme_names_are_the_registry() -> None:
    """README's "What a flow is" names every flow kind, and only those (the registry is the one list)."""
    from durapay.workflows.flows import REGISTRY

    readme = (ROOT / "README.md").read_text()
    sentence = readme.split("The kinds: ", 1)[1].split("; schedules", 1)[0]
    assert set(re.findall(r"`(\w+)`", sentence)) == set(REGISTRY)
