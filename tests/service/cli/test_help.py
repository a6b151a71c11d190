"""``durapay --help`` as a newcomer reads it (issue 41, finding 11): ``dev`` and ``demo`` first, no
``<bool>`` on plain flags, and ``--json`` taken before the command as well as after it."""

from __future__ import annotations

import json
import re

from durapay.service.runtime import Runtime
from tests.service.cli.conftest import invoke
from tests.service.cli.test_flows_cmd import TERMINAL


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # rich's bold and dim stay under NO_COLOR


def commands_listed(text: str) -> list[str]:
    """The command names of the help's Commands panel, in order."""
    panel = plain(text).split("Commands", 1)[1]
    return re.findall(r"^│ ([a-z]+)\s", panel, flags=re.M)


def test_help_lists_dev_and_demo_first_and_shows_no_bool_on_flags() -> None:
    shown = invoke("--help", env=TERMINAL)
    assert shown.exit_code == 0, shown.output
    assert commands_listed(shown.stdout)[:2] == ["dev", "demo"], shown.stdout
    for command in ((), ("flows", "ls"), ("schedules", "show"), ("dev",), ("webhooks", "add")):
        text = plain(invoke(*command, "--help", env=TERMINAL).stdout)
        assert "--json" in text or command == (), text
        assert "<bool>" not in text, text


def test_json_before_the_command_is_taken_as_after_it(engine_side: Runtime) -> None:
    before = invoke("--json", "flows", "ls", "--limit", "5")
    after = invoke("flows", "ls", "--limit", "5", "--json")
    assert before.exit_code == after.exit_code == 0, before.output
    assert json.loads(before.stdout) == json.loads(after.stdout)
    refused = invoke("--json", "flows", "ls", "--state", "faild")
    assert refused.exit_code == 2 and json.loads(refused.stderr)["field"] == "--state", refused.output
