"""README stays true: the endpoint table is the catalogue's, and CI runs the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

from service.cli.endpoints import markdown_table

ROOT = Path(__file__).resolve().parents[1]


def test_endpoint_table_is_generated_from_the_catalogue() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- endpoints:start -->\n", 1)[1].split("\n<!-- endpoints:end -->", 1)[0]
    assert block == markdown_table(), "run `durapay endpoints --markdown` and paste it into README.md"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    test_command = commands[1].strip()
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()
