"""Shell completion (issue 27: 1.3 s per Tab, and no kinds, states or ids). A Tab runs ``durapay`` in a
process of its own, as bash does (``_DURAPAY_COMPLETE=complete_bash``); what that process imports is the
bound: completing a command loads its own module, never the engine, the API or Celery (the kinds come
from a cache of the registry once it is warm), and states, kinds and flow ids are offered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from durapay.service.cli import COMMAND_MODULES, module_commands
from durapay.service.runtime import Runtime
from tests.service.cli.test_flows_cmd import moto

ROOT = Path(__file__).resolve().parents[3]
#: What no Tab may load: the engine and what carries it, the API, Celery.
HEAVY = ("durapay.workflows.engine.api", "durapay.service.runtime", "durapay.service.app", "fastapi", "celery")
PROBE = f"""
import sys
from durapay.service.cli import main
try:
    main()
except SystemExit:
    pass
print("LOADED", *sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
"""


def tab(line: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """What bash is offered for ``line`` (the word under the cursor is its last), and what was loaded."""
    words = line.split(" ")
    values = {
        **(env if env is not None else dict(os.environ)),
        "_DURAPAY_COMPLETE": "complete_bash",
        "COMP_WORDS": line,
        "COMP_CWORD": str(len(words) - 1),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True, cwd=ROOT, env=values
    )
    loaded = next(text for text in done.stderr.splitlines() if text.startswith("LOADED")).split()[1:]
    return done.stdout.split(), loaded


def test_each_module_registers_the_commands_listed() -> None:
    for module, names in COMMAND_MODULES.items():
        assert tuple(module_commands(module)) == names, module


def test_commands_and_states_complete_without_the_engine(tmp_path: Path) -> None:
    offered, loaded = tab("durapay fl", tmp_path)
    assert (offered, loaded) == (["flows"], [])
    offered, loaded = tab("durapay flows ls --state fa", tmp_path)
    assert (offered, loaded) == (["failed"], [])
    offered, loaded = tab("durapay flows ", tmp_path)
    assert {"ls", "show", "retry", "cancel"} <= set(offered) and loaded == []


def test_kinds_complete_from_the_cache_once_warm(tmp_path: Path) -> None:
    offered, _ = tab("durapay start mo", tmp_path)  # the first Tab reads the registry and keeps its kinds
    assert offered == ["moto"]
    offered, loaded = tab("durapay flows ls --kind paybylink_r", tmp_path)
    assert (offered, loaded) == (["paybylink_renew"], [])


def test_flow_ids_complete_from_the_store(engine_side: Runtime, tmp_path: Path) -> None:
    started = [engine_side.engine.start("moto", moto(f"o-tab-{number}")).id for number in range(3)]
    offered, loaded = tab("durapay flows show ", tmp_path)
    assert set(started) <= set(offered) and len(offered) <= 50
    assert loaded == []
    offered, _ = tab(f"durapay flows retry {started[0][:12]}", tmp_path)
    assert offered == [started[0]]


def test_no_store_offers_nothing_and_says_nothing(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DURAPAY_")}
    env["DURAPAY_DATA_DIR"] = str(tmp_path / "nothing-here")
    offered, _ = tab("durapay flows cancel ", tmp_path, env)
    assert offered == []


def test_a_mistyped_command_still_gets_did_you_mean() -> None:
    """The root's commands load by name: its "did you mean" must still know every name."""
    from tests.service.cli.conftest import invoke

    result = invoke("flow", "--json")
    assert result.exit_code == 2
    assert "Did you mean 'flows'?" in result.stderr, result.stderr


def test_a_merchants_kinds_complete_with_durapays(tmp_path: Path) -> None:
    """Kinds of the modules DURAPAY_FLOWS__MODULES names get the CLI like a built-in one, completion too:
    the cache's stamp covers those modules' sources, so a kind added there is offered at the next Tab."""
    shop = ROOT / "examples" / "shop"
    env = {**os.environ, "DURAPAY_FLOWS__MODULES": "shop.flows", "PYTHONPATH": f"{shop}:{ROOT}"}
    offered, _ = tab("durapay start shop_", tmp_path, env)
    assert offered == ["shop_order"], offered
    offered, loaded = tab("durapay flows ls --kind shop_o", tmp_path, env)
    assert (offered, loaded) == (["shop_order"], []), "from the cache once warm"
    offered, _ = tab("durapay start shop_", tmp_path, {**env, "DURAPAY_FLOWS__MODULES": ""})
    assert offered == [], "another module setting, another stamp"


def test_completion_names_the_modules_setting_as_the_loader_does() -> None:
    from durapay.service.cli.completion import MODULES_SETTING
    from durapay.workflows.engine.modules import SETTING

    assert MODULES_SETTING == SETTING
